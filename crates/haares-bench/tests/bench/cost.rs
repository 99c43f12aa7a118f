//! The cost protocol end to end through the real binary, at a tiny size on NdArray.

use crate::common::{TINY_ORDER, bench, tiny_cost, tiny_model};

#[test]
fn cost_runs_end_to_end_and_writes_valid_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested").join("cost");
    let mut args = tiny_cost();
    args.extend(["--out", out.to_str().unwrap()]);
    let (ok, _, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    let samples = json["samples"][0][1].as_array().unwrap();
    // Three methods × two repeats, interleaved in alternating order.
    let order: Vec<&str> = samples
        .iter()
        .map(|s| s["method"].as_str().unwrap())
        .collect();
    assert_eq!(order, TINY_ORDER);
    for sample in samples {
        let steps = sample["step_s"].as_array().unwrap();
        assert_eq!(steps.len(), 3);
        let (startup, total) = (
            sample["startup_s"].as_f64().unwrap(),
            sample["total_s"].as_f64().unwrap(),
        );
        let stepped: f64 = steps.iter().map(|s| s.as_f64().unwrap()).sum();
        assert!(
            startup > 0.0 && total >= startup + stepped,
            "the window covers start-up and steps"
        );
        assert!(sample["peak_rss_bytes"].as_u64().unwrap() > 1 << 20);
        // The worker counts its heap (the paper's allocated memory, on a CPU).
        assert!(sample["peak_allocated_bytes"].as_u64().unwrap() > 1 << 20);
        // Random ids: the first loss is near ln 256 = 5.55.
        assert!((sample["first_loss"].as_f64().unwrap() - 256f64.ln()).abs() < 0.5);
        // Routed methods time validation batches without and with routing statistics.
        let validation = &sample["validation"];
        if sample["method"] == "standard" {
            assert!(validation.is_null());
        } else {
            for mode in ["plain_s", "with_routing_s"] {
                let times = validation[mode].as_array().unwrap();
                assert_eq!(times.len(), 6, "{mode}");
                assert!(times.iter().all(|t| t.as_f64().unwrap() > 0.0));
            }
        }
    }
    assert!(
        json["gemm_flops_per_s"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r.as_f64().unwrap() > 1e6)
    );
    step_time_targets_show_their_spread_over_repeats(json.clone());
    let table = std::fs::read_to_string(out.with_extension("md")).unwrap();
    for needle in [
        "| Small | 128 | HAARES |",
        "(allocated) |",
        "HAARES / Block AttnRes peak RSS",
        "step / Block",
        "HAARES / Block AttnRes step time",
        "| Small | HAARES |",
        "for a validation pass of 4 batches every 20 steps",
        "HAARES routing telemetry",
    ] {
        assert!(table.contains(needle), "missing `{needle}` in\n{table}");
    }
}

/// The run's report with step times set by hand (one warm-up step, then two steady steps per
/// repeat): every step-time target gives the range of its ratio over the paired repeats.
fn step_time_targets_show_their_spread_over_repeats(mut json: serde_json::Value) {
    let mut seen = std::collections::HashMap::new();
    for sample in json["samples"][0][1].as_array_mut().unwrap() {
        let method = sample["method"].as_str().unwrap().to_string();
        let repeat = *seen
            .entry(method.clone())
            .and_modify(|r| *r += 1)
            .or_insert(0usize);
        let steady = match (method.as_str(), repeat) {
            ("standard", _) => 1.0,
            ("block-attnres", 0) => 1.0,
            ("block-attnres", _) => 2.0,
            ("haares", 0) => 1.1,
            ("haares", _) => 1.9,
            (other, _) => panic!("unexpected method {other}"),
        };
        sample["step_s"] = serde_json::json!([9.0, steady, steady]);
    }
    let run: haares_bench::cost::CostRun = serde_json::from_value(json).unwrap();
    let table = haares_bench::cost::report::cost_table(&run);
    for needle in [
        // Medians 1.5 and 1.5; per repeat 1.1 / 1.0 and 1.9 / 2.0.
        "HAARES / Block AttnRes step time 1.000× (target ≤ 1.05×): met; per repeat 0.950–1.100×",
        // Medians 1.5 and 1.0; per repeat 1.0 / 1.0 and 2.0 / 1.0.
        "Block AttnRes / Standard step time 1.500× (target ≤ 1.15×): not met; per repeat \
         1.000–2.000×",
    ] {
        assert!(table.contains(needle), "missing `{needle}` in\n{table}");
    }
}

