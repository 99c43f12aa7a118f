//! The PyTorch peer of the cost protocol (`cost --peer torch`) through the real binary: without
//! PyTorch, with a stand-in interpreter that answers as the peer does, and (ignored unless
//! PyTorch is installed) with the real peer script.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::{TINY_ORDER, bench, tiny_cost};

/// Runs the tiny cost protocol, with the values of `overrides` (flag, value) in place of its own,
/// and the peer at `python`; `(success, stderr, json, markdown)`.
fn cost_with_peer(
    python: &str,
    overrides: &[(&str, &str)],
    dir: &Path,
) -> (bool, String, serde_json::Value, String) {
    let out = dir.join("cost");
    let mut args = tiny_cost();
    for (flag, value) in overrides {
        let at = args
            .iter()
            .position(|a| a == flag)
            .expect("a flag of tiny_cost");
        args[at + 1] = value;
    }
    args.extend(["--peer", "torch", "--python", python]);
    args.extend(["--out", out.to_str().unwrap()]);
    let (ok, _, stderr) = bench(&args);
    let read = |ext: &str| std::fs::read_to_string(out.with_extension(ext)).unwrap_or_default();
    let json = serde_json::from_str(&read("json")).unwrap_or(serde_json::Value::Null);
    (ok, stderr, json, read("md"))
}

/// One string field of each of the peer's samples (the first family's), in measurement order.
fn peer_samples<'a>(
    json: &'a serde_json::Value,
    field: impl Fn(&'a serde_json::Value) -> &'a serde_json::Value,
) -> Vec<&'a str> {
    json["peer"]["samples"][0][1]
        .as_array()
        .unwrap()
        .iter()
        .map(|sample| field(sample).as_str().unwrap())
        .collect()
}

/// An executable shell script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn without_pytorch_the_run_goes_on_and_says_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let python = script(
        dir.path(),
        "python-without-torch",
        "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n",
    );
    let (ok, stderr, json, md) = cost_with_peer(python.to_str().unwrap(), &[], dir.path());
    assert!(ok, "{stderr}");
    assert!(stderr.contains("PyTorch peer skipped"), "{stderr}");
    assert!(stderr.contains("No module named 'torch'"), "{stderr}");
    assert!(stderr.contains("pip install torch safetensors"), "{stderr}");
    // Our measurements are all there; the peer has none and says why.
    assert_eq!(json["samples"][0][1].as_array().unwrap().len(), 6);
    assert!(
        json["peer"]["skipped"]
            .as_str()
            .unwrap()
            .contains("import torch")
    );
    assert!(json["peer"]["samples"].as_array().unwrap().is_empty());
    assert!(
        md.contains("## PyTorch peer") && md.contains("Not (fully) measured"),
        "{md}"
    );
}

#[test]
fn a_missing_interpreter_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-python");
    let (ok, stderr, json, _) = cost_with_peer(missing.to_str().unwrap(), &[], dir.path());
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("cannot start") && stderr.contains("no-such-python"),
        "{stderr}"
    );
    assert!(json["peer"]["skipped"].is_string());
}

/// A stand-in interpreter that answers as the peer does; checks that our worker exported the
/// three files and that a precision is named; reports slow steps (so the throughput target is
/// met; twice as fast, still slow, when asked to compile), the precision it was given and, for
/// HAARES only, logits that disagree.
fn stand_in_peer(dir: &Path) -> PathBuf {
    script(
        dir,
        "stand-in-python",
        r#"case "$2" in
version) echo 'HAARES-COST-RESULT {"torch": "0.0-stand-in", "threads": 2, "cuda": false}' ;;
gemm) echo 'HAARES-COST-RESULT {"flops_per_s": 1e9}' ;;
train)
  for arg in "$@"; do case "$arg" in
    --checkpoint=*) test -s "${arg#--checkpoint=}" || exit 3 ;;
    --check=*) test -s "${arg#--check=}" || exit 3 ;;
    --reference=*) grep -q '"logits"' "${arg#--reference=}" || exit 3 ;;
    --method=*) method=${arg#--method=} ;;
    --matmul=*) matmul=${arg#--matmul=} ;;
    --compile) step=50 ;;
  esac; done
  test -n "$matmul" || exit 4
  diff=1e-7; [ "$method" = haares ] && diff=0.5
  echo "HAARES-COST-RESULT {\"sample\": {\"method\": \"$method\", \"startup_s\": 0.1, \"total_s\": 300.1, \"step_s\": [${step:-100}, ${step:-100}, ${step:-100}], \"peak_rss_bytes\": 2000000, \"first_loss\": 5.5, \"last_loss\": 5.4}, \"matmul\": \"$matmul\", \"logits_max_abs_diff\": $diff, \"logits_max_abs\": 0.3}" ;;
