//! The GPU-side scripts (`scripts/gpu/run.sh`, `overlap.sh`) on a bundle laid out as `build.sh`
//! lays it out, from this build's binaries, running the GPU check's tiny `facts` stage on NdArray.
//!
//! Like `stages.rs`, this needs the `haares-bench`, `haares-train` and `portability` binaries of
//! the same build (`cargo test --workspace` builds them).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{bench_bin, packed_summary, portability_bin, train_bin};
use serde_json::Value;

fn gpu_script(name: &str) -> PathBuf {
    crate::common::crate_dir()
        .join("../../scripts/gpu")
        .join(name)
}

/// Runs `scripts/gpu/<name>` on `bundle`'s tiny `facts` stage on NdArray, into `out`; what it
/// printed, once it has succeeded.
fn run_script(name: &str, bundle: &Path, out: &Path, kernel_cache: &Path) -> String {
    let (ok, printed) = try_script(name, bundle, out, kernel_cache, &[]);
    assert!(ok, "{name}: {printed}");
    printed
}

/// [`run_script`] with more environment, whether or not it succeeds.
fn try_script(
    name: &str,
    bundle: &Path,
    out: &Path,
    kernel_cache: &Path,
    env: &[(&str, &str)],
) -> (bool, String) {
    let output = Command::new("bash")
        .arg(gpu_script(name))
        .arg(out)
        .args(["facts", "--profile", "tiny"])
        .env("HAARES_GPU_BUNDLE", bundle)
        .env("HAARES_GPU_BACKEND", "ndarray")
        .env("HAARES_KERNEL_CACHE", kernel_cache)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), printed)
}

fn gzip_into(file: &Path, packed: &Path) {
    let status = Command::new("gzip")
        .args(["-1", "-c"])
        .arg(file)
        .stdout(std::fs::File::create(packed).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
}

/// A bundle laid out as `build.sh` lays it out, from this build's binaries, in `dir/bundle`.
fn packed_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("bin")).unwrap();
    for (name, path) in [
        (
            "haares-gpu-check",
            PathBuf::from(env!("CARGO_BIN_EXE_haares-gpu-check")),
        ),
        ("haares-bench", bench_bin()),
        ("haares-train", train_bin()),
        ("portability", portability_bin()),
    ] {
        gzip_into(&path, &bundle.join("bin").join(format!("{name}.gz")));
    }
    let manifest = r#"{"commit": "0123456789abcdef", "dirty": false, "built": "today", "rustc": "rustc",
            "autotune": {"haares-bench": false, "haares-train": true, "haares-bench-tuned": true},
            "kernel_cache_seed": {"bytes": 123, "sha256": "5eed"}}"#;
    std::fs::write(bundle.join("manifest.json"), manifest).unwrap();
    bundle
}

/// `scripts/gpu/run.sh` unpacks a bundle laid out as `build.sh` lays it out and runs the check.
#[test]
fn the_gpu_side_script_runs_the_check_from_a_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = packed_bundle(dir.path());
    // A kernel cache handed back by an earlier run, as build.sh puts it into a bundle.
    let seed = dir.path().join("seed");
    std::fs::create_dir_all(seed.join("ptx")).unwrap();
    std::fs::write(seed.join("ptx/entry"), b"compiled before").unwrap();
    let status = Command::new("tar")
        .arg("-czf")
        .arg(bundle.join("kernel-cache.tar.gz"))
        .arg("-C")
        .arg(&seed)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
    let out = dir.path().join("out");
    let printed = run_script("run.sh", &bundle, &out, &dir.path().join("kernels"));
    assert!(
        printed.contains("bundle commit 0123456789abcdef"),
        "{printed}"
    );
    // The closing line points at the summary that is handed back, not the check's own folder.
    let handed_back_summary = format!("every stage passed; {}", out.join("summary.md").display());
    assert!(printed.contains(&handed_back_summary), "{printed}");
    assert!(printed.contains("running haares-bench\n"), "{printed}");
    // Where cuBLAS was found (or that it was not), and the provider the stages take.
    assert!(
        printed.contains("cuBLAS: no libcublas found") || printed.contains("products by cublas"),
        "{printed}"
    );
    let summary = packed_summary(&out);
    assert_eq!(summary["stages"][0]["status"], "passed");
    assert_eq!(summary["manifest"]["commit"], "0123456789abcdef");
    // The kernel cache the stages use is the one the environment names.
    let cache = dir.path().join("kernels");
    assert_eq!(
        summary["stages"][0]["results"]["kernel_cache"],
        cache.to_str().unwrap()
    );
    let markdown = std::fs::read_to_string(out.join("summary.md")).unwrap();
    let untuned = haares_train::backend::autotune_text(false);
    assert!(
        markdown.contains("Bundle built from commit `0123456789abcdef`")
            && markdown.contains("started from an earlier run's (123 bytes, sha256 `5eed`)")
            // The bench's build is the manifest's word (this fixture's says off) ...
            && markdown.contains(&format!("run with {untuned}"))
            // ... the trainer's is the manifest's word (this fixture's says on).
            && markdown.contains("`haares-train` was built with CubeCL autotuning on"),
        "{markdown}"
    );
    // The seed went into the cache before the stages ran ...
    assert_eq!(
        std::fs::read(cache.join("ptx/entry")).unwrap(),
        b"compiled before"
    );
    // ... and OUT holds only the few files a lent machine hands back (at most 8).
    let mut handed_back: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    handed_back.sort();
    assert_eq!(
        handed_back,
        ["kernel-cache.tar.gz.0", "results.tar.gz", "summary.md"]
    );
    let listing = |archive: &Path| {
        let output = Command::new("tar")
            .arg("-tzf")
            .arg(archive)
            .output()
            .unwrap();
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    };
    let results = listing(&out.join("results.tar.gz"));
    for name in [
        "./facts.log",
        "./manifest.json",
        "./summary.md",
        "./summary.json",
    ] {
        assert!(
            results.lines().any(|l| l == name),
            "{name} not in {results}"
        );
    }
    let kernels = listing(&out.join("kernel-cache.tar.gz.0"));
    assert!(kernels.lines().any(|l| l == "./ptx/entry"), "{kernels}");
}