#[test]
fn cost_refuses_bad_arguments_before_measuring() {
    for (change, expected) in [
        (("--backend", "tpu"), "unknown backend `tpu`"),
        (("--methods", "resnet"), "unknown method `resnet`"),
        (
            ("--methods", "haares/naive"),
            "unknown routing path `naive`",
        ),
        (("--blocks", "3"), "N = 3 does not divide the 2L = 4"),
        (("--warmup", "3"), "must exceed --warmup"),
    ] {
        let mut args = tiny_cost();
        let at = args.iter().position(|a| *a == change.0).unwrap();
        args[at + 1] = change.1;
        let (ok, _, stderr) = bench(&args);
        assert!(!ok && stderr.contains(expected), "{change:?}: {stderr}");
        assert!(
            !stderr.contains("GEMM"),
            "nothing is measured before the arguments are checked"
        );
    }
    // Test builds include wgpu (decision 27), not CUDA unless asked for.
    #[cfg(not(feature = "cuda"))]
    {
        let mut args = tiny_cost();
        args[2] = "cuda";
        let (ok, _, stderr) = bench(&args);
        assert!(
            !ok && stderr.contains("not compiled into this build"),
            "{stderr}"
        );
    }
}

/// `paired` alternates the two methods' steps in one process and writes every pair's steps, the
/// order and the ratio's interval; named baseline first, the methods are turned round so that the
/// ratio is HAARES over Block AttnRes, and the table says so.
#[test]
fn paired_alternates_two_methods_and_reports_the_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("paired");
    let mut args = vec!["paired"];
    args.extend(tiny_model());
    args.extend([
        "--methods",
        "block-attnres,haares",
        "--pairs",
        "9",
        "--warmup",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    let (ok, stdout, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    let methods = &json["spec"]["cost"]["methods"];
    assert_eq!(methods, &serde_json::json!(["haares", "block-attnres"]));
    assert_eq!(json["spec"]["reordered"], true);
    for m in 0..2 {
        let steps = json["step_s"][m].as_array().unwrap();
        assert_eq!(steps.len(), 9);
        assert!(steps.iter().all(|s| s.as_f64().unwrap() > 0.0));
        let first_loss = json["losses"][m][0].as_f64().unwrap();
        assert!((first_loss - 256f64.ln()).abs() < 0.5, "{first_loss}");
    }
    let first: Vec<u64> = (json["first"].as_array().unwrap().iter())
        .map(|f| f.as_u64().unwrap())
        .collect();
    assert_eq!(first, [0, 1, 0, 1, 0, 1, 0, 1, 0]);
    // Seven pairs after the warm-up: the sign test's 95% interval is the extremes (ranks 1, 7).
    let table = std::fs::read_to_string(out.with_extension("md")).unwrap();
    assert!(
        table.contains("haares / block-attnres, step by step: median")
            && table.contains("over 7 pairs, 95% interval")
            && table.contains("named block-attnres first"),
        "{table}"
    );
    assert_eq!(stdout, table);
}

#[test]
fn paired_refuses_other_than_two_methods_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("refused");
    let (ok, _, stderr) = bench(&[
        "paired",
        "--backend",
        "ndarray",
        "--methods",
        "haares",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(stderr.contains("compares two methods"), "{stderr}");
    assert!(!out.with_extension("json").exists());
    let (ok, _, stderr) = bench(&["paired", "--backend", "ndarray", "--pairs", "7"]);
    assert!(!ok);
    assert!(stderr.contains("fewer than 6 pairs"), "{stderr}");
}

/// A run cut short after its first family (as a GPU machine's time limit cuts one) leaves that
/// family's table and JSON, marked partial; the finished run replaces them with the whole one.
#[test]
fn a_cost_run_cut_short_keeps_the_families_it_finished() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cost");
    let mut args = vec!["cost"];
    args.extend(tiny_model());
    args.extend([
        "--family",
        "small,medium",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--repeats",
        "1",
        "--gemm-size",
        "64",
        "--methods",
        "standard",
        "--out",
        out.to_str().unwrap(),
    ]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_haares-bench"))
        .args(&args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("with the families so far") {
            child.kill().unwrap();
            break;
        }
    }
    child.wait().unwrap();
    assert!(seen.contains("with the families so far"), "{seen}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    let families: Vec<&str> = json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f[0].as_str().unwrap())
        .collect();
    assert_eq!(families, ["Small"]);
    let table = std::fs::read_to_string(out.with_extension("md")).unwrap();
    assert!(
        table.starts_with("**Partial:** written after 1 of the 2 families"),
        "{table}"
    );
    assert!(
        table.contains("| Small | 128 | Standard Residual |") && !table.contains("| Medium |"),
        "{table}"
    );

    let (ok, _, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let table = std::fs::read_to_string(out.with_extension("md")).unwrap();
    assert!(!table.contains("Partial"), "{table}");
    assert!(
        table.contains("| Medium | 512 | Standard Residual |"),
        "{table}"
    );
}
