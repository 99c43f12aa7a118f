//! Running one training run: the learner loop ([`learner`]), the training step for one device
//! and for many ([`step`], [`data_parallel`]), the loss ([`loss`]), AdamW ([`optim`], with
//! Flex's one-pass update beside its reference rule), the logs ([`metrics`]), checkpoints
//! ([`checkpoint`]), the run directory's lock ([`lock`]) and what a finished run leaves
//! ([`summary`]).

pub mod checkpoint;
pub mod data_parallel;
pub mod learner;
pub mod lock;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod step;
pub mod summary;
