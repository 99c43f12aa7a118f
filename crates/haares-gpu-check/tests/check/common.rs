//! Helpers of the GPU check's tests: the binaries of the same build (the check's own, and the
//! `haares-bench`, `haares-train` and `portability` binaries it runs, which `cargo test
//! --workspace` builds before any test runs), running the check, and the summary a script packs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// `(success, stdout, stderr)` of `haares-gpu-check args…`.
pub fn check_binary(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_haares-gpu-check"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

pub fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_haares-gpu-check"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A binary of another crate of the workspace, from the same build.
fn workspace_bin(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.is_file(),
        "no `{}`: run `cargo test --workspace`, which builds it",
        path.display()
    );
    path
}

pub fn train_bin() -> PathBuf {
    workspace_bin("haares-train")
}

pub fn bench_bin() -> PathBuf {
    workspace_bin("haares-bench")
}

/// This crate's directory in the checkout under test: cargo's `CARGO_MANIFEST_DIR` when it runs
/// the test, else the one compiled in (a test binary reused by another checkout would otherwise
/// read the first checkout's files).
pub fn crate_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The most recently built `portability-<hash>` test executable.
pub fn portability_bin() -> PathBuf {
    let deps = target_dir().join("deps");
    std::fs::read_dir(&deps)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("portability-") && p.extension().is_none()
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| {
            panic!(
                "no portability test in `{}`: run `cargo test --workspace`, which builds it",
                deps.display()
            )
        })
}

/// `summary.json` from the `results.tar.gz` a script packed into `out`.
pub fn packed_summary(out: &Path) -> Value {
    let output = Command::new("tar")
        .arg("-xzOf")
        .arg(out.join("results.tar.gz"))
        .arg("./summary.json")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "no summary.json in {}",
        out.display()
    );
    serde_json::from_slice(&output.stdout).unwrap()
}
