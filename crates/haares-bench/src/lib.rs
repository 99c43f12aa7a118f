//! # haares-bench
//!
//! Cost measurement and comparisons, in the order a user meets them:
//! 1. The analytic quantities: [`analytic`] (tab:sourcecounts, tab:modelconfig's parameter
//!    counts) and [`flops`] (tab:cost's FLOP increments), the `sources`, `params` and `flops`
//!    commands.
//! 2. The measured cost protocol (sec:costprotocol): [`cost::CostSpec`] and [`cost::run_cost`],
//!    one worker process per measurement ([`cost::worker`]), summarised by [`cost::report`];
//!    [`heap`] counts a CPU worker's allocated bytes.
//! 3. Where a first step's time goes: [`cost::anatomy`] in every worker, [`first_step`] across
//!    depths, with CubeCL's compilations and kernel launches counted by [`kernel_events`]
//!    ([`cost::launches`] in the cost report).
//! 4. Where a steady CPU step's time goes, operation by operation, beside PyTorch's profiler:
//!    [`step_anatomy`] (the `anatomy` command).
//! 5. [`gpu_check`]: all of the above, in budgeted stages, for a lent GPU machine.
#![warn(missing_docs)]

pub mod analytic;
pub mod backends;
pub mod cost;
pub mod first_step;
pub mod flops;
pub mod gpu_check;
pub mod heap;
pub mod heartbeat;
pub mod kernel_events;
pub mod kernel_times;
pub mod products;
pub mod step_anatomy;
pub mod step_anatomy_report;
