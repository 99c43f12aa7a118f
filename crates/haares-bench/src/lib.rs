//! # haares-bench
//!
//! Cost measurement and comparisons. Implemented so far: the analytic commands `sources`
//! (tab:sourcecounts) and `params` (tab:modelconfig); the FLOP and cost-protocol commands are
//! tracked by the bench issue.
#![warn(missing_docs)]

pub mod analytic;
