//! Studies: expansion, overrides, sharding, and a sweep that skips finished runs and resumes
//! unfinished ones.

use haares_train::TrainError;
use haares_train::backend::{BackendJob, BackendKind};
use haares_train::study::sweep::{RunStatus, SweepJob, report_after_sweep, tally};
use haares_train::study::{Overrides, parse_shard, parse_study, shard_runs};
use toml::Value;

use crate::common::{B, paths};

pub const STUDY: &str = r#"
title = "Fixture"
paper_table = "tab:fixture"
description = "A tiny study."
default_preset = "tiny"

[grid]
layers = [2, 4]
method = ["block-attnres", "haares"]
model_seed = [1, 2, 3]

[presets.tiny]
[presets.tiny.run]
dataset = "sotu"
blocks = 2
d_model = 16
d_ff = 32
heads = 2
seq_len = 16
batch_size = 2
steps = 4
eval_every = 2
checkpoint_every = 2
log_every = 1
val_chunks = 4
[presets.tiny.grid]
model_seed = [1]

[presets.big]
[presets.big.run]
d_model = 1024
[presets.big.steps_by_layers]
2 = 100
4 = 50
"#;

#[test]
fn a_study_expands_its_grid_with_presets_and_overrides() {
    let study = parse_study("fixture", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "s1-L2-block-attnres",
            "s1-L2-haares",
            "s1-L4-block-attnres",
            "s1-L4-haares"
        ]
    );
    assert_eq!(runs[2].config.layers, 4);
    assert_eq!(runs[2].config.d_model, 16, "preset field");
    assert_eq!(runs[2].config.optimizer.lr, 3e-4, "paper default kept");
    assert_eq!(runs[2].setting_label(), "4L");

    let big = study.plan(Some("big"), &Overrides::default()).unwrap();
    assert_eq!(big.len(), 2 * 2 * 3, "the big preset keeps all three seeds");
    assert_eq!(
        (big[0].config.steps, big[2].config.steps),
        (100, 50),
        "per-depth budgets"
    );
    assert_eq!(
        big[0].config.dataset, "openwebtext",
        "paper default dataset"
    );

    let mut overrides = Overrides::default();
    overrides
        .set_axis("model_seed", vec![Value::Integer(5), Value::Integer(6)])
        .unwrap();
    overrides.set("steps", Value::Integer(9)).unwrap();
    overrides.set("layers", Value::Integer(6)).unwrap();
    let runs = study.plan(Some("big"), &overrides).unwrap();
    assert_eq!(
        runs.len(),
        2 * 2,
        "layers fixed to one value, two seeds, two methods"
    );
    assert!(
        runs.iter()
            .all(|r| r.config.steps == 9 && r.config.layers == 6),
        "CLI steps beat steps_by_layers"
    );
    assert_eq!(runs[0].config.model_seed, 5);
}

