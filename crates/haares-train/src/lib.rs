//! # haares-train
//!
//! The learner loop and the experiment runner of haares. `cargo run -p haares-train -- sweep
//! depth` runs the paper's depth study (tab:depthsweep) on the embedded corpus and writes its
//! report; every study of the paper is a TOML file under `experiments/` (see
//! `docs/experiments.md`).
//!
//! The crate is three concerns on one floor of shared pieces ([`config`], [`data`], [`error`],
//! [`backend`]):
//! - [`run`]: one training run. [`run::learner::train`] is the learner loop: AdamW with the
//!   paper's decay groups ([`run::optim`]), global clipping, the validation grid and best-so-far
//!   endpoint (eq:endpoint), atomic checkpoints ([`run::checkpoint`]) and exact resumption, one
//!   writer per run directory ([`run::lock`]). Its training step ([`run::step`]) serves one
//!   device and many ([`run::data_parallel`]).
//! - [`study`]: the paper's studies as data. [`Study::plan`](study::Study::plan)
//!   ([`study::load_study`]) expands a study's grid and presets into runs; [`study::sweep`]
//!   trains them, skipping finished runs and resuming unfinished ones.
//! - [`report`]: [`report::write_report`] writes the paper's tables and figures from finished
//!   runs, the routing figures among them ([`report::routing_figures`], from each run's
//!   `routing.jsonl`).
//!
//! [`backend::dispatch`] runs a job (a run, a sweep) on the backend chosen at run time, with
//! CubeCL's kernel caches shared on the GPU backends ([`kernel_cache`]); [`inference`] evaluates
//! and samples trained models, [`inspect`] shows their routers. docs/architecture.md follows
//! `sweep depth` through these modules.
#![warn(missing_docs)]

pub mod backend;
pub mod config;
#[cfg(any(feature = "flex", feature = "ndarray"))]
pub mod cpu;
pub mod data;
pub mod error;
pub mod inference;
pub mod inspect;
pub mod kernel_cache;
pub mod report;
pub mod run;
pub mod study;

pub use config::{RunConfig, TokenizerKind};
pub use error::{Result, TrainError};
