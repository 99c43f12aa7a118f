//! The static CUDA report (`scripts/cuda-static/report.sh`) covers every kernel the project
//! launches: each `#[cube(launch)]` kernel of the core and the trainer has a source entry in one
//! of the `*sources.rs` modules that `kernel_cuda_sources` collects, so that a kernel added later
//! is compiled for CUDA before a GPU runs it.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// The names of the functions marked `#[cube(launch)]` in `text` (the attribute, maybe other
/// attributes, then the function).
fn launched_kernels(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut marked = false;
    for line in text.lines().map(str::trim) {
        if line == "#[cube(launch)]" {
            marked = true;
        } else if marked && !line.starts_with("#[") {
            let after_fn = line.split_once("fn ").map(|(_, rest)| rest);
            let name = after_fn.and_then(|rest| rest.split(['<', '(']).next());
            names.push(name.unwrap_or_else(|| panic!("no function after #[cube(launch)]: {line}")));
            marked = false;
        }
    }
    names.into_iter().map(str::to_string).collect()
}

/// Whether `text` names the generated module of kernel `name` (`name::`), not merely a longer
/// name that ends in it (`add_kernel::` inside `scaled_add_kernel::`).
fn names_module(text: &str, name: &str) -> bool {
    let path = format!("{name}::");
    text.match_indices(&path).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn every_launched_kernel_is_in_the_static_cuda_report() {
    let crates = crate::common::crate_dir().join("..");
    let files: Vec<PathBuf> = ["haares-core/src", "haares-train/src"]
        .iter()
        .flat_map(|dir| rust_files(&crates.join(dir)))
        .collect();
    let read = |path: &PathBuf| std::fs::read_to_string(path).expect("a source file");
    let listed: String = files
        .iter()
        .filter(|path| path.to_string_lossy().ends_with("sources.rs"))
        .map(read)
        .collect();
    let kernels: Vec<String> = files
        .iter()
        .flat_map(|path| launched_kernels(&read(path)))
        .collect();
    assert!(kernels.len() >= 20, "too few kernels found: {kernels:?}");
    let missing: Vec<&String> = kernels
        .iter()
        .filter(|name| !names_module(&listed, name))
        .collect();
    assert!(
        missing.is_empty(),
        "kernels without a CUDA source entry: {missing:?}; add each to its operation's sources.rs (or the trainer's cube_sources.rs)"
    );
}

#[test]
fn a_longer_kernel_name_does_not_list_a_shorter_one() {
    assert!(names_module("add_kernel::AddKernel", "add_kernel"));
    assert!(names_module("use k::{add_kernel::AddKernel}", "add_kernel"));
    assert!(!names_module(
        "scaled_add_kernel::ScaledAddKernel",
        "add_kernel"
    ));
}
