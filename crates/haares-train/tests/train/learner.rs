//! The learner loop: every method trains end to end, a tiny batch is overfitted, a killed run
//! resumes to exactly the uninterrupted run, and a non-finite loss stops with the last good
//! checkpoint kept.

use haares_core::method::METHOD_NAMES;
use haares_train::TrainError;
use haares_train::run::checkpoint;
use haares_train::run::learner::Outcome;
use haares_train::run::metrics::read_metrics;

use crate::common::{repeating, run, sotu, tiny_config, train_to_end};

#[test]
fn every_method_trains_end_to_end_on_the_embedded_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    for method in METHOD_NAMES {
        let config = tiny_config(method);
        let run_dir = dir.path().join(method.replace('=', "_"));
        let summary = train_to_end(&config, &data, &run_dir);
        assert_eq!(summary.steps, 4, "{method}");
        assert_eq!(
            summary
                .val_curve
                .iter()
                .map(|(s, _)| *s)
                .collect::<Vec<_>>(),
            vec![2, 4],
            "{method}"
        );
        assert!(summary.best_val_loss.is_finite(), "{method}");
        assert_eq!(
            summary.products, "Burn's matmul",
            "{method}: NdArray's products, recorded"
        );
        let best = summary
            .val_curve
            .iter()
            .map(|(_, l)| *l)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(
            summary.best_val_loss, best,
            "{method}: the endpoint is the grid minimum"
        );
        // A fresh model predicts close to uniformly over the vocabulary.
        let uniform = (data.tokenizer.vocab_size() as f64).ln();
        assert!(
            (summary.val_curve[0].1 - uniform).abs() < 0.5,
            "{method}: {:?} vs ln V = {uniform}",
            summary.val_curve
        );
        for file in [
            "summary.json",
            "metrics.jsonl",
            "config.json",
            "tokenizer.json",
            "best-model.safetensors",
            "checkpoint/model.safetensors",
        ] {
            assert!(run_dir.join(file).is_file(), "{method}: {file} missing");
        }
        assert_eq!(
            read_metrics(&run_dir.join("metrics.jsonl")).unwrap().len(),
            4,
            "{method}: one line per step"
        );
    }
}

#[test]
fn a_tiny_repeated_batch_is_overfitted() {
    let dir = tempfile::tempdir().unwrap();
    let data = repeating(dir.path());
    let mut config = tiny_config("haares");
    config.steps = 60;
    config.eval_every = 60;
    config.checkpoint_every = 60;
    config.log_every = 10;
    config.optimizer.lr = 1e-2;
    train_to_end(&config, &data, &dir.path().join("run"));
    let lines = read_metrics(&dir.path().join("run/metrics.jsonl")).unwrap();
    let (first, last) = (
        lines[0].train_loss.unwrap(),
        lines.last().unwrap().train_loss.unwrap(),
    );
    assert!(
        last < 0.5 * first,
        "training loss {first} → {last} should at least halve"
    );
}

/// Burn 0.21's autodiff accumulates gradient contributions in an order that varies from run to
/// run, so two uninterrupted runs already differ by about 1e-6 relative: a resumed run must match
/// to that noise, far below what a lost optimizer state or data position would change (see
/// docs/deviations.md). The learning rate is raised so that such a bug shows within 12 steps.
#[test]
fn a_killed_run_resumes_to_the_uninterrupted_run_step_for_step() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let mut config = tiny_config("haares");
    config.steps = 12;
    config.eval_every = 3;
    config.checkpoint_every = 4;
    config.log_every = 2;
    config.optimizer.lr = 3e-3;

    let straight = dir.path().join("straight");
    let reference = train_to_end(&config, &data, &straight);

    let killed = dir.path().join("killed");
    // Killed after step 6: the checkpoint holds step 4, the metrics run to step 6.
    assert_eq!(
        run(&config, &data, &killed, Some(6)).unwrap(),
        Outcome::Stopped { step: 6 }
    );
    let state = std::fs::read_to_string(killed.join("checkpoint/state.json")).unwrap();
    assert!(state.contains("\"step\": 4"), "{state}");
    assert_eq!(
        read_metrics(&killed.join("metrics.jsonl"))
            .unwrap()
            .last()
            .unwrap()
            .step,
        6
    );
    let resumed = train_to_end(&config, &data, &killed);

    let (a, b) = (
        read_metrics(&killed.join("metrics.jsonl")).unwrap(),
        read_metrics(&straight.join("metrics.jsonl")).unwrap(),
    );
    assert_eq!(a.len(), b.len(), "the same lines: {a:?}");
    // Losses within 1e-5, gradient norms within 2e-4 (relative): 10x the spread of two
    // uninterrupted runs measured at these settings.
    let within = |x: Option<f64>, y: Option<f64>, tolerance: f64| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= tolerance * y.abs().max(1.0),
        (x, y) => x == y,
    };
    let close = |x, y| within(x, y, 1e-5);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.step, y.step);
        assert!(
            close(x.train_loss, y.train_loss),
            "step {}: {:?} vs {:?}",
            x.step,
            x.train_loss,
            y.train_loss
        );
        assert!(
            within(x.grad_norm, y.grad_norm, 2e-4),
            "step {}: {:?} vs {:?}",
            x.step,
            x.grad_norm,
            y.grad_norm
        );
        assert!(
            close(x.val_loss, y.val_loss),
            "step {}: {:?} vs {:?}",
            x.step,
            x.val_loss,
            y.val_loss
        );
    }
    let steps = |s: &haares_train::run::summary::RunSummary| {
        s.val_curve.iter().map(|(k, _)| *k).collect::<Vec<_>>()
    };
    assert_eq!(steps(&resumed), steps(&reference));
    assert_eq!(resumed.best_step, reference.best_step);
    assert!(close(
        Some(resumed.best_val_loss),
        Some(reference.best_val_loss)
    ));
    let position = |dir: &std::path::Path| {
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("checkpoint/state.json")).unwrap(),
        )
        .unwrap();
        (
            state["data_position"].clone(),
            state["optimizer_steps"].clone(),
        )
    };
    assert_eq!(
        position(&killed),
        position(&straight),
        "same data position and optimizer time"
    );
}

