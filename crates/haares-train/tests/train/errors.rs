//! Bad input: clear errors, a non-zero exit, nothing overwritten.

use haares_train::study::sweep::check_writable;
use haares_train::study::{Overrides, load_study, parse_study};
use haares_train::{RunConfig, TrainError};
use toml::Value;

use crate::common::{cli, cli_with, run, sotu, tiny_config, train_to_end};
use crate::sweep::STUDY;

#[test]
fn unknown_studies_presets_methods_and_backends_are_refused() {
    let error = load_study("depht").unwrap_err().to_string();
    assert!(
        error.contains("unknown study `depht`") && error.contains("depth, seeds, width"),
        "{error}"
    );
    let study = parse_study("fixture", STUDY).unwrap();
    let error = study
        .plan(Some("gpu"), &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no preset `gpu`") && error.contains("big, tiny"),
        "{error}"
    );

    let (ok, stderr) = cli(&["sweep", "depht", "--dry-run"]);
    assert!(!ok && stderr.contains("unknown study"), "{stderr}");
    let (ok, stderr) = cli(&["sweep", "depth", "--preset", "gpu", "--dry-run"]);
    assert!(!ok && stderr.contains("no preset `gpu`"), "{stderr}");
    let (ok, stderr) = cli(&["sweep", "depth", "--methods", "haares,resnet", "--dry-run"]);
    assert!(
        !ok && stderr.contains("unknown method `resnet`"),
        "{stderr}"
    );
    let (ok, stderr) = cli(&["sweep", "depth", "--backend", "tpu", "--dry-run"]);
    assert!(!ok && stderr.contains("unknown backend `tpu`"), "{stderr}");
    // The products' provider: a misspelt one stops the runner, naming the variable and its values.
    let (ok, stderr) = cli_with(
        &["sweep", "depth", "--dry-run"],
        &[("HAARES_PRODUCTS", "cublass")],
    );
    assert!(
        !ok && stderr.contains("HAARES_PRODUCTS=cublass") && stderr.contains("`cubek` or `cublas`"),
        "{stderr}"
    );
    let (ok, stderr) = cli_with(
        &["sweep", "depth", "--dry-run"],
        &[("HAARES_PRODUCTS", "cublas")],
    );
    assert!(ok, "a valid provider is taken: {stderr}");
    let (ok, stderr) = cli(&["sweep", "depth", "--blocks", "5", "--dry-run"]);
    assert!(
        !ok && stderr.contains("blocks"),
        "N ∤ 2L is refused: {stderr}"
    );
    let (ok, stderr) = cli(&["sweep", "depth", "--set", "colour=blue", "--dry-run"]);
    assert!(!ok && stderr.contains("unknown field `colour`"), "{stderr}");
    let (ok, stderr) = cli(&["sweep", "depth", "--runs-per-device", "1", "--jobs", "2"]);
    assert!(!ok && stderr.contains("cannot be used with"), "{stderr}");
    // Every built-in study plans under every preset.
    for name in [
        "depth",
        "seeds",
        "width",
        "bpe",
        "domains",
        "blocks",
        "ablations",
    ] {
        let study = load_study(name).unwrap();
        for preset in study.presets.keys() {
            assert!(
                !study
                    .plan(Some(preset), &Overrides::default())
                    .unwrap()
                    .is_empty(),
                "{name}/{preset}"
            );
        }
    }
}

