//! # haares-train
//!
//! The learner loop and the experiment runner of haares. `cargo run -p haares-train -- sweep
//! depth` runs the paper's depth study (tab:depthsweep) on the embedded corpus and writes its
//! report; every study of the paper is a TOML file under `experiments/` (see
//! `docs/experiments.md`).
//!
//! - [`learner::train`]: AdamW with the paper's decay groups, global clipping, validation grid and
//!   best-so-far endpoint (eq:endpoint), atomic checkpoints and exact resumption.
//! - [`study`]: studies, presets, overrides and sharding; [`sweep`] runs them.
//! - [`report`]: the paper's tables and figures from finished runs.
#![warn(missing_docs)]

pub mod backend;
pub mod config;
pub mod data;
pub mod error;
pub mod figures;
pub mod inference;
pub mod kernel_cache;
pub mod learner;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod overrides;
pub mod report;
pub mod run_checkpoint;
pub mod run_lock;
pub mod study;
pub mod sweep;
pub mod tables;

pub use config::{RunConfig, TokenizerKind};
pub use error::{Result, TrainError};
