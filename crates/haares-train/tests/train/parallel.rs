//! Data-parallel training: two NdArray replicas in one process against one device with the same
//! global batch, resumption, and bad setups.

use std::path::Path;

use haares_train::RunConfig;
use haares_train::backend::BackendKind;
use haares_train::data::RunData;
use haares_train::error::TrainError;
use haares_train::run::data_parallel::resolve_devices;
use haares_train::run::learner::{Outcome, RunSummary, TrainOptions, train_on};
use haares_train::run::metrics::{MetricsLine, read_metrics};

use crate::common::{B, sotu, tiny_config, train_to_end};

fn train_replicated(
    config: &RunConfig,
    data: &RunData,
    run_dir: &Path,
    replicas: usize,
    stop_after: Option<usize>,
) -> haares_train::Result<Outcome> {
    let devices = resolve_devices::<B>(BackendKind::Ndarray, &[replicas])?;
    let options = TrainOptions {
        stop_after,
        ..TrainOptions::default()
    };
    train_on::<B>(config, data, run_dir, "ndarray", &devices, &options)
}

fn finished(outcome: Outcome) -> RunSummary {
    match outcome {
        Outcome::Finished(summary) => *summary,
        other => panic!("expected a finished run, got {other:?}"),
    }
}

fn config() -> RunConfig {
    let mut config = tiny_config("haares");
    config.batch_size = 4;
    config.steps = 6;
    config.eval_every = 3;
    config.checkpoint_every = 2;
    config.log_every = 1;
    config.optimizer.lr = 3e-3;
    config
}

/// Every logged value within `tolerance` (relative) of the other log's.
fn assert_same_logs(a: &[MetricsLine], b: &[MetricsLine], tolerance: f64) {
    assert_eq!(a.len(), b.len());
    let close = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= tolerance * y.abs().max(1.0),
        (x, y) => x == y,
    };
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.step, y.step);
        assert!(close(x.train_loss, y.train_loss), "{x:?} vs {y:?}");
        assert!(close(x.grad_norm, y.grad_norm), "{x:?} vs {y:?}");
        assert!(close(x.val_loss, y.val_loss), "{x:?} vs {y:?}");
    }
}

/// The largest difference between the parameters of two runs' last checkpoints.
fn parameter_difference(a: &Path, b: &Path) -> f64 {
    let load = |dir: &Path| {
        haares_core::HaaresModel::<burn::backend::NdArray>::load_safetensors(
            dir.join("checkpoint/model.safetensors"),
            &Default::default(),
        )
        .unwrap()
        .to_named_tensors()
    };
    let (a, b) = (load(a), load(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .flat_map(|((name_a, x), (name_b, y))| {
            assert_eq!(name_a, name_b);
            let (x, y) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
            x.into_iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs() as f64)
                .collect::<Vec<_>>()
        })
        .fold(0.0, f64::max)
}

#[test]
fn two_replicas_train_like_one_device_with_the_same_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let config = config();
    let single = dir.path().join("single");
    let one = train_to_end(&config, &data, &single);
    let double = dir.path().join("double");
    let two = finished(train_replicated(&config, &data, &double, 2, None).unwrap());
    let (a, b) = (
        read_metrics(&single.join("metrics.jsonl")).unwrap(),
        read_metrics(&double.join("metrics.jsonl")).unwrap(),
    );
    // Float rounding only: the two halves' gradients are summed instead of summed in one pass.
    assert_same_logs(&b, &a, 1e-4);
    assert_eq!(one.best_step, two.best_step);
    let difference = parameter_difference(&single, &double);
    assert!(difference < 1e-4, "parameters differ by {difference}");
    // Training happened (the comparison above is of runs that moved).
    assert!(a[0].grad_norm.unwrap() > 0.0);
}

#[test]
fn a_killed_data_parallel_run_resumes_to_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let config = config();
    let straight = dir.path().join("straight");
    finished(train_replicated(&config, &data, &straight, 2, None).unwrap());
    let killed = dir.path().join("killed");
    assert_eq!(
        train_replicated(&config, &data, &killed, 2, Some(3)).unwrap(),
        Outcome::Stopped { step: 3 }
    );
    finished(train_replicated(&config, &data, &killed, 2, None).unwrap());
    assert_same_logs(
        &read_metrics(&killed.join("metrics.jsonl")).unwrap(),
        &read_metrics(&straight.join("metrics.jsonl")).unwrap(),
        1e-4,
    );
    assert!(parameter_difference(&killed, &straight) < 1e-4);
}

#[test]
fn a_non_finite_loss_stops_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let mut config = config();
    config.steps = 20;
    config.optimizer.lr = 1e30;
    config.optimizer.weight_decay = 0.0;
    // Returns (no replica waits for ever) with the learner's error.
    let error = train_replicated(&config, &data, &dir.path().join("run"), 2, None).unwrap_err();
    assert!(matches!(error, TrainError::NonFinite { .. }), "{error}");
}

#[test]
fn bad_device_setups_are_refused_with_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let mut config = config();
    config.batch_size = 5;
    let error = train_replicated(&config, &data, &dir.path().join("run"), 2, None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("batch_size 5 does not split over 2 devices"),
        "{error}"
    );
    for bad in [&[0usize][..], &[1, 2]] {
        let error = resolve_devices::<B>(BackendKind::Ndarray, bad)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("takes one number, the count of replicas"),
            "{error}"
        );
    }
}