#[test]
fn shards_partition_the_runs() {
    let study = parse_study("fixture", STUDY).unwrap();
    let runs = study.plan(Some("big"), &Overrides::default()).unwrap();
    let n = 5;
    let mut seen: Vec<String> = Vec::new();
    for i in 0..n {
        let shard = shard_runs(runs.clone(), parse_shard(&format!("{i}/{n}")).unwrap());
        for (k, run) in shard.iter().enumerate() {
            assert_eq!(
                run.name,
                runs[i + k * n].name,
                "shard {i} takes every {n}th run from the {i}th"
            );
        }
        seen.extend(shard.into_iter().map(|r| r.name));
    }
    seen.sort();
    let mut all: Vec<String> = runs.into_iter().map(|r| r.name).collect();
    all.sort();
    assert_eq!(seen, all, "every run in exactly one shard");
    for bad in ["3/3", "1", "a/2", "0/0"] {
        assert!(parse_shard(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_sweep_resumes_unfinished_runs_and_skips_finished_ones() {
    let dir = tempfile::tempdir().unwrap();
    let study = parse_study("fixture", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    let job = |stop_after| SweepJob {
        runs: runs[..2].to_vec(),
        study_dir: dir.path().join("fixture"),
        paths: paths(dir.path()),
        progress: false,
        stop_after,
        jobs: 2,
        devices: Vec::new(),
        runs_per_device: None,
    };
    let first = job(Some(3))
        .run::<B>(Default::default(), "ndarray".parse().unwrap())
        .unwrap();
    assert!(
        first.iter().all(|(_, s)| *s == RunStatus::Stopped(3)),
        "{first:?}"
    );
    let second = job(None)
        .run::<B>(Default::default(), "ndarray".parse().unwrap())
        .unwrap();
    assert!(
        second
            .iter()
            .all(|(_, s)| matches!(s, RunStatus::Trained(_))),
        "{second:?}"
    );
    let summary = dir.path().join("fixture/s1-L2-haares/summary.json");
    let written = std::fs::read(&summary).unwrap();
    let third = job(None)
        .run::<B>(Default::default(), "ndarray".parse().unwrap())
        .unwrap();
    assert!(
        third.iter().all(|(_, s)| *s == RunStatus::Skipped),
        "{third:?}"
    );
    assert_eq!(
        std::fs::read(&summary).unwrap(),
        written,
        "a finished run is left alone"
    );

    // The resumed runs equal runs trained in one go (to float rounding: two runs train at once
    // here, so reductions are not pinned to one thread; the learner tests check exact equality).
    let straight = tempfile::tempdir().unwrap();
    let once = SweepJob {
        study_dir: straight.path().join("fixture"),
        stop_after: None,
        ..job(None)
    }
    .run::<B>(Default::default(), "ndarray".parse().unwrap())
    .unwrap();
    for ((_, a), (_, b)) in second.iter().zip(&once) {
        let (RunStatus::Trained(a), RunStatus::Trained(b)) = (a, b) else {
            panic!()
        };
        for ((s1, l1), (s2, l2)) in a.val_curve.iter().zip(&b.val_curve) {
            assert_eq!(s1, s2);
            assert!((l1 - l2).abs() < 1e-5, "{l1} vs {l2}");
        }
    }
}

#[test]
fn a_single_run_config_comes_from_toml_or_from_a_runs_config_json() {
    use haares_train::study::load_run_config;
    let dir = tempfile::tempdir().unwrap();
    let toml_path = dir.path().join("run.toml");
    std::fs::write(
        &toml_path,
        "dataset = \"sotu\"\nlayers = 6\nblocks = 3\n[optimizer]\nlr = 1e-3\n",
    )
    .unwrap();
    let mut overrides = Overrides::default();
    overrides.set("steps", Value::Integer(7)).unwrap();
    let config = load_run_config(&toml_path, &overrides).unwrap();
    assert_eq!((config.layers, config.blocks, config.steps), (6, 3, 7));
    assert_eq!(config.optimizer.lr, 1e-3);
    assert_eq!(
        config.optimizer.beta2, 0.95,
        "unset optimizer fields keep the paper's values"
    );

    let json_path = dir.path().join("config.json");
    let json = serde_json::json!({ "run": config, "model": {} });
    std::fs::write(&json_path, serde_json::to_vec(&json).unwrap()).unwrap();
    assert_eq!(
        load_run_config(&json_path, &Overrides::default()).unwrap(),
        config
    );

    let mut two = Overrides::default();
    two.set_axis("layers", vec![Value::Integer(2), Value::Integer(4)])
        .unwrap();
    let error = load_run_config(&toml_path, &two).unwrap_err().to_string();
    assert!(error.contains("one value for `layers`"), "{error}");
    std::fs::write(&toml_path, "layers = 5\nblocks = 4\n").unwrap();
    let error = load_run_config(&toml_path, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("blocks"), "N ∤ 2L: {error}");
}

/// Runs placed per device, end to end on NdArray with two stand-ins for devices (the CPU twice):
/// every run trains once, an interrupted placement resumes, a run that fails leaves the others
/// to finish and is trained on the next pass, and each summary names its device.
#[test]
fn runs_placed_per_device_train_once_resume_and_record_their_device() {
    let dir = tempfile::tempdir().unwrap();
    let study = parse_study("fixture", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    assert_eq!(runs.len(), 4);
    let study_dir = dir.path().join("fixture");
    let job = |stop_after| SweepJob {
        runs: runs.clone(),
        study_dir: study_dir.clone(),
        paths: paths(dir.path()),
        progress: false,
        stop_after,
        jobs: 1,
        devices: vec![0, 1],
        runs_per_device: Some(1),
    };
    let stand_ins = [Default::default(), Default::default()];
    let sweep = |stop_after| {
        job(stop_after)
            .train_on_devices::<B>(BackendKind::Ndarray, &stand_ins)
            .unwrap()
    };
    let first = sweep(Some(3));
    assert!(
        first.iter().all(|(_, s)| *s == RunStatus::Stopped(3)),
        "{first:?}"
    );

    // One run's checkpoint is broken: that run fails, the others resume to the end.
    let broken = &runs[1].name;
    let model = study_dir.join(broken).join("checkpoint/model.safetensors");
    std::fs::write(&model, b"not a safetensors file").unwrap();
    let second = sweep(None);
    let names: Vec<&str> = second.iter().map(|(name, _)| name.as_str()).collect();
    let planned: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, planned, "every run once, in the study's order");
    for (name, status) in &second {
        match status {
            RunStatus::Failed(error) if name == broken => {
                assert!(error.contains("unreadable model"), "{error}")
            }
            RunStatus::Trained(summary) if name != broken => {
                assert_eq!(summary.steps, 4, "{name} resumed to the end");
                assert_eq!(summary.devices, ["Cpu"], "{name} trained on one device");
            }
            _ => panic!("{name}: {status:?}"),
        }
    }

    // Once its directory is cleared, the next pass trains only that run.
    std::fs::remove_dir_all(study_dir.join(broken)).unwrap();
    let third = sweep(None);
    for (name, status) in &third {
        match status {
            RunStatus::Trained(_) if name == broken => {}
            RunStatus::Skipped if name != broken => {}
            _ => panic!("{name}: {status:?}"),
        }
    }
}

#[test]
fn a_sweep_whose_every_run_failed_reports_the_failures_not_a_missing_report() {
    let dir = tempfile::tempdir().unwrap();
    let study = parse_study("fixture", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    let statuses: Vec<(String, RunStatus)> = runs
        .iter()
        .map(|run| {
            (
                run.name.clone(),
                RunStatus::Failed("checkpoint: broken".into()),
            )
        })
        .collect();
    assert!(tally(&statuses).ends_with(&format!("{} failed", runs.len())));
    let error =
        report_after_sweep(&study, &runs, &dir.path().join("fixture"), &statuses).unwrap_err();
    match error {
        TrainError::RunsFailed(failures) => {
            assert_eq!(failures.len(), runs.len());
            assert!(failures[0].contains("checkpoint: broken"), "{failures:?}");
        }
        other => panic!("expected the failures, got {other}"),
    }
}
