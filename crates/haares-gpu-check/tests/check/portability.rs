//! The GPU check's `portability` stage against a stand-in for the test harness: a script that
//! lists four tests and, run with `--exact NAME`, passes, fails with a message, never ends or
//! waits for another test's process. The real harness's output (`stages.rs`, NdArray) and the
//! core's suite on CUDA (docs/benchmarks.md) are checked elsewhere.

use std::path::Path;

use crate::common::{bench_bin, train_bin};
use serde_json::Value;

/// A harness that answers `--list --format terse FILTER` and `--exact NAME --test-threads 1` as
/// libtest does, and writes each test's working directory and cache home to `$FAKE_DIR/ran`.
const HARNESS: &str = r#"#!/bin/sh
if [ "$1" = "--list" ]; then
    for t in $FAKE_TESTS; do echo "$t: test"; done
    echo "a_benchmark: bench"
    exit 0
fi
name="$2"
echo "$name $PWD $XDG_CACHE_HOME" >> "$FAKE_DIR/ran"
echo
echo "running 1 test"
case "$name" in
    *passes)
        echo "test $name ... ok"; echo; echo "test result: ok. 1 passed; 0 failed"; exit 0 ;;
    *fails)
        echo "test $name ... FAILED"; echo; echo "failures:"; echo
        echo "---- $name stdout ----"; echo
        echo "thread '$name' panicked at tests/core/rotary_checks.rs:10:5:"
        echo "rotary vs plain: max difference 7.29e-4 at scale 5.64"
        echo "note: run with \`RUST_BACKTRACE=1\` environment variable to display a backtrace"
        echo; echo; echo "failures:"; echo "    $name"; echo
        echo "test result: FAILED. 0 passed; 1 failed"; exit 101 ;;
    *hangs) sleep 60 ;;
    *meets_*)
        # Passes only while its partner's process runs too: each waits for the other's mark.
        touch "$FAKE_DIR/$name"
        for i in $(seq 100); do
            if [ "$(ls "$FAKE_DIR" | grep -c meets_)" = 2 ]; then
                echo "test $name ... ok"; echo "test result: ok. 1 passed; 0 failed"; exit 0
            fi
            sleep 0.1
        done
        echo "---- $name stdout ----"; echo "its partner never ran"; echo "failures:"; exit 101 ;;
esac
"#;

/// The check's `portability` stage on NdArray with the stand-in harness listing `tests`.
fn portability(dir: &Path, tests: &str, extra: &[&str]) -> (bool, Value, String) {
    let harness = dir.join("harness");
    std::fs::write(&harness, HARNESS).unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&harness)
        .status()
        .unwrap();
    let fake = dir.join("fake");
    std::fs::create_dir_all(&fake).unwrap();
    let out = dir.join("check");
    let (train, bench) = (train_bin(), bench_bin());
    let mut args = vec![
        "--backend",
        "ndarray",
        "--profile",
        "tiny",
        "--stages",
        "portability",
        "--out",
        out.to_str().unwrap(),
        "--train-bin",
        train.to_str().unwrap(),
        "--bench-bin",
        bench.to_str().unwrap(),
        "--portability-bin",
        harness.to_str().unwrap(),
    ];
    args.extend(extra);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_haares-gpu-check"))
        .args(&args)
        .env("FAKE_DIR", &fake)
        .env("FAKE_TESTS", tests)
        .output()
        .unwrap();
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let markdown = std::fs::read_to_string(out.join("summary.md")).unwrap();
    (
        output.status.success(),
        summary["stages"][0].clone(),
        markdown,
    )
}

#[test]
fn each_test_ends_on_its_own_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let tests = "t::a_passes t::b_fails t::c_hangs t::d_passes";
    let (ok, stage, markdown) = portability(
        dir.path(),
        tests,
        &["--portability-jobs", "1", "--budget", "portability=4"],
    );
    assert!(!ok);
    let results = &stage["results"];
    let ends: Vec<(&str, &str)> = (results["tests"].as_array().unwrap().iter())
        .map(|t| (t["name"].as_str().unwrap(), t["result"].as_str().unwrap()))
        .collect();
    // One at a time: the hanging test holds the only process until the deadline, so the test
    // after it never starts; the bench's `a_benchmark` is not a test.
    assert_eq!(
        ends,
        [
            ("t::a_passes", "passed"),
            ("t::b_fails", "failed"),
            ("t::c_hangs", "timed out"),
            ("t::d_passes", "not started")
        ]
    );
    let failed = stage["status"]["failed"].as_str().unwrap();
    assert!(
        failed.contains("1 of 4 tests failed: t::b_fails"),
        "{failed}"
    );
    // The failure's message is in the summary, without the harness's backtrace hint.
    assert!(
        markdown.contains("rotary vs plain: max difference 7.29e-4 at scale 5.64"),
        "{markdown}"
    );
    assert!(!markdown.contains("RUST_BACKTRACE"), "{markdown}");
    assert!(
        markdown.contains("| `t::c_hangs` | timed out |"),
        "{markdown}"
    );
    // Each test has its own log.
    let log = dir.path().join("check/portability/t-a_passes.log");
    assert!(std::fs::read_to_string(log).unwrap().contains("1 passed"));
}

#[test]
fn tests_run_side_by_side_each_in_its_own_folder() {
    let dir = tempfile::tempdir().unwrap();
    // Either test passes only if the other's process runs at the same time.
    let (ok, stage, _) = portability(
        dir.path(),
        "t::meets_left t::meets_right t::z_passes",
        &["--portability-jobs", "2"],
    );
    assert!(ok, "{stage}");
    assert_eq!(stage["results"]["passed"], 3);
    assert_eq!(stage["results"]["jobs"], 2);
    let ran = std::fs::read_to_string(dir.path().join("fake/ran")).unwrap();
    let folders: Vec<(&str, &str)> = ran
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace().skip(1);
            (words.next().unwrap(), words.next().unwrap())
        })
        .collect();
    assert_eq!(folders.len(), 3);
    for (index, (cwd, cache)) in folders.iter().enumerate() {
        // CubeCL's caches follow the working directory and the cache home: neither is shared.
        assert_eq!(cwd, cache, "{ran}");
        assert!(
            folders[index + 1..].iter().all(|(other, _)| other != cwd),
            "{ran}"
        );
    }
}
