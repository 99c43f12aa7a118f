//! Data-parallel training: two NdArray replicas in one process against one device with the same
//! global batch, resumption, and bad setups.

use std::path::Path;

use haares_core::graph_gate::{self, GraphWork};
use haares_data::batching::BatchIterator;
use haares_train::RunConfig;
use haares_train::backend::BackendKind;
use haares_train::data::RunData;
use haares_train::error::TrainError;
use haares_train::run::data_parallel::resolve_devices;
use haares_train::run::learner::{Outcome, TrainOptions, init_model, train_on};
use haares_train::run::metrics::{MetricsLine, read_metrics};
use haares_train::run::optim::AdamW;
use haares_train::run::step::Replica;
use haares_train::run::summary::RunSummary;

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

/// Many short runs of two and four replicas, whose threads build graphs and run backward passes
/// side by side: each finishes (a lost gradient stops a run with `TrainError::LostGradient`) and
/// trains like one device. The replicas' lockstep leaves little overlap: without
/// `haares_core::graph_gate` in the step this passed 10 runs of 10 on the 2-core development
/// machine, so the test below, with free-running threads, is the one that catches a regression.
#[test]
fn many_short_data_parallel_runs_lose_no_gradient() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let mut config = config();
    config.steps = 4;
    (config.eval_every, config.checkpoint_every) = (4, 4);
    let single = dir.path().join("single");
    train_to_end(&config, &data, &single);
    let reference = read_metrics(&single.join("metrics.jsonl")).unwrap();
    for replicas in [2, 4] {
        for round in 0..4 {
            let run_dir = dir.path().join(format!("{replicas}-{round}"));
            let outcome = train_replicated(&config, &data, &run_dir, replicas, None);
            let outcome =
                outcome.unwrap_or_else(|e| panic!("{replicas} replicas, round {round}: {e}"));
            finished(outcome);
            let logs = read_metrics(&run_dir.join("metrics.jsonl")).unwrap();
            assert_same_logs(&logs, &reference, 1e-4);
        }
    }
}

/// Training steps on four threads at once, as `sweep --jobs 4` runs them, each through
/// [`Replica::step`]: every step passes the graph gate twice (building, backward) and none loses
/// a gradient. The gate's own stress test (haares-core's `tests/core/graph_gate.rs`) is the one
/// that shows the loss without it; training steps meet it far more rarely (without the gate,
/// 13 runs of this test, 4 and 8 threads, lost none), so here the gate's use is counted.
#[test]
fn training_steps_on_threads_at_once_go_through_the_gate_and_lose_no_gradient() {
    let passes = || GraphWork::ALL.map(graph_gate::passes_given);
    let before = passes();
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let config = tiny_config("haares");
    let model_config = config.model_config(data.tokenizer.vocab_size()).unwrap();
    std::thread::scope(|scope| {
        for seed in 0..4 {
            let (data, config, model_config) = (&data, &config, &model_config);
            scope.spawn(move || {
                let device = Default::default();
                let mut model = init_model::<B>(model_config, seed, &device).unwrap();
                let mut optimizer = AdamW::new(config.optimizer);
                let mut batches = BatchIterator::new(&data.train, 1, seed).unwrap();
                for step in 1..=200 {
                    let batch = batches.next_batch();
                    Replica::SOLE
                        .step(&mut model, &mut optimizer, &batch, 8, &device, |_| Ok(()))
                        .unwrap_or_else(|e| panic!("thread {seed}: {}", e.at_step(step)));
                }
            });
        }
    });
    let after = passes();
    for (work, (before, after)) in GraphWork::ALL.iter().zip(before.iter().zip(after)) {
        assert!(
            after - before >= 4 * 200,
            "{work:?}: {before} → {after} passes"
        );
    }
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
