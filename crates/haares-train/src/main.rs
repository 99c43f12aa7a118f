//! `haares-train`: the learner loop and the experiment runner.
//!
//! Skeleton: the learner loop, `sweep`, `report`, `train`, `eval` and `sample` arrive with the
//! learner issue. Until then every command says so and exits with status 2.

use std::process::ExitCode;

fn main() -> ExitCode {
    let command: Vec<String> = std::env::args().skip(1).collect();
    eprintln!(
        "haares-train {}: `{}` is not implemented yet; the learner loop and the sweep runner are tracked by the learner issue. \
         The model library (haares-core) is ready to use.",
        env!("CARGO_PKG_VERSION"),
        command.join(" ")
    );
    ExitCode::from(2)
}
