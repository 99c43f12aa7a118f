//! # haares-train
//!
//! The learner loop and the experiment runner of haares. `cargo run -p haares-train -- sweep
//! depth` runs the paper's depth study (tab:depthsweep) on the embedded corpus and writes its
//! report; every study of the paper is a TOML file under `experiments/` (see
//! `docs/experiments.md`).
//!
//! `haares-train` is first a command line; as a library, in the order a user meets it:
//! 1. [`RunConfig`]: one run's settings (model, data, optimizer, schedule); a study's
//!    [`Study::plan`](study::Study::plan) ([`study::load_study`]) expands its grid and presets
//!    into runs.
//! 2. [`data::prepare`]: the run's tokenizer and prepared splits (`haares-data`).
//! 3. [`learner::train`]: AdamW with the paper's decay groups ([`optim`]), global clipping,
//!    validation grid and best-so-far endpoint (eq:endpoint), atomic checkpoints
//!    ([`run_checkpoint`]) and exact resumption, one writer per run directory ([`run_lock`]).
//! 4. [`backend::dispatch`] runs a job (a run, a [`sweep`]) on the backend chosen at run time,
//!    with CubeCL's kernel caches shared on the GPU backends ([`kernel_cache`]).
//! 5. [`report::write_report`]: the paper's tables and figures from finished runs, the routing
//!    figures among them ([`routing_figures`], from each run's `routing.jsonl`);
//!    [`inference`] evaluates and samples trained models, [`inspect`] shows their routers.
#![warn(missing_docs)]

pub mod backend;
pub mod config;
#[cfg(any(feature = "flex", feature = "ndarray"))]
pub mod cpu;
pub mod data;
pub mod error;
pub mod figures;
pub mod heatmap;
pub mod inference;
pub mod inspect;
pub mod kernel_cache;
pub mod learner;
pub mod loss;
pub mod metrics;
pub mod optim;
#[cfg(feature = "flex")]
mod optim_flex;
pub mod overrides;
pub mod parallel;
pub mod plot;
pub mod replicas;
pub mod report;
pub mod results;
pub mod routing_figures;
pub mod run_checkpoint;
pub mod run_lock;
pub mod study;
pub mod sweep;
pub mod tables;

pub use config::{RunConfig, TokenizerKind};
pub use error::{Result, TrainError};