#[test]
fn a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let mut config = tiny_config("haares");
    config.steps = 20;
    config.checkpoint_every = 1;
    config.eval_every = 20;
    config.optimizer.lr = 1e30;
    config.optimizer.weight_decay = 0.0;
    let run_dir = dir.path().join("run");
    let error = run(&config, &data, &run_dir, None).unwrap_err();
    let TrainError::NonFinite { step, .. } = &error else {
        panic!("expected a non-finite-loss error, got {error}");
    };
    assert!(error.to_string().contains("NaN or infinite"), "{error}");
    let latest = checkpoint::latest(&run_dir).expect("a checkpoint is kept");
    let loaded =
        checkpoint::load::<crate::common::B>(&latest, &config, &Default::default()).unwrap();
    assert_eq!(
        loaded.state.step,
        *step - 1,
        "the kept checkpoint is the last step before the failure"
    );
    assert!(!run_dir.join("summary.json").exists());
}

#[test]
fn validation_loss_is_token_weighted_over_exactly_the_requested_chunks() {
    use haares_train::run::learner::init_model;
    use haares_train::run::loss::{validation_loss, validation_pass};
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let config = tiny_config("haares");
    let model_config = config.model_config(data.tokenizer.vocab_size()).unwrap();
    let device = Default::default();
    let model = init_model::<burn::backend::NdArray>(&model_config, 3, &device).unwrap();
    let rows = |batch: usize, chunks| {
        validation_pass(&data.validation, batch, Some(chunks))
            .map(|b| b.batch_size)
            .collect::<Vec<_>>()
    };
    assert_eq!(rows(8, 10), [8, 2]);
    assert_eq!(rows(5, 10), [5, 5]);
    let loss = |batch, chunks| {
        validation_loss(
            &model,
            validation_pass(&data.validation, batch, Some(chunks)),
            16,
            &device,
        )
    };
    let (a, b) = (loss(8, 10), loss(5, 10));
    assert!(
        (a - b).abs() < 1e-5,
        "the batch size must not change a token-weighted loss: {a} vs {b}"
    );
    assert!(
        (loss(8, 10) - loss(8, 16)).abs() > 1e-7,
        "more chunks, another loss"
    );
}

/// The fused router changes no result: a short run's losses on the fused path equal the
/// reference path's to float rounding (f32, eight AdamW steps), for both routed methods.
#[test]
fn the_fused_routing_path_trains_like_the_reference_path() {
    use haares_core::RoutingPath;
    let dir = tempfile::tempdir().unwrap();
    let data = repeating(dir.path());
    for method in ["block-attnres", "haares"] {
        let losses = |routing: RoutingPath| {
            let mut config = tiny_config(method);
            config.routing = routing;
            config.steps = 8;
            config.eval_every = 8;
            config.checkpoint_every = 8;
            config.log_every = 1;
            config.optimizer.lr = 1e-2;
            let run_dir = dir.path().join(format!("{method}-{routing:?}"));
            train_to_end(&config, &data, &run_dir);
            read_metrics(&run_dir.join("metrics.jsonl"))
                .unwrap()
                .iter()
                .map(|line| line.train_loss.unwrap())
                .collect::<Vec<f64>>()
        };
        let (reference, fused) = (losses(RoutingPath::Reference), losses(RoutingPath::Fused));
        assert_eq!(reference.len(), 8);
        for (step, (a, b)) in reference.iter().zip(&fused).enumerate() {
            assert!(
                (a - b).abs() < 1e-4 * a.abs(),
                "{method} step {step}: {a} vs {b}"
            );
        }
        assert!(
            reference[7] < reference[0],
            "{method}: the run must learn: {reference:?}"
        );
    }
}
