//! The GPU check's stage runner, run for real at the `tiny` profile on NdArray: every stage, the
//! summary after each, budgets that cut a stage short, bad arguments (the GPU-side scripts:
//! `scripts.rs`).
//!
//! It needs the `haares-bench` and `haares-train` binaries and the core's `portability` test
//! binary from the same build; `cargo test --workspace` (the README's test command) builds them
//! before any test runs.

use std::path::Path;

use crate::common::{bench_bin, check_binary, portability_bin, train_bin};
use serde_json::Value;

fn check(out: &Path, extra: &[&str]) -> (bool, String, String) {
    check_with(out, &portability_bin(), extra)
}

/// `gpu-check` at the tiny profile on NdArray with `portability` as the portability binary.
fn check_with(out: &Path, portability: &Path, extra: &[&str]) -> (bool, String, String) {
    let (train, bench) = (train_bin(), bench_bin());
    let mut args = vec![
        "--backend",
        "ndarray",
        "--profile",
        "tiny",
        "--out",
        out.to_str().unwrap(),
        "--train-bin",
        train.to_str().unwrap(),
        "--bench-bin",
        bench.to_str().unwrap(),
        "--portability-bin",
        portability.to_str().unwrap(),
    ];
    args.extend(extra);
    check_binary(&args)
}

fn summary(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn the_tiny_check_runs_every_stage_and_reports_each() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("check");
    let (ok, stdout, stderr) = check(&out, &[]);
    assert!(ok, "{stdout}\n{stderr}");
    // Progress is printed as it goes.
    assert!(
        stderr.contains("[gpu-check] stage 11/11 `placement` started"),
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
            "products",
            "cost-small",
            "cost-medium",
            "compile-small",
            "kernel-times",
            "first-step",
            "first-step-deep",
            "real-run",
            "placement",
        ]
    );
    // `products` measures CUDA's products: skipped on NdArray, with the reason, and not counted
    // as passed; every other stage passed.
    let skipped = stages[2].1["skipped"].as_str().unwrap_or_default();
    assert!(
        skipped.contains("CUDA's matrix products"),
        "{:?}",
        stages[2]
    );
    assert!(
        stages
            .iter()
            .filter(|(name, _)| *name != "products")
            .all(|(_, s)| *s == "passed"),
        "{stages:?}"
    );
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
    // Each test in its own process, with its own log.
    for test in portability["tests"].as_array().unwrap() {
        assert_eq!(test["result"], "passed", "{portability}");
        let name = test["name"].as_str().unwrap().replace("::", "-");
        let log = std::fs::read_to_string(out.join(format!("portability/{name}.log"))).unwrap();
        assert!(log.contains("1 passed"), "{log}");
    }

    // The cost stages: every method measured in two repeats (the tiny profile's), each stage
    // into its own files.
    for name in ["cost-small", "cost-medium", "compile-small"] {
        let run: Value = serde_json::from_str(
            &std::fs::read_to_string(out.join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(run["spec"]["repeats"], 2, "{name}: {run}");
        let samples = run["samples"][0][1].as_array().unwrap();
        assert_eq!(samples.len(), 4, "{name}: two methods, two repeats each");
    }

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

    // Placement: the same two runs one at a time, then side by side (two jobs on NdArray), each
    // timed after its first logged interval.
    let placement = stage("placement");
    for key in ["one_at_a_time", "side_by_side"] {
        let runs = placement[key].as_array().unwrap();
        assert_eq!(runs.len(), 2, "{key}: {placement}");
        for run in runs {
            assert!(run["step_s"].as_f64().unwrap() > 0.0, "{placement}");
        }
    }
    // The card's throughput from each run's steady step and the tiny profile's 4 × 32 tokens a
    // step: one at a time, a run's (the mean of the two); side by side, the two runs' sum.
    let rates = |key: &str| -> Vec<f64> {
        placement[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|run| 128.0 / run["step_s"].as_f64().unwrap())
            .collect()
    };
    let one = rates("one_at_a_time").iter().sum::<f64>() / 2.0;
    let two: f64 = rates("side_by_side").iter().sum();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    assert!(
        close(placement["tokens_per_s_one"].as_f64().unwrap(), one),
        "{placement}"
    );
    assert!(
        close(placement["tokens_per_s_two"].as_f64().unwrap(), two),
        "{placement}"
    );
    let gain = placement["two_over_one"].as_f64().unwrap();
    assert!(close(gain, two / one), "{placement}");
    assert!(
        markdown.contains(&format!("with two side by side ({gain:.2}×)")),
        "{markdown}"
    );
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
        (vec!["--budget", "cost-small"], "is not STAGE=SECONDS"),
        (
            vec!["--budget", "cost-small=soon"],
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
    let missing = ["--backend", "ndarray", "--out", out.to_str().unwrap()];
    let (ok, _, stderr) =
        check_binary(&[&missing[..], &["--train-bin", "/nonexistent/haares-train"]].concat());
    assert!(
        !ok && stderr.contains("`/nonexistent/haares-train` does not exist"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing ran");
}