/// `scripts/gpu/overlap.sh` runs the portability stage beside the others, each handing back its
/// own few files.
#[test]
fn the_overlapping_script_runs_portability_beside_the_stages() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = packed_bundle(dir.path());
    let out = dir.path().join("out");
    let printed = run_script("overlap.sh", &bundle, &out, &dir.path().join("kernels"));
    let handed_back = |folder: &str| std::fs::read_dir(out.join(folder)).unwrap().count();
    assert_eq!(
        (handed_back("portability"), handed_back("check")),
        (2, 2),
        "summary.md and results.tar.gz each, no kernel cache on NdArray"
    );
    let beside = packed_summary(&out.join("portability"));
    let main = packed_summary(&out.join("check"));
    let names = |summary: &Value| -> Vec<String> {
        summary["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| format!("{} {}", s["name"].as_str().unwrap(), s["status"]))
            .collect()
    };
    assert_eq!(names(&beside), ["portability \"passed\""], "{printed}");
    assert_eq!(names(&main), ["facts \"passed\""], "{printed}");
    let refused = Command::new("bash")
        .arg(gpu_script("overlap.sh"))
        .arg(dir.path().join("refused"))
        .arg("facts,portability")
        .env("HAARES_GPU_BUNDLE", &bundle)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

/// `HAARES_GPU_TUNED=1` runs the check with the bundle's `haares-bench-tuned`, and refuses a
/// bundle without one; the retired `HAARES_GPU_UNTUNED` is named in a note, not obeyed.
#[test]
fn the_tuned_bench_runs_the_check_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = packed_bundle(dir.path());
    let cache = dir.path().join("kernels");
    let tuned = [("HAARES_GPU_TUNED", "1")];
    let (ok, printed) = try_script("run.sh", &bundle, &dir.path().join("a"), &cache, &tuned);
    assert!(!ok, "{printed}");
    assert!(
        printed.contains("the bundle has no haares-bench-tuned"),
        "{printed}"
    );

    // A stand-in that says it ran, then runs this build's bench.
    let stand_in = dir.path().join("haares-bench-tuned");
    let script = format!(
        "#!/bin/sh\necho stand-in ran >&2\nexec '{}' \"$@\"\n",
        bench_bin().display()
    );
    std::fs::write(&stand_in, script).unwrap();
    gzip_into(&stand_in, &bundle.join("bin/haares-bench-tuned.gz"));
    let out = dir.path().join("b");
    let (ok, printed) = try_script("run.sh", &bundle, &out, &cache, &tuned);
    assert!(ok, "{printed}");
    assert!(
        printed.contains("running haares-bench-tuned") && printed.contains("stand-in ran"),
        "{printed}"
    );
    assert_eq!(packed_summary(&out)["stages"][0]["status"], "passed");

    let retired = [("HAARES_GPU_UNTUNED", "1")];
    let (ok, printed) = try_script("run.sh", &bundle, &dir.path().join("c"), &cache, &retired);
    assert!(ok, "{printed}");
    assert!(
        printed.contains("HAARES_GPU_UNTUNED is no longer read")
            && printed.contains("running haares-bench\n"),
        "{printed}"
    );
}
