//! `haares-bench`: cost measurement (memory, throughput, FLOPs) and comparisons.
//!
//! Skeleton: the `sources`, `params`, `flops` and `cost` commands arrive with the bench issue. The
//! CPU backend comparison lives in `examples/cpu_backends.rs`.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "haares-bench {}: no command is implemented yet; see `examples/cpu_backends.rs` for the CPU backend comparison.",
        env!("CARGO_PKG_VERSION")
    );
    ExitCode::from(2)
}
