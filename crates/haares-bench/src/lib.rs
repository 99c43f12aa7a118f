//! # haares-bench
//!
//! Cost measurement and comparisons, in the order a user meets them:
//! 1. The analytic quantities: [`analytic`] (tab:sourcecounts, tab:modelconfig's parameter
//!    counts) and [`flops_table`] (tab:cost's FLOP increments, counted by `haares_core::flops`),
//!    the `sources`, `params` and `flops` commands.
//! 2. The measured cost protocol (sec:costprotocol): [`cost::CostSpec`] and [`cost::run_cost`],
//!    one worker process per measurement ([`cost::worker`]), summarised by [`cost::report`];
//!    [`heap`] counts a CPU worker's allocated bytes.
//! 3. Where a first step's time goes: [`cost::anatomy`] in every worker, [`first_step`] across
//!    depths, with CubeCL's compilations and kernel launches counted by [`kernel_events`]
//!    ([`cost::launches`] in the cost report).
//! 4. Where a steady CPU step's time goes, operation by operation, beside PyTorch's profiler:
//!    [`step_anatomy`] (the `anatomy` command).
//! 5. [`products`]: every matrix product of a training step on CUDA, by each provider and
//!    against `torch.matmul` (the `products` command).
//! 6. [`gpu_check`]: all of the above, in budgeted stages, for a GPU machine without Rust.
#![warn(missing_docs)]

pub mod analytic;
pub mod backends;
pub mod cost;
pub mod first_step;
/// The analytic FLOP counts, `haares_core::flops` (beside the source and parameter counts); the
/// earlier path of this crate still resolves.
pub use haares_core::flops;
pub mod flops_table;
pub mod gpu_check;
pub mod heap;
pub mod heartbeat;
pub mod kernel_events;
pub mod kernel_times;
pub mod products;
pub mod step_anatomy;
pub mod step_anatomy_report;
