//! `haares-bench anatomy` through the real binary on NdArray: every operation's forward and
//! backward per steady step, within the phases that hold them; beside a stand-in for PyTorch's
//! profiler (CI has no PyTorch); refused on a GPU backend.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;

use crate::common::{bench, tiny_model};

/// `anatomy` of the tiny model with `extra` options; `(success, stderr, json, markdown)`.
fn anatomy(dir: &Path, extra: &[&str]) -> (bool, String, Value, String) {
    let out = dir.join("anatomy");
    let mut args = vec!["anatomy"];
    args.extend(tiny_model());
    args.extend([
        "--methods",
        "standard,haares",
        "--steps",
        "4",
        "--warmup",
        "1",
    ]);
    args.extend(["--out", out.to_str().unwrap()]);
    args.extend(extra);
    let (ok, _, stderr) = bench(&args);
    let read = |ext: &str| std::fs::read_to_string(out.with_extension(ext)).unwrap_or_default();
    let json = serde_json::from_str(&read("json")).unwrap_or(Value::Null);
    (ok, stderr, json, read("md"))
}

#[test]
fn every_operation_is_timed_inside_the_phase_that_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr, json, md) = anatomy(dir.path(), &[]);
    assert!(ok, "{stderr}");
    let methods = json["methods"].as_array().unwrap();
    assert_eq!(methods.len(), 2);
    for method in methods {
        let name = method["method"].as_str().unwrap();
        let operations = method["operations"].as_array().unwrap();
        let has = |operation: &str| operations.iter().any(|op| op["operation"] == operation);
        assert!(has("matmul") && has("softmax"), "{name}: {operations:?}");
        assert_eq!(
            has("routing::read"),
            name == "haares",
            "{name}: {operations:?}"
        );
        // Per steady step, the operations of a pass fit inside the phase that runs them.
        for (index, pass) in ["forward", "backward"].into_iter().enumerate() {
            let phase = method["phase_s"][index].as_f64().unwrap();
            let inside: f64 = (operations.iter())
                .filter(|op| op["pass"] == pass)
                .map(|op| op["seconds"].as_f64().unwrap())
                .sum();
            assert!(
                inside > 0.0 && inside <= phase,
                "{name} {pass}: {inside} of {phase}"
            );
        }
    }
    for row in [
        "| matmul |",
        "| other |",
        "| update (AdamW, gradient norm, clip) |",
    ] {
        assert!(md.contains(row), "{row}\n{md}");
    }
    assert!(
        md.contains("## HAARES") && md.contains("| routing::read |"),
        "{md}"
    );
}

#[test]
fn pytorch_s_profile_is_set_beside_ours_by_category() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("stand-in-python");
    // Answers as the peer script does; its profile needs the weights our worker exported.
    let script = r#"#!/bin/sh
case "$2" in
version) echo 'HAARES-COST-RESULT {"torch": "0.0-stand-in", "threads": 2, "interop_threads": 2, "cuda": false}' ;;
profile)
  for arg in "$@"; do case "$arg" in
    --checkpoint=*) test -s "${arg#--checkpoint=}" || exit 3 ;;
  esac; done
  echo 'HAARES-COST-RESULT {"phase_s": [0.1, 0.2, 0.05], "operations": [{"name": "aten::mm", "self_s": 0.08, "calls": 10}, {"name": "aten::mul", "self_s": 0.05, "calls": 30}, {"name": "aten::_scaled_dot_product_flash_attention_for_cpu", "self_s": 0.02, "calls": 2}]}' ;;
*) exit 2 ;;
esac
"#;
    std::fs::write(&python, script).unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, stderr, json, md) = anatomy(
        dir.path(),
        &["--peer", "--python", python.to_str().unwrap()],
    );
    assert!(ok, "{stderr}");
    assert!(json["peer_skipped"].is_null(), "{stderr}");
    assert_eq!(json["torch_version"], "0.0-stand-in");
    // Products and attention: 80 + 20 ms of self time; the rest of its 300 ms forward and
    // backward: 200 ms; its update and whole step as timed.
    for (category, theirs) in [
        ("matrix products and attention", "100.00"),
        ("everything else in forward and backward", "200.00"),
        ("update", "50.00"),
        ("whole step", "350.00"),
    ] {
        let line = (md.lines())
            .find(|l| l.starts_with(&format!("| {category} |")))
            .unwrap_or_else(|| panic!("no {category} row in\n{md}"));
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells[3], theirs, "{line}");
    }
    assert!(md.contains("| `aten::mm` | 80.00 | 10 |"), "{md}");
}

#[test]
fn a_gpu_backend_is_refused_with_the_command_that_times_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("anatomy");
    let (ok, _, stderr) = bench(&[
        "anatomy",
        "--backend",
        "wgpu",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(stderr.contains("first-step --kernel-times"), "{stderr}");
    assert!(!out.with_extension("md").exists());
}
