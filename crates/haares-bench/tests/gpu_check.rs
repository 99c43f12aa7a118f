//! The GPU check's stage runner, run for real at the `tiny` profile on NdArray: every stage, the
//! summary after each, budgets that cut a stage short, bad arguments, and the GPU-side script.
//!
//! It needs the `haares-train` binary and the core's `portability` test binary from the same
//! build; `cargo test --workspace` (the README's test command) builds both before any test runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::bench;
use serde_json::Value;

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_haares-bench"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn train_bin() -> PathBuf {
    let path = target_dir().join("haares-train");
    assert!(
        path.is_file(),
        "no `{}`: run `cargo test --workspace`, which builds it",
        path.display()
    );
    path
}

/// The most recently built `portability-<hash>` test executable.
fn portability_bin() -> PathBuf {
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

fn check(out: &Path, extra: &[&str]) -> (bool, String, String) {
    check_with(out, &portability_bin(), extra)
}

/// `gpu-check` at the tiny profile on NdArray with `portability` as the portability binary.
fn check_with(out: &Path, portability: &Path, extra: &[&str]) -> (bool, String, String) {
    let train = train_bin();
    let mut args = vec![
        "gpu-check",
        "--backend",
        "ndarray",
        "--profile",
        "tiny",
        "--out",
        out.to_str().unwrap(),
        "--train-bin",
        train.to_str().unwrap(),
        "--portability-bin",
        portability.to_str().unwrap(),
    ];
    args.extend(extra);
    bench(&args)
}

fn summary(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

/// `summary.json` from the `results.tar.gz` a script packed into `out`.
fn packed_summary(out: &Path) -> Value {
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

#[test]
fn the_tiny_check_runs_every_stage_and_reports_each() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("check");
    let (ok, stdout, stderr) = check(&out, &[]);
    assert!(ok, "{stdout}\n{stderr}");
    // Progress is printed as it goes.
    assert!(
        stderr.contains("[gpu-check] stage 6/6 `real-run` started"),
        "{stderr}"
    );

    let summary = summary(&out);
    let stages: Vec<(&str, &Value)> = summary["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), &s["status"]))
        .collect();
    let names: Vec<&str> = stages.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "facts",
            "portability",
            "first-step",
            "first-step-deep",
            "cost",
            "real-run"
        ]
    );
    assert!(stages.iter().all(|(_, s)| *s == "passed"), "{stages:?}");
    let markdown = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for name in names {
        assert!(markdown.contains(&format!("\n## {name}\n")), "{markdown}");
        assert!(out.join(format!("{name}.log")).is_file());
    }

    let stage = |name: &str| {
        summary["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap()["results"]
            .clone()
    };
    assert!(stage("facts")["gemm_gflops"].as_f64().unwrap() > 0.0);
    let portability = stage("portability");
    assert!(portability["passed"].as_u64().unwrap() >= 1 && portability["failed"] == 0);

    // The first-step anatomy of both depths, every phase timed; no kernels on a CPU backend.
    for layers in [2, 4] {
        let path = out.join(format!("first-step-{layers}.json"));
        let run: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let samples = run["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 2, "standard and haares");
        for sample in samples {
            assert_eq!(sample[0], layers);
            let anatomy = &sample[1]["anatomy"];
            assert!(anatomy["backend_start_s"].as_f64().unwrap() > 0.0);
            assert!(anatomy["model_init_s"].as_f64().unwrap() > 0.0);
            let phases = anatomy["phase_s"].as_array().unwrap();
            assert_eq!(phases.len(), 3, "three steps");
            assert!(
                phases
                    .iter()
                    .flat_map(|p| p.as_array().unwrap())
                    .all(|s| s.as_f64().unwrap() > 0.0)
            );
            assert!(anatomy["kernels"].is_null());
        }
    }
    assert!(markdown.contains("no kernel counts: this backend runs no CubeCL kernels"));
    assert!(
        markdown.contains("| Small | 128 | HAARES (fused) |"),
        "{markdown}"
    );

    // The real run: killed at its first checkpoint, resumed, equal to the uninterrupted run.
    let real = stage("real-run");
    assert_eq!(
        real["killed_at_step"], 80,
        "the tiny profile checkpoints every 80 steps"
    );
    assert_eq!(real["resume_matches"], true);
    assert!(real["compared_values"].as_u64().unwrap() >= 4);
    assert_eq!(real["loss_falls"], true);
    assert!(
        real["eval"]
            .as_str()
            .unwrap()
            .starts_with("validation loss")
    );
    assert!(!real["sample"].as_str().unwrap().is_empty());
}

#[test]
fn a_stage_over_its_budget_is_killed_with_its_processes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("check");
    // A real run far longer than its budget, so that the kill, not the run's end, stops it.
    let (ok, _, stderr) = check(
        &out,
        &[
            "--stages",
            "facts,real-run",
            "--budget",
            "real-run=3",
            "--real-run-steps",
            "100000",
        ],
    );
    assert!(!ok, "a timed-out stage fails the check");
    assert!(stderr.contains("a stage did not pass"), "{stderr}");
    let summary = summary(&out);
    let stages = summary["stages"].as_array().unwrap();
    assert_eq!(stages[0]["status"], "passed");
    assert_eq!(stages[1]["status"], "timed_out");
    // Cut at its deadline, not left to finish …
    assert!(stages[1]["seconds"].as_f64().unwrap() < 5.0, "{stages:?}");
    let markdown = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(markdown.contains("| real-run | TIMED OUT"), "{markdown}");
    // … and its training process is gone: nothing more is written.
    let metrics = out.join("real-run/uninterrupted/metrics.jsonl");
    let size = || std::fs::metadata(&metrics).map_or(0, |m| m.len());
    let before = size();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(size(), before, "the killed run still writes");
    assert!(!out.join("real-run/uninterrupted/summary.json").exists());
}

#[test]
fn a_failed_stage_does_not_stop_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("check");
    // Not a test binary: it rejects the test harness's arguments.
    let not_a_test = train_bin();
    let (ok, _, _) = check_with(&out, &not_a_test, &["--stages", "portability,first-step"]);
    assert!(!ok);
    let summary = summary(&out);
    let stages = summary["stages"].as_array().unwrap();
    let failed = stages[0]["status"]["failed"].as_str().unwrap();
    assert!(failed.contains("exited with"), "{failed}");
    assert_eq!(stages[1]["status"], "passed");
}

#[test]
fn bad_arguments_are_refused_before_any_stage() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("check");
    for (extra, expected) in [
        (
            vec!["--stages", "facts,warp-drive"],
            "unknown stage `warp-drive`",
        ),
        (vec!["--budget", "cost"], "is not STAGE=SECONDS"),
        (
            vec!["--budget", "cost=soon"],
            "is not a whole number of seconds",
        ),
        (
            vec!["--real-run-steps", "80"],
            "must exceed the real run's checkpoint interval 80",
        ),
    ] {
        let (ok, _, stderr) = check(&out, &extra);
        assert!(!ok && stderr.contains(expected), "{extra:?}: {stderr}");
        assert!(!out.join("summary.json").exists(), "nothing ran");
    }
    let missing = [
        "gpu-check",
        "--backend",
        "ndarray",
        "--out",
        out.to_str().unwrap(),
    ];
    let (ok, _, stderr) =
        bench(&[&missing[..], &["--train-bin", "/nonexistent/haares-train"]].concat());
    assert!(
        !ok && stderr.contains("`/nonexistent/haares-train` does not exist"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing ran");
}

fn gpu_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/gpu")
        .join(name)
}

/// Runs `scripts/gpu/<name>` on `bundle`'s tiny `facts` stage on NdArray, into `out`; what it
/// printed, once it has succeeded.
fn run_script(name: &str, bundle: &Path, out: &Path, kernel_cache: &Path) -> String {
    let output = Command::new("bash")
        .arg(gpu_script(name))
        .arg(out)
        .args(["facts", "--profile", "tiny"])
        .env("HAARES_GPU_BUNDLE", bundle)
        .env("HAARES_GPU_BACKEND", "ndarray")
        .env("HAARES_KERNEL_CACHE", kernel_cache)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name}: {printed}");
    printed
}

/// A bundle laid out as `build.sh` lays it out, from this build's binaries, in `dir/bundle`.
fn packed_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("bin")).unwrap();
    for (name, path) in [
        (
            "haares-bench",
            PathBuf::from(env!("CARGO_BIN_EXE_haares-bench")),
        ),
        ("haares-train", train_bin()),
        ("portability", portability_bin()),
    ] {
        let packed = std::fs::File::create(bundle.join("bin").join(format!("{name}.gz"))).unwrap();
        let status = Command::new("gzip")
            .args(["-1", "-c"])
            .arg(&path)
            .stdout(packed)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let manifest = r#"{"commit": "0123456789abcdef", "dirty": false, "built": "today", "rustc": "rustc",
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
    assert!(
        markdown.contains("Bundle built from commit `0123456789abcdef`")
            && markdown.contains("started from an earlier run's (123 bytes, sha256 `5eed`)"),
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
