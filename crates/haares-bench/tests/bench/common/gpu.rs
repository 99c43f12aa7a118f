//! Helpers of the GPU check's tests (`gpu_check.rs`, `gpu_scripts.rs`): the binaries of the same
//! build and the summary a script packs.
#![allow(dead_code)] // every test crate includes `common`; only the GPU check's use these

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_haares-bench"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn train_bin() -> PathBuf {
    let path = target_dir().join("haares-train");
    assert!(
        path.is_file(),
        "no `{}`: run `cargo test --workspace`, which builds it",
        path.display()
    );
    path
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