/// A study file with an empty grid axis, in the study's grid or in its preset's, is refused by the
/// runner with the axis and where it was given, and a non-zero exit; never a panic.
#[test]
fn a_study_with_an_empty_axis_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for (edit, axis, source) in [
        (
            ("layers = [2, 4]", "layers = []"),
            "layers",
            "study `empty`'s grid",
        ),
        (
            ("model_seed = [1]\n", "model_seed = []\n"),
            "model_seed",
            "preset `tiny`'s grid",
        ),
    ] {
        let file = dir.path().join("empty.toml");
        assert!(STUDY.contains(edit.0), "the fixture has {}", edit.0);
        std::fs::write(&file, STUDY.replacen(edit.0, edit.1, 1)).unwrap();
        let (ok, stderr) = cli(&["sweep", file.to_str().unwrap(), "--dry-run"]);
        assert!(
            !ok && stderr.contains(&format!("{source} gives the axis `{axis}` no values")),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn conflicting_overrides_are_refused() {
    let mut overrides = Overrides::default();
    overrides.set("steps", Value::Integer(10)).unwrap();
    let error = overrides
        .set("steps", Value::Integer(20))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("conflicting overrides for `steps`"),
        "{error}"
    );
    overrides
        .set_axis("layers", vec![Value::Integer(12)])
        .unwrap();
    assert!(overrides.set("layers", Value::Integer(24)).is_err());
    let (ok, stderr) = cli(&[
        "sweep",
        "depth",
        "--steps",
        "10",
        "--set",
        "steps=20",
        "--dry-run",
    ]);
    assert!(
        !ok && stderr.contains("conflicting overrides for `steps`"),
        "{stderr}"
    );
    let (ok, stderr) = cli(&[
        "sweep",
        "depth",
        "--layers",
        "12",
        "--set",
        "layers=24",
        "--dry-run",
    ]);
    assert!(
        !ok && stderr.contains("conflicting overrides for `layers`"),
        "{stderr}"
    );
    let bad = RunConfig {
        checkpoint_every: 5,
        log_every: 2,
        ..tiny_config("haares")
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("multiple of `log_every`")
    );
    let bad = RunConfig {
        seq_len: 600,
        ..tiny_config("haares")
    };
    assert!(bad.validate().unwrap_err().to_string().contains("seq_len"));
}

#[test]
fn an_unwritable_runs_directory_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let error = check_writable(&file.join("depth")).unwrap_err();
    assert!(matches!(error, TrainError::Io { .. }), "{error}");
    assert!(error.to_string().contains("a-file"), "{error}");
    let runs = file.to_str().unwrap();
    let (ok, stderr) = cli(&["sweep", "depth", "--runs-dir", runs, "--quiet"]);
    assert!(!ok && stderr.contains("cannot access"), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn a_corrupt_or_mismatched_checkpoint_is_refused_on_resume_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let config = tiny_config("haares");
    let run_dir = dir.path().join("run");
    assert!(run(&config, &data, &run_dir, Some(2)).is_ok());
    let model = run_dir.join("checkpoint/model.safetensors");

    // Another configuration.
    let other = RunConfig {
        d_model: 32,
        ..config.clone()
    };
    let error = run(&other, &data, &run_dir, None).unwrap_err().to_string();
    assert!(
        error.contains("another configuration") && error.contains("d_model: 16 ≠ 32"),
        "{error}"
    );

    // A corrupt model file.
    std::fs::write(&model, b"not a safetensors file").unwrap();
    let error = run(&config, &data, &run_dir, None).unwrap_err().to_string();
    assert!(
        error.contains("unreadable model") && error.contains("delete the run directory"),
        "{error}"
    );
    assert_eq!(
        std::fs::read(&model).unwrap(),
        b"not a safetensors file",
        "nothing overwritten"
    );
    assert!(!run_dir.join("summary.json").exists());

    // A checkpoint of another method in place of this run's model.
    let block = dir.path().join("block");
    train_to_end(&tiny_config("block-attnres"), &data, &block);
    std::fs::copy(block.join("checkpoint/model.safetensors"), &model).unwrap();
    let error = run(&config, &data, &run_dir, None).unwrap_err().to_string();
    assert!(error.contains("checkpoint"), "{error}");
}

/// A placement per device that makes no sense is refused before anything trains.
#[test]
fn a_placement_per_device_needs_gpus_named_and_at_least_one_run_each() {
    let dir = tempfile::tempdir().unwrap();
    let runs_dir = dir.path().to_str().unwrap();
    let sweep = |extra: &[&str]| {
        let mut args = vec![
            "sweep",
            "depth",
            "--runs-dir",
            runs_dir,
            "--backend",
            "ndarray",
            "--quiet",
        ];
        args.extend(extra);
        cli(&args)
    };
    let (ok, stderr) = sweep(&["--runs-per-device", "1", "--devices", "2"]);
    assert!(
        !ok && stderr.contains("--runs-per-device places runs on GPUs")
            && stderr.contains("use --jobs N"),
        "{stderr}"
    );
    let (ok, stderr) = sweep(&["--runs-per-device", "0"]);
    assert!(!ok && stderr.contains("at least 1"), "{stderr}");
    assert!(
        !dir.path().join("depth").join("report.md").exists(),
        "nothing trained, nothing reported"
    );
}
