//! Writes the CUDA C++ of every kernel the project launches, as CubeCL generates it, one file per
//! kernel variant, with `kernels.tsv` listing them (name, variant, threads, file), for NVRTC and
//! `ptxas -v` on a machine without a GPU (`scripts/cuda-static/report.sh` runs it).
//!
//! `cargo run -p haares-train --features cuda,wgpu --example kernel_cuda_sources -- OUT
//! [HEAD_DIMS]` with `HEAD_DIMS` the fused attention's head widths, comma-separated (default
//! `16,32,64,128`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use haares_base::write_atomically;
use haares_core::cuda_sources::CudaSources;
use haares_core::ops::core_kernel_sources;
use haares_train::run::optim::optimizer_cuda_sources;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: kernel_cuda_sources OUT_DIR [HEAD_DIMS, e.g. 16,32,64,128]";
    let out = PathBuf::from(args.next().ok_or(usage)?);
    let head_dims = args.next().unwrap_or_else(|| "16,32,64,128".to_string());
    let head_dims = head_dims
        .split(',')
        .map(|width| {
            width.trim().parse::<usize>().map_err(|_| {
                format!("head width {width:?} in {head_dims:?} is not a whole number; {usage}")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut sources = CudaSources::new()?;
    core_kernel_sources(&mut sources, &head_dims)?;
    optimizer_cuda_sources(&mut sources)?;
    std::fs::create_dir_all(&out)
        .map_err(|error| format!("cannot create {}: {error}", out.display()))?;
    let mut listing = String::from("name\tvariant\tthreads\tfile\n");
    for (index, kernel) in sources.into_kernels().into_iter().enumerate() {
        let file = format!("{index:03}_{}.cu", kernel.name);
        write(&out.join(&file), &kernel.source)?;
        let variant = kernel.variant.replace(['\t', '\n'], " ");
        listing += &format!("{}\t{variant}\t{}\t{file}\n", kernel.name, kernel.threads);
    }
    Ok(write(&out.join("kernels.tsv"), &listing)?)
}

/// `text` into `path`, atomically (no half-written file remains).
fn write(path: &Path, text: &str) -> Result<(), String> {
    write_atomically(path, text.as_bytes())
        .map_err(|error| format!("cannot write {}: {error}", path.display()))
}
