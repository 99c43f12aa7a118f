//! Kernel launch accounting on wgpu (lavapipe in CI), through the real binary: `first-step`
//! counts the launches of a steady step by phase and by depth, and `cost` adds its launch table.
//! In every test build (docs/decisions.md, decision 27) and ignored without an adapter: `cargo test
//! -p haares-bench --test bench -- --ignored wgpu`. Every worker compiles its shaders, so the
//! sizes are the smallest the model takes.
use crate::common::{TINY_SIZES, bench};

/// The smallest model on wgpu, as every test here takes it, at the depth a test names.
const WGPU: [&str; 2] = ["--backend", "wgpu"];

/// The second step's launches of every worker, `(method, layers, [forward, backward, update])`.
fn launches(json: &serde_json::Value) -> Vec<(String, u64, [u64; 3])> {
    json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            let (layers, sample) = (pair[0].as_u64().unwrap(), &pair[1]);
            let second = &sample["anatomy"]["kernels"]["second_step"];
            let phase = |i: usize| second[i]["launched"].as_u64().unwrap();
            let method = sample["method"].as_str().unwrap().to_string();
            (method, layers, [phase(0), phase(1), phase(2)])
        })
        .collect()
}

/// `first-step` counts a steady step's launches by phase and by depth; with `--kernel-times` it
/// times every launch on the device and counts the same launches as a counting worker: timing a
/// kernel must not change which kernels a step launches. (One test, so that the counting run at
/// 2 layers serves both: every worker compiles its shaders anew.)
#[test]
#[ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
fn first_step_counts_the_launches_of_a_steady_step_by_phase_and_depth_and_times_them() {
    let dir = tempfile::tempdir().unwrap();
    let (json, stdout) = first_step(
        &dir.path().join("first-step"),
        "2,4",
        "standard,haares",
        &[],
    );
    let counts = launches(&json);
    assert_eq!(counts.len(), 4, "{counts:?}");
    for (method, layers, phases) in &counts {
        assert!(
            phases.iter().all(|&n| n > 0),
            "{method} at {layers} layers launched nothing in a phase: {phases:?}"
        );
    }
    let total = |method: &str, layers: u64| -> u64 {
        let (_, _, phases) = counts
            .iter()
            .find(|(m, l, _)| m == method && *l == layers)
            .unwrap();
        phases.iter().sum()
    };
    // Two more layers launch more kernels, and HAARES's routing launches more than Standard's.
    assert!(total("standard", 4) > total("standard", 2), "{counts:?}");
    assert!(total("haares", 4) > total("haares", 2), "{counts:?}");
    assert!(total("haares", 4) > total("standard", 4), "{counts:?}");
    assert!(
        stdout.contains("launches per step (fwd + bwd + upd)"),
        "{stdout}"
    );
    assert!(stdout.contains("| per added layer |"), "{stdout}");
    let (timed, timed_stdout) = first_step(
        &dir.path().join("timed"),
        "2",
        "haares",
        &["--kernel-times"],
    );
    let counted_at_2: Vec<_> = counts
        .iter()
        .filter(|(method, layers, _)| method == "haares" && *layers == 2)
        .cloned()
        .collect();
    assert_eq!(
        launches(&timed),
        counted_at_2,
        "the same launches, timed or not"
    );
    let second = &timed["samples"][0][1]["anatomy"]["kernels"]["second_step"];
    for phase in second.as_array().unwrap() {
        let total = phase["device_ns"].as_u64().unwrap();
        assert!(total > 0, "a phase without device time: {phase}");
        let by_name = phase["device_ns_by_name"].as_object().unwrap();
        let summed: u64 = by_name.values().map(|ns| ns.as_u64().unwrap()).sum();
        assert_eq!(summed, total, "the kernels' times add up to the phase's");
        for name in by_name.keys() {
            assert!(
                phase["launched_by_name"][name].as_u64().unwrap() > 0,
                "{name}"
            );
        }
    }
    for sample in json["samples"].as_array().unwrap() {
        let untimed = &sample[1]["anatomy"]["kernels"]["second_step"][1];
        assert_eq!(untimed["device_ns"], 0, "a counting worker times nothing");
    }
    assert!(
        timed_stdout.contains("Device time of a steady step's kernels"),
        "{timed_stdout}"
    );
    assert!(timed_stdout.contains("| HAARES | 2 |"), "{timed_stdout}");
}

#[test]
#[ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
fn cost_counts_launches_in_a_worker_of_its_own_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cost");
    let mut sizes = vec!["cost"];
    sizes.extend(WGPU);
    sizes.extend(TINY_SIZES);
    sizes.extend([
        "--layers",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--repeats",
        "1",
        "--methods",
        "standard",
        "--gemm-size",
        "64",
    ]);
    let mut args = sizes.clone();
    args.extend(["--out", out.to_str().unwrap()]);
    let (ok, stdout, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    let counted = &json["launches"][0];
    assert_eq!(counted["method"], "standard");
    let per_phase: Vec<u64> = counted["per_phase"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert!(per_phase.iter().all(|&n| n > 0), "{per_phase:?}");
    assert!(
        stdout.contains("Kernel launches per training step"),
        "{stdout}"
    );
    // The timing worker logged no launch.
    let timing = &json["samples"][0][1][0]["anatomy"]["kernels"]["second_step"];
    assert!(
        (0..3).all(|i| timing[i]["launched"].as_u64() == Some(0)),
        "{timing}"
    );

    let quiet = dir.path().join("quiet");
    let mut args = sizes.clone();
    args.extend(["--no-launches", "--out", quiet.to_str().unwrap()]);
    let (ok, stdout, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains("Kernel launches per training step"),
        "{stdout}"
    );
}

/// `first-step` on wgpu at the smallest sizes, 2 steps, writing to `out`: its JSON and stdout.
fn first_step(
    out: &std::path::Path,
    layers: &str,
    methods: &str,
    extra: &[&str],
) -> (serde_json::Value, String) {
    let mut args = vec!["first-step"];
    args.extend(WGPU);
    args.extend(TINY_SIZES);
    args.extend([
        "--steps",
        "2",
        "--layers",
        layers,
        "--methods",
        methods,
        "--out",
    ]);
    args.push(out.to_str().unwrap());
    args.extend(extra);
    let (ok, stdout, stderr) = bench(&args);
    assert!(ok, "{stderr}");
    let text = std::fs::read_to_string(out.with_extension("json")).unwrap();
    (serde_json::from_str(&text).unwrap(), stdout)
}
