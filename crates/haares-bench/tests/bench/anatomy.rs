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
  echo 'HAARES-COST-RESULT {"phase_s": [0.1, 0.2, 0.05], "operations": [{"name": "aten::mm", "self_s": 0.08, "calls": 10}, {"name": "aten::mul", "self_s": 0.05, "calls": 30}, {"name": "aten::_scaled_dot_product_flash_attention_for_cpu", "self_s": 0.02, "calls": 2}], "products": [{"matrices": 1, "m": 480, "k": 160, "n": 120, "seconds": 0.001, "calls": 4}, {"matrices": 1, "m": 120, "k": 160, "n": 480, "seconds": 0.003, "calls": 4}, {"matrices": 1, "m": 7, "k": 5, "n": 3, "seconds": 0.002, "calls": 1}]}' ;;
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
    // Its products by shape, a product and its transpose as one: 8 calls in 4 ms of
    // 2 · 480 · 160 · 120 flops each (36.9 GFLOP/s); a shape only it has is set beside nothing of
    // ours.
    let products = json["methods"][0]["products"].as_array().unwrap();
    assert!(!products.is_empty(), "{}", json["methods"][0]);
    let row = |sides: &str| {
        (md.lines())
            .find(|l| l.starts_with(&format!("| {sides} |")))
            .unwrap_or_else(|| panic!("no {sides} row in\n{md}"))
            .split('|')
            .map(|cell| cell.trim().to_string())
            .collect::<Vec<_>>()
    };
    let stand_in = row("120 × 480, depth 160");
    assert_eq!(&stand_in[5..8], ["8", "4.00", "36.9"], "{stand_in:?}");
    let only_theirs = row("3 × 7, depth 5");
    assert_eq!(&only_theirs[2..5], ["–", "–", "–"], "{only_theirs:?}");
    assert_eq!(
        &only_theirs[5..9],
        ["1", "2.00", "0.0", "–"],
        "{only_theirs:?}"
    );
}

#[test]
fn our_products_are_kept_by_shape_inside_the_operations_that_run_them() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr, json, md) = anatomy(dir.path(), &[]);
    assert!(ok, "{stderr}");
    for method in json["methods"].as_array().unwrap() {
        let (products, operations) = (
            method["products"].as_array().unwrap(),
            method["operations"].as_array().unwrap(),
        );
        let sum = |values: &[Value], field: &str, operation: Option<&str>| -> f64 {
            (values.iter())
                .filter(|v| operation.is_none_or(|name| v["operation"] == name))
                .map(|v| v[field].as_f64().unwrap())
                .sum()
        };
        // A product node's forward call is one product and its backward pass one or two.
        let (calls, nodes) = (
            sum(products, "calls", None),
            sum(operations, "calls", Some("matmul")),
        );
        assert!(calls >= nodes && calls <= 1.5 * nodes, "{calls} of {nodes}");
        // Each is timed inside an operation's call or node.
        let (inside, outside) = (
            sum(products, "seconds", None),
            sum(operations, "seconds", None),
        );
        assert!(inside > 0.0 && inside <= outside, "{inside} of {outside}");
    }
    assert!(
        md.contains("| output sides, depth | calls | ours (ms) | ours GFLOP/s |\n"),
        "{md}"
    );
}
