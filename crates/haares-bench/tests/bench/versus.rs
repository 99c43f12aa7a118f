//! `haares-bench versus` through the real binary, with a stand-in interpreter that serves steps
//! as the peer script does: the rounds' order, every peer's steps asked for and none more, the
//! ratios and verdicts from the times it reports, a peer whose logits disagree, one that dies,
//! and no PyTorch at all.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::{TINY_SIZES, bench};

/// A stand-in for `python` running `torch_peer.py`: `version`, and `serve`, which checks the
/// exported files, answers ready after a line of chatter, then answers each `step` with
/// `step_s` = `eager` or `compiled` seconds (the times it reports, nothing slept), appending
/// `<method> <mode>` to `steps.log` in `dir`. Compiled HAARES's logits disagree. With `die`, a
/// method's peers exit after that many steps, saying why on stderr.
fn stand_in(dir: &Path, (eager, compiled): (f64, f64), die: Option<(&str, usize)>) -> PathBuf {
    let log = dir.join("steps.log");
    let body = format!(
        r#"#!/bin/sh
case "$2" in
version) echo 'HAARES-COST-RESULT {{"torch": "0.0-stand-in", "threads": 2, "interop_threads": 1, "cuda": false}}' ;;
serve)
  mode=eager; step={eager}
  for arg in "$@"; do case "$arg" in
    --checkpoint=*) test -s "${{arg#--checkpoint=}}" || exit 3 ;;
    --check=*) test -s "${{arg#--check=}}" || exit 3 ;;
    --reference=*) grep -q '"logits"' "${{arg#--reference=}}" || exit 3 ;;
    --method=*) method=${{arg#--method=}} ;;
    --compile) mode=compiled; step={compiled} ;;
  esac; done
  diff=1e-7; [ "$method-$mode" = haares-compiled ] && diff=0.5
  echo "loading the model"
  echo "HAARES-COST-RESULT {{\"ready\": true, \"logits_max_abs_diff\": $diff, \"logits_max_abs\": 0.3}}"
  n=0
  while read -r line; do
    [ "$line" = step ] || break
    [ "$method $n" = "{die}" ] && {{ echo "RuntimeError: out of memory" >&2; exit 9; }}
    n=$((n + 1))
    echo "$method $mode" >> '{log}'
    echo "HAARES-COST-RESULT {{\"step_s\": $step, \"loss\": 5.5}}"
  done ;;
*) exit 2 ;;
esac
"#,
        die = die.map_or("never".to_string(), |(method, n)| format!("{method} {n}")),
        log = log.display(),
    );
    let path = dir.join("stand-in-python");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `versus` on the tiny model (NdArray, two layers) with 7 rounds, the first left out, against
/// both peers at `python`; `(success, stderr, json, markdown)`.
fn versus(python: &Path, methods: &str, dir: &Path) -> (bool, String, serde_json::Value, String) {
    let out = dir.join("versus");
    let mut args = vec!["versus", "--backend", "ndarray", "--layers", "2"];
    args.extend(TINY_SIZES);
    args.extend(["--rounds", "7", "--warmup", "1", "--methods", methods]);
    args.extend(["--python", python.to_str().unwrap()]);
    args.extend(["--out", out.to_str().unwrap()]);
    let (ok, _, stderr) = bench(&args);
    let read = |ext: &str| std::fs::read_to_string(out.with_extension(ext)).unwrap_or_default();
    let json = serde_json::from_str(&read("json")).unwrap_or(serde_json::Value::Null);
    (ok, stderr, json, read("md"))
}

/// Each round steps ours and both peers once, the one going first turning (ours, eager,
/// compiled, ours, …): the peers were asked for exactly their steps, in that order.
#[test]
fn each_round_steps_every_side_once_and_the_first_turns() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in(dir.path(), (100.0, 50.0), None);
    let (ok, stderr, json, md) = versus(&python, "standard", dir.path());
    assert!(ok, "{stderr}");
    let method = &json["methods"][0];
    let first: Vec<u64> = (method["first"].as_array().unwrap().iter())
        .map(|f| f.as_u64().unwrap())
        .collect();
    assert_eq!(first, [0, 1, 2, 0, 1, 2, 0]);
    // Peers' steps in the order the rounds took them: (ours,) eager, compiled; eager, compiled
    // (, ours); compiled (, ours,) eager; …
    let expected: Vec<&str> = (0..7)
        .flat_map(|round| match round % 3 {
            2 => ["compiled", "eager"],
            _ => ["eager", "compiled"],
        })
        .collect();
    let log = std::fs::read_to_string(dir.path().join("steps.log")).unwrap();
    let taken: Vec<&str> = log.lines().map(|l| l.split(' ').nth(1).unwrap()).collect();
    assert_eq!(taken, expected);
    assert_eq!(method["ours_s"].as_array().unwrap().len(), 7);
    for (peer, step) in [(0, 100.0), (1, 50.0)] {
        let steps = method["peers"][peer]["step_s"].as_array().unwrap();
        assert!(steps.iter().all(|s| s.as_f64() == Some(step)), "{steps:?}");
    }
    assert!(
        md.contains("Host: ") && md.contains("PyTorch 0.0-stand-in with 2 threads and 1 inter-op")
    );
    // 50 s steps against our milliseconds: far above the target, the compiled peer the best.
    let verdict = md
        .lines()
        .find(|l| l.starts_with("- Standard Residual:"))
        .unwrap();
    assert!(
        verdict.ends_with("met (the whole interval is at or above the target)"),
        "{md}"
    );
}