*) exit 2 ;;
esac
"#,
    )
}

#[test]
fn the_peer_is_measured_after_each_of_ours_and_compared_only_where_its_logits_agree() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in_peer(dir.path());
    let (ok, stderr, json, md) = cost_with_peer(python.to_str().unwrap(), &[], dir.path());
    assert!(ok, "{stderr}");
    assert!(json["peer"]["skipped"].is_null(), "{}", json["peer"]);
    let order = peer_samples(&json, |s| &s["sample"]["method"]);
    assert_eq!(order, TINY_ORDER);
    // One GEMM before and one after, as ours.
    assert_eq!(
        json["peer"]["gemm_flops_per_s"].as_array().unwrap().len(),
        2
    );
    assert!(md.contains("PyTorch 0.0-stand-in with 2 threads"), "{md}");
    let target = |label: &str| {
        md.lines()
            .find(|l| l.starts_with(&format!("- Small: {label} throughput /")))
            .unwrap_or_else(|| panic!("no target line for {label} in\n{md}"))
            .to_string()
    };
    assert!(target("Standard Residual").ends_with(": met"), "{md}");
    assert!(target("Block AttnRes").ends_with(": met"), "{md}");
    assert!(target("HAARES").contains("not compared"), "{md}");
    assert!(md.contains("(differ)"), "{md}");
    assert!(md.contains("- GEMM peak / PyTorch's"), "{md}");
    // On a CPU both compute in fp32: the default precision, and the one the targets judge.
    let precisions = peer_samples(&json, |s| &s["matmul"]);
    assert_eq!(precisions, ["fp32"; 6]);
    assert!(
        target("Standard Residual").contains("the best PyTorch (eager fp32)"),
        "{md}"
    );
}

#[test]
fn the_peer_trains_a_method_once_for_both_of_our_routing_paths() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in_peer(dir.path());
    let overrides = [(
        "--methods",
        "standard,block-attnres/reference,block-attnres/fused",
    )];
    let (ok, stderr, json, md) = cost_with_peer(python.to_str().unwrap(), &overrides, dir.path());
    assert!(ok, "{stderr}");
    // Ours: A B C, C B A. The peer: its model of Block AttnRes once per repeat, after whichever
    // of our paths came first.
    let order = peer_samples(&json, |s| &s["sample"]["method"]);
    assert_eq!(
        order,
        ["standard", "block-attnres", "block-attnres", "standard"]
    );
    // Both of our paths are compared with it.
    for label in ["Block AttnRes (reference)", "Block AttnRes (fused)"] {
        assert!(
            md.lines()
                .any(|l| l.starts_with(&format!("- Small: {label} throughput"))),
            "{label}\n{md}"
        );
    }
}

#[test]
fn the_compiled_peer_runs_beside_the_eager_one_and_the_faster_is_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in_peer(dir.path());
    let out = dir.path().join("cost");
    let mut args = tiny_cost();
    args.extend([
        "--peer",
        "torch-compile,torch",
        "--python",
        python.to_str().unwrap(),
    ]);
    args.extend(["--out", out.to_str().unwrap()]);
    let (ok, _, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    // Eager, then compiled, after each of ours; the compiled runs were asked to compile.
    let modes = peer_samples(&json, |s| &s["mode"]);
    assert_eq!(modes, ["eager", "compiled"].repeat(6));
    for sample in json["peer"]["samples"][0][1].as_array().unwrap() {
        let first_step = sample["sample"]["step_s"][0].as_f64().unwrap();
        let compiled = sample["mode"] == "compiled";
        assert_eq!(first_step, if compiled { 50.0 } else { 100.0 }, "{sample}");
    }
    let md = std::fs::read_to_string(out.with_extension("md")).unwrap();
    let line = md
        .lines()
        .find(|l| l.starts_with("- Small: Standard Residual throughput /"))
        .unwrap();
    assert!(
        line.contains("the best PyTorch (compiled fp32)")
            && line.contains("against the others eager fp32")
            && line.ends_with(": met"),
        "{line}"
    );
    assert!(md.contains("| compiled fp32 | 50.0000 | 50.0000 |"), "{md}");
    the_peer_verdict_shows_its_spread_over_repeats(json);
}

