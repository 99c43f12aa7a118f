//! Runs the real `haares-bench` binary.

use std::process::Command;

/// `(success, stdout, stderr)` of `haares-bench args…`.
pub fn bench(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_haares-bench"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The tiny model's sizes, at whatever depth a test names: blocks, batch rows, context.
#[allow(dead_code)]
pub const TINY_SIZES: [&str; 6] = ["--blocks", "2", "--batch", "2", "--seq", "16"];

/// The tiny model on NdArray, as `cost` and `paired` take it: backend, two layers and
/// [`TINY_SIZES`].
#[allow(dead_code)]
pub fn tiny_model() -> Vec<&'static str> {
    let mut args = vec!["--backend", "ndarray", "--layers", "2"];
    args.extend(TINY_SIZES);
    args
}

/// A cost run small enough for a test: the tiny model, three methods, two repeats.
#[allow(dead_code)]
pub fn tiny_cost() -> Vec<&'static str> {
    let mut args = vec!["cost"];
    args.extend(tiny_model());
    args.extend([
        "--family",
        "small",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--gemm-size",
        "64",
        "--methods",
        "standard,block-attnres,haares",
    ]);
    args
}

/// The order in which [`tiny_cost`]'s methods are measured: interleaved over two repeats, the second
/// reversed.
#[allow(dead_code)]
pub const TINY_ORDER: [&str; 6] = [
    "standard",
    "block-attnres",
    "haares",
    "haares",
    "block-attnres",
    "standard",
];

/// This crate's directory in the checkout under test: cargo's `CARGO_MANIFEST_DIR` when it runs the
/// test, else the one compiled in. A test binary is reused from a shared target directory by
/// another checkout of the same sources, and the compiled-in path would then read the first
/// checkout's files.
#[allow(dead_code)] // not every test file reads the checkout
pub fn crate_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
