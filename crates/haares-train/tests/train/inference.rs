//! `eval` reproduces a run's own endpoint from its best model; `sample` generates text.

use burn::tensor::TensorData;
use haares_base::SplitMix64;
use haares_core::checkpoint::{deserialize_named_tensors, serialize_named_tensors};
use haares_train::backend::BackendJob;
use haares_train::inference::{EvalJob, ModelSource, SampleJob, choose};

use crate::common::{B, cli, paths, sotu, tiny_config, train_to_end};

#[test]
fn eval_of_a_run_reproduces_its_best_validation_loss_and_sample_continues_a_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let run_dir = dir.path().join("run");
    let summary = train_to_end(&tiny_config("haares"), &data, &run_dir);

    let eval = EvalJob {
        source: ModelSource::resolve(&run_dir).unwrap(),
        dataset: None,
        chunks: Some(4),
        paths: paths(dir.path()),
    };
    let (loss, chunks) = eval
        .run::<B>(Default::default(), "ndarray".parse().unwrap())
        .unwrap();
    assert_eq!(chunks, 4);
    assert!(
        (loss - summary.best_val_loss).abs() < 1e-6,
        "{loss} vs {}",
        summary.best_val_loss
    );

    let sample = |seed| SampleJob {
        source: ModelSource::resolve(&run_dir.join("checkpoint/model.safetensors")).unwrap(),
        prompt: "The Union".into(),
        tokens: 12,
        temperature: 1.0,
        top_k: 5,
        seed,
    };
    let text = sample(3)
        .run::<B>(Default::default(), "ndarray".parse().unwrap())
        .unwrap();
    assert_eq!(text.chars().count(), 12, "{text:?}");
    let again = sample(3)
        .run::<B>(Default::default(), "ndarray".parse().unwrap())
        .unwrap();
    assert_eq!(text, again, "the same seed gives the same text");

    let missing = ModelSource::resolve(&dir.path().join("nothing"))
        .err()
        .unwrap()
        .to_string();
    assert!(missing.contains("does not exist"), "{missing}");

    // A NaN in the best model: `eval` names the tensor and fails, unless asked to go on.
    let best = run_dir.join("best-model.safetensors");
    let bytes = std::fs::read(&best).unwrap();
    let (mut tensors, metadata) = deserialize_named_tensors(&bytes).unwrap();
    let name = "layers.0.mlp.w_up.weight";
    let mut values = tensors[name].to_vec::<f32>().unwrap();
    values[0] = f32::NAN;
    let shape = tensors[name].shape.clone();
    tensors.insert(name.into(), TensorData::new(values, shape));
    let damaged = serialize_named_tensors(tensors.into_iter().collect(), metadata).unwrap();
    std::fs::write(&best, damaged).unwrap();
    let (data_dir, cache_dir) = (dir.path().join("data"), dir.path().join("cache"));
    let eval_args = |extra: &'static [&'static str]| {
        let mut args = vec!["eval", run_dir.to_str().unwrap(), "--backend", "ndarray"];
        args.extend([
            "--offline",
            "--chunks",
            "2",
            "--data-dir",
            data_dir.to_str().unwrap(),
        ]);
        args.extend(["--cache-dir", cache_dir.to_str().unwrap()]);
        args.extend(extra);
        cli(&args)
    };
    let (ok, stderr) = eval_args(&[]);
    assert!(!ok, "a NaN model is refused");
    assert!(
        stderr.contains(&format!("`{name}` (1 of ")) && stderr.contains("--allow-non-finite"),
        "{stderr}"
    );
    let (ok, stderr) = eval_args(&["--allow-non-finite"]);
    assert!(ok, "--allow-non-finite evaluates it: {stderr}");
}

#[test]
fn sampling_respects_temperature_and_top_k() {
    let logits = [0.1f32, 2.0, -1.0, 1.9, 0.0];
    let mut rng = SplitMix64::new(9);
    assert_eq!(
        choose(&logits, 0.0, 0, &mut rng),
        1,
        "temperature 0 is greedy"
    );
    assert_eq!(
        choose(&logits, 5.0, 1, &mut rng),
        1,
        "top-1 is greedy at any temperature"
    );
    let mut counts = [0usize; 5];
    for _ in 0..4000 {
        counts[choose(&logits, 1.0, 2, &mut rng)] += 1;
    }
    assert_eq!(
        counts[0] + counts[2] + counts[4],
        0,
        "only the two most likely ids: {counts:?}"
    );
    // softmax over {2.0, 1.9}: p(1) = 1 / (1 + e^−0.1) ≈ 0.525.
    let share = counts[1] as f64 / 4000.0;
    assert!((share - 0.525).abs() < 0.03, "{share}");
}
