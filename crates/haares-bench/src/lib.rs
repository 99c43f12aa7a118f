//! # haares-bench
//!
//! Cost measurement and comparisons: the analytic commands `sources` (tab:sourcecounts),
//! `params` (tab:modelconfig) and `flops` (tab:cost's FLOP increments), and the measured cost
//! protocol `cost` (sec:costprotocol), with [`heap`]'s allocated-bytes counter for the CPU
//! backends.
#![warn(missing_docs)]

pub mod analytic;
pub mod cost;
pub mod first_step;
pub mod flops;
pub mod gpu_check;
pub mod heap;
pub mod kernel_events;
