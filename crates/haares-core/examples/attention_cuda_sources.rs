//! Writes the CUDA C++ of the fused attention's kernels, as CubeCL generates it, one file per
//! kernel and head width, with `kernels.tsv` listing them (name, head width, threads, file), for
//! `ptxas -v` on a machine without a GPU (`scripts/cuda-static/report.sh` runs it).
//!
//! `cargo run -p haares-core --features cuda,wgpu --example attention_cuda_sources -- OUT [HEAD_DIMS]`
//! with `HEAD_DIMS` a comma-separated list (default `16,32,64,128`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use haares_core::activation_ops::{CudaKernelSource, attention_cuda_sources};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: attention_cuda_sources OUT_DIR [HEAD_DIMS, e.g. 16,32,64,128]";
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
    std::fs::create_dir_all(&out)
        .map_err(|error| format!("cannot create {}: {error}", out.display()))?;
    let mut listing = String::from("name\thead_dim\tthreads\tfile\n");
    for head_dim in head_dims {
        for kernel in attention_cuda_sources(head_dim)? {
            let file = format!("{}_d{head_dim}.cu", kernel.name);
            write_atomically(&out.join(&file), &kernel.source)?;
            listing += &listing_line(&kernel, &file);
        }
    }
    write_atomically(&out.join("kernels.tsv"), &listing)
}

fn listing_line(kernel: &CudaKernelSource, file: &str) -> String {
    format!(
        "{}\t{}\t{}\t{file}\n",
        kernel.name, kernel.head_dim, kernel.threads
    )
}

/// `text` into `path` through a temporary file beside it, so that no half-written file remains.
fn write_atomically(path: &Path, text: &str) -> Result<(), String> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|error| format!("cannot write {}: {error}", path.display()))
}
