//! # haares-bench
//!
//! Cost measurement and comparisons, one folder per purpose, in the order a user meets them:
//! 1. [`analytic`]: what the paper counts without running anything: intermediate-read sources
//!    (tab:sourcecounts), parameters (tab:modelconfig) and training FLOPs (tab:cost, counted by
//!    `haares_core::flops`); the `sources`, `params` and `flops` commands.
//! 2. [`cost`]: the paper's cost protocol (sec:costprotocol), [`cost::CostSpec`] and
//!    [`cost::run_cost`]: step time, throughput, peak memory, ratios between methods, model FLOP
//!    utilisation and launch counts, with the PyTorch peer beside it on request; the `cost`
//!    command.
//! 3. [`compare`]: comparisons with an interval: two methods alternated in one process
//!    ([`compare::paired`]), our step against PyTorch's ([`compare::versus`]), and every matrix
//!    product of a step by provider against `torch.matmul` ([`compare::products`]); the
//!    `paired`, `versus` and `products` commands.
//! 4. [`profile`]: where the time goes: a steady CPU step operation by operation beside PyTorch's
//!    profiler ([`profile::anatomy`]), a first step from backend start to update across depths
//!    ([`profile::first_step`]), a steady GPU step kernel by kernel ([`profile::kernel_times`]);
//!    the `anatomy` and `first-step` commands.
//!
//! Beneath them: [`measure`], one measurement in a worker process of its own and what it records;
//! [`peer`], the PyTorch peer (the same model in a Python process); [`report_files`], the reports'
//! atomic writes; [`backends`], a job run on the backend a `BackendKind` names; [`error`], the one
//! error type of them all, [`BenchError`]. The GPU check, which runs all of the
//! above on a GPU node in budgeted stages, is a tool of the repository of its own
//! (`crates/haares-gpu-check`).
#![warn(missing_docs)]

/// The backend a measurement runs on ([`cost::CostSpec::backend`]), re-exported so that a user of
/// this crate alone can name it.
pub use haares_train::backend::BackendKind;

pub mod error;
pub use error::{BenchError, Result};
pub mod method_choice;
pub use method_choice::MethodChoice;

pub mod analytic;
pub mod backends;
pub mod compare;
pub mod cost;
/// The analytic FLOP counts, `haares_core::flops` (beside the source and parameter counts); the
/// earlier path of this crate still resolves.
pub use haares_core::flops;
pub mod measure;
pub mod peer;
pub mod profile;
pub mod report_files;
