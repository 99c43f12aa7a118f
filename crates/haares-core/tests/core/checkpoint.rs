//! Safetensors interop: round trip, the exact names and PyTorch layouts of
//! docs/checkpoint-format.md, and clear errors for bad files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::{Tensor, TensorData};
use haares_core::{HaaresError, HaaresModel, HaaresOptions, ModelConfig, ResidualMethod};

use crate::common::*;

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("haares-core-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn save_then_load_gives_identical_logits() {
    let mut rng = Rng::new(61);
    for method in all_methods() {
        let config = tiny_config(method, 2, 2);
        let model = model_from(&config, &random_params(&config, rng.next_u64()));
        let path = temp_path(&format!("{}.safetensors", method.name()));
        model.save_safetensors(&path).unwrap();
        let loaded = HaaresModel::<B64>::load_safetensors(&path, &Default::default()).unwrap();
        assert_eq!(loaded.config, config, "the config travels in the metadata");
        let tokens = random_tokens(&mut rng, 2, 5, config.vocab_size);
        assert_eq!(
            logits(&model, &tokens),
            logits(&loaded, &tokens),
            "{}",
            method.name()
        );
    }
}

fn expected_names(config: &ModelConfig) -> BTreeMap<String, Vec<usize>> {
    let (v, d, ff) = (config.vocab_size, config.d_model, config.d_ff);
    let mut names = BTreeMap::from([
        ("embed.weight".to_string(), vec![v, d]),
        ("final_norm.weight".to_string(), vec![d]),
    ]);
    let learned_bias = matches!(config.method.haares_options(), Some(o) if matches!(o.detail_bias, haares_core::DetailBias::Learned { .. }));
    for i in 0..config.n_layers {
        let mut add =
            |suffix: &str, shape: Vec<usize>| names.insert(format!("layers.{i}.{suffix}"), shape);
        add("attn_norm.weight", vec![d]);
        add("mlp_norm.weight", vec![d]);
        for w in ["wq", "wk", "wv", "wo"] {
            add(&format!("attn.{w}.weight"), vec![d, d]);
        }
        add("mlp.w_gate.weight", vec![ff, d]);
        add("mlp.w_up.weight", vec![ff, d]);
        add("mlp.w_down.weight", vec![d, ff]);
        for site in ["attn", "mlp"] {
            match config.method {
                ResidualMethod::BlockAttnRes | ResidualMethod::Haares(_) => {
                    add(&format!("{site}_router.query"), vec![d]);
                    add(&format!("{site}_router.key_norm.weight"), vec![d]);
                    if learned_bias {
                        add(&format!("{site}_router.detail_bias"), vec![1]);
                    }
                }
                ResidualMethod::ReZero => {
                    add(&format!("{site}_gate"), vec![1]);
                }
                ResidualMethod::LayerScale { .. } => {
                    add(&format!("{site}_scale"), vec![d]);
                }
                ResidualMethod::Standard => {}
            }
        }
    }
    if config.method.is_routed() {
        names.insert("final_router.query".into(), vec![d]);
        names.insert("final_router.key_norm.weight".into(), vec![d]);
    }
    names
}

#[test]
fn names_and_shapes_are_exactly_the_documented_ones() {
    for method in
        all_methods()
            .into_iter()
            .chain([ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(
                -4.0,
            ))])
    {
        let config = ModelConfig::new(19, 16, 40, 3)
            .with_n_heads(2)
            .with_blocks(3)
            .with_method(method);
        let model = config.init::<B64>(&Default::default()).unwrap();
        assert_eq!(
            model.checkpoint_shapes(),
            expected_names(&config),
            "{}",
            method.name()
        );
    }
}

#[test]
fn linear_weights_are_stored_out_by_in() {
    // A PyTorch user computes x @ W.T with the stored W; that must equal the module's projection.
    let config = tiny_config(ResidualMethod::Standard, 1, 1);
    let model = model_from(&config, &random_params(&config, 62));
    let tensors: std::collections::HashMap<_, _> = model.to_named_tensors().into_iter().collect();
    let w = tensors["layers.0.mlp.w_gate.weight"]
        .to_vec::<f64>()
        .unwrap(); // [24, 16]
    let x = Rng::new(63).normals(16, 1.0);
    let torch: Vec<f64> = w
        .chunks(16)
        .map(|row| row.iter().zip(&x).map(|(a, b)| a * b).sum())
        .collect();
    let input = Tensor::<B64, 3>::from_data(TensorData::new(x, [1, 1, 16]), &Default::default());
    let burn = tensor_values(model.layers[0].mlp.w_gate.forward(input));
    assert!(max_abs_diff(&torch, &burn) < 1e-12);
}

fn error_text(result: Result<HaaresModel<B64>, HaaresError>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn bad_checkpoints_give_clear_errors() {
    let device = Default::default();
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let params = random_params(&config, 64);

    let mut missing = params.clone();
    missing.remove("layers.1.mlp_router.detail_bias");
    assert!(
        error_text(HaaresModel::<B64>::from_named_tensors(
            &config, missing, &device
        ))
        .contains("`layers.1.mlp_router.detail_bias` is missing")
    );

    let mut reshaped = params.clone();
    reshaped.insert(
        "layers.0.attn.wq.weight".into(),
        TensorData::new(vec![0.0; 16 * 8], [8, 16]),
    );
    assert!(
        error_text(HaaresModel::<B64>::from_named_tensors(
            &config, reshaped, &device
        ))
        .contains("tensor `layers.0.attn.wq.weight`: the config implies shape [16, 16], the file holds [8, 16]")
    );

    let mut extra = params.clone();
    extra.insert("layers.0.attn_gate".into(), TensorData::new(vec![0.0], [1]));
    assert!(
        error_text(HaaresModel::<B64>::from_named_tensors(
            &config, extra, &device
        ))
        .contains("`layers.0.attn_gate` is not a parameter")
    );

    let not_haares =
        safetensors::serialize(Vec::<(&str, safetensors::tensor::TensorView)>::new(), None)
            .unwrap();
    assert!(
        error_text(HaaresModel::<B64>::from_safetensors_bytes(
            &not_haares,
            &device
        ))
        .contains("no `haares_config` metadata")
    );
    assert!(
        error_text(HaaresModel::<B64>::from_safetensors_bytes(
            b"not a safetensors file",
            &device
        ))
        .contains("invalid safetensors data")
    );

    let path = temp_path("does-not-exist.safetensors");
    assert!(
        error_text(HaaresModel::<B64>::load_safetensors(&path, &device))
            .contains("does-not-exist.safetensors")
    );
}

#[test]
fn saving_is_atomic() {
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let model = model_from(&config, &random_params(&config, 65));
    let path = temp_path("atomic.safetensors");
    std::fs::write(&path, b"previous checkpoint").unwrap();
    model.save_safetensors(&path).unwrap();
    let siblings: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("atomic") && n != "atomic.safetensors")
        .collect();
    assert!(
        siblings.is_empty(),
        "temporary files left behind: {siblings:?}"
    );
    // A save into a directory that does not exist fails cleanly and leaves nothing.
    let bad = temp_path("missing-dir").join("model.safetensors");
    assert!(model.save_safetensors(&bad).is_err());
    assert!(!bad.exists());
}