/// The run's report with step times set by hand (one warm-up step, then two steady steps per
/// measurement): the throughput verdict against the best PyTorch gives the range of its ratio
/// over the repeats, each repeat's peer run against our run it followed.
fn the_peer_verdict_shows_its_spread_over_repeats(mut json: serde_json::Value) {
    let steady = |sample: &mut serde_json::Value, step: f64| {
        sample["step_s"] = serde_json::json!([9.0, step, step]);
    };
    for sample in json["samples"][0][1].as_array_mut().unwrap() {
        steady(sample, 1.0);
    }
    let mut seen = std::collections::HashMap::new();
    for sample in json["peer"]["samples"][0][1].as_array_mut().unwrap() {
        let key = (
            sample["sample"]["method"].as_str().unwrap().to_string(),
            sample["mode"].as_str().unwrap().to_string(),
        );
        let repeat = *seen
            .entry(key.clone())
            .and_modify(|r| *r += 1)
            .or_insert(0usize);
        let step = match (key.1.as_str(), repeat) {
            ("eager", 0) => 1.2,
            ("eager", _) => 1.5,
            (_, 0) => 1.4,
            (_, _) => 1.6,
        };
        steady(&mut sample["sample"], step);
    }
    let run: haares_bench::cost::CostRun = serde_json::from_value(json).unwrap();
    let table = haares_bench::cost::report::cost_table(&run);
    // Eager's pooled median 1.35 beats compiled's 1.5; per repeat 1.2 / 1.0 and 1.5 / 1.0.
    let needle = "Standard Residual throughput / the best PyTorch (eager fp32) 1.350× (target ≥ \
                  1.3×), per repeat 1.200–1.500×; against the others compiled fp32 1.500×: met";
    assert!(table.contains(needle), "missing `{needle}` in\n{table}");
}

#[test]
fn tf32_for_the_peer_is_refused_off_cuda() {
    let dir = tempfile::tempdir().unwrap();
    let python = stand_in_peer(dir.path());
    let out = dir.path().join("cost");
    let mut args = tiny_cost();
    args.extend(["--peer", "torch", "--python", python.to_str().unwrap()]);
    args.extend(["--peer-matmul", "fp32,tf32", "--out", out.to_str().unwrap()]);
    let (ok, _, stderr) = bench(&args);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("--peer-matmul tf32 needs a CUDA backend"),
        "{stderr}"
    );
    assert!(!out.with_extension("json").exists());
}

#[test]
#[ignore = "needs PyTorch: HAARES_PEER_PYTHON=<python with torch and safetensors> \
            cargo test -p haares-bench --test bench -- --ignored peer::"]
fn the_pytorch_peer_computes_our_logits_for_every_method() {
    let python = std::env::var("HAARES_PEER_PYTHON")
        .expect("set HAARES_PEER_PYTHON to a Python interpreter that has torch and safetensors");
    let dir = tempfile::tempdir().unwrap();
    // Odd blocks (m = 3 events) and every method the peer implements.
    let methods = "standard,rezero,layerscale,block-attnres,haares,haares-duplicated-c,\
                   haares-random-signs=5,haares-fixed-bias=-3,haares-no-rms-match";
    let overrides = [
        ("--layers", "3"),
        ("--blocks", "2"),
        ("--repeats", "1"),
        ("--methods", methods),
    ];
    let (ok, stderr, json, md) = cost_with_peer(&python, &overrides, dir.path());
    assert!(ok, "{stderr}");
    assert!(json["peer"]["skipped"].is_null(), "{stderr}");
    let samples = json["peer"]["samples"][0][1].as_array().unwrap();
    assert_eq!(samples.len(), 9, "{stderr}");
    for sample in samples {
        let method = &sample["sample"]["method"];
        let diff = sample["logits_max_abs_diff"].as_f64().unwrap();
        let scale = sample["logits_max_abs"].as_f64().unwrap().max(1.0);
        assert!(
            diff <= 1e-4 * scale,
            "{method}: logits differ by {diff}\n{md}"
        );
        let losses = [
            &sample["sample"]["first_loss"],
            &sample["sample"]["last_loss"],
        ];
        assert!(
            losses.iter().all(|l| l.as_f64().unwrap().is_finite()),
            "{method}"
        );
    }
}
