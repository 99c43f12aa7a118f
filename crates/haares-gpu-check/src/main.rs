//! `haares-gpu-check`: runs the GPU check's stages (the library's `run_check`) and exits 0 only
//! when every stage passed or could not run on the backend.

use std::process::ExitCode;

use clap::Parser;
use haares_gpu_check::cli::{GpuCheckArgs, gpu_check};

fn main() -> ExitCode {
    match gpu_check(GpuCheckArgs::parse()) {
        Ok(message) => {
            print!("{message}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