/// A peer whose logits disagree is left out of the best PyTorch and of its own ratio; a peer
/// that agrees still judges the method. The ratios are the peers' reported steps over ours.
#[test]
fn a_peer_whose_logits_disagree_is_not_compared() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in(dir.path(), (2.0, 1e-6), None);
    let (ok, stderr, json, md) = versus(&python, "standard,haares", dir.path());
    assert!(ok, "{stderr}");
    let row = |label: &str| {
        md.lines()
            .find(|l| l.starts_with(&format!("| {label} |")))
            .unwrap_or_else(|| panic!("no row for {label} in\n{md}"))
            .to_string()
    };
    assert!(
        row("HAARES").contains("– (logits 5.0e-1 from ours)"),
        "{md}"
    );
    assert!(!row("Standard Residual").contains("logits"), "{md}");
    let verdict = |label: &str| {
        md.lines()
            .find(|l| l.starts_with(&format!("- {label}:")))
            .unwrap()
            .to_string()
    };
    // Standard: the compiled peer's 1 µs steps are the best PyTorch, far faster than ours.
    assert!(verdict("Standard Residual").contains("not met"), "{md}");
    // HAARES: only eager's 2 s steps count, far slower than ours.
    assert!(
        verdict("HAARES").ends_with(": met (the whole interval is at or above the target)"),
        "{md}"
    );
    // The ratio is the peer's step over ours within each round after the warm-up: its median
    // (of six, the mean of the middle two) opens HAARES's last cell.
    let mut ratios: Vec<f64> = json["methods"][1]["ours_s"].as_array().unwrap()[1..]
        .iter()
        .map(|ours| 2.0 / ours.as_f64().unwrap())
        .collect();
    ratios.sort_by(f64::total_cmp);
    let median = format!("| {:.3}× (", (ratios[2] + ratios[3]) / 2.0);
    assert!(row("HAARES").contains(&median), "{median} in {md}");
}

/// A peer that dies mid-run stops the run with its reason; with nothing measured before it,
/// nothing is written. Both die at their third step; round 2 asks the compiled peer first.
#[test]
fn a_peer_that_dies_stops_the_run_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in(dir.path(), (1.0, 1.0), Some(("standard", 2)));
    let (ok, stderr, json, _) = versus(&python, "standard", dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("PyTorch compiled (standard) exited (exit status: 9)")
            && stderr.contains("RuntimeError: out of memory"),
        "{stderr}"
    );
    assert!(json.is_null());
}

/// The methods measured before a peer failed are written, with the reason, and the run still
/// ends in failure.
#[test]
fn what_was_measured_before_a_peer_failed_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in(dir.path(), (1.0, 1.0), Some(("haares", 0)));
    let (ok, stderr, json, md) = versus(&python, "standard,haares", dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("the 1 method(s) measured before it are in"),
        "{stderr}"
    );
    assert_eq!(json["methods"].as_array().unwrap().len(), 1);
    assert_eq!(json["methods"][0]["method"], "standard");
    assert!(
        json["stopped"]
            .as_str()
            .unwrap()
            .contains("RuntimeError: out of memory")
    );
    assert!(
        md.contains("**The run stopped** after 1 of 2 methods"),
        "{md}"
    );
    assert!(
        md.contains("| Standard Residual |") && !md.contains("| HAARES |"),
        "{md}"
    );
}

#[test]
fn without_pytorch_versus_says_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("python-without-torch");
    std::fs::write(
        &python,
        "#!/bin/sh\necho \"No module named 'torch'\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, stderr, json, _) = versus(&python, "standard", dir.path());
    assert!(!ok);
    assert!(stderr.contains("pip install torch safetensors"), "{stderr}");
    assert!(json.is_null());
}

#[test]
fn too_few_rounds_for_an_interval_are_refused() {
    let mut args = vec![
        "versus",
        "--backend",
        "ndarray",
        "--rounds",
        "6",
        "--warmup",
        "2",
    ];
    args.extend(["--python", "/nonexistent/python"]);
    let (ok, _, stderr) = bench(&args);
    assert!(!ok);
    assert!(
        stderr.contains("--rounds 6 leaves fewer than 6 rounds after --warmup 2"),
        "{stderr}"
    );
}

/// The real peer script served step by step: both peers' logits agree with ours, and every
/// step of every side trained (finite losses, positive times).
#[test]
#[ignore = "needs PyTorch: HAARES_PEER_PYTHON=<python with torch and safetensors> \
            cargo test -p haares-bench --test bench -- --ignored versus::"]
fn the_served_pytorch_peer_steps_with_ours() {
    let python = std::env::var("HAARES_PEER_PYTHON")
        .expect("set HAARES_PEER_PYTHON to a Python interpreter that has torch and safetensors");
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr, json, md) = versus(Path::new(&python), "standard,haares", dir.path());
    assert!(ok, "{stderr}");
    assert!(!md.contains("from ours)"), "a peer's logits differ:\n{md}");
    for method in json["methods"].as_array().unwrap() {
        let times = std::iter::once(&method["ours_s"]).chain(
            method["peers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| &p["step_s"]),
        );
        for steps in times {
            let steps = steps.as_array().unwrap();
            assert_eq!(steps.len(), 7);
            assert!(steps.iter().all(|s| s.as_f64().unwrap() > 0.0), "{steps:?}");
        }
        for peer in method["peers"].as_array().unwrap() {
            assert!(peer["losses"][1].as_f64().unwrap().is_finite(), "{peer}");
        }
    }
}
