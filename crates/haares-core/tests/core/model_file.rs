//! Model files as untrusted input (docs/checkpoint-format.md, "What a loader checks"): a config
//! that lies is refused before a model is allocated, with the first disagreement named; NaN and
//! infinite values are refused unless asked for; F16 and BF16 files load.

use std::collections::HashMap;

use burn::module::Param;
use burn::tensor::{Tensor, TensorData, bf16, f16};
use haares_core::checkpoint::{CONFIG_METADATA_KEY, serialize_named_tensors};
use haares_core::{HaaresModel, LoadOptions, ModelConfig, ResidualMethod, limits};
use safetensors::{Dtype, tensor::TensorView};

use crate::common::*;

/// A file holding `params` under `config`'s metadata (which need not describe them).
fn file_of(config: &ModelConfig, params: &HashMap<String, TensorData>) -> Vec<u8> {
    let metadata = HashMap::from([(
        CONFIG_METADATA_KEY.to_string(),
        serde_json::to_string(config).unwrap(),
    )]);
    serialize_named_tensors(params.clone().into_iter().collect(), metadata).unwrap()
}

/// `config` with `edit` applied (its required sizes have no `with_` setters).
fn edited(config: &ModelConfig, edit: impl FnOnce(&mut ModelConfig)) -> ModelConfig {
    let mut config = config.clone();
    edit(&mut config);
    config
}

fn load_error(bytes: &[u8]) -> String {
    match HaaresModel::<B64>::from_safetensors_bytes(bytes, &Default::default()) {
        Ok(_) => panic!("the file loaded"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn the_layout_a_config_implies_is_the_models_own() {
    for method in all_methods() {
        let config = tiny_config(method, 3, 3);
        let model = config.init::<B64>(&Default::default()).unwrap();
        let layout = config.checkpoint_layout();
        let mut visited = Vec::new();
        let mut names = NameRecorder(&mut visited);
        model.clone().visit_named_params(&mut names);
        let layout_names: Vec<&str> = layout.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(layout_names, visited, "{method}: the visiting order");
        let as_map: std::collections::BTreeMap<String, Vec<usize>> = layout.into_iter().collect();
        assert_eq!(as_map, model.checkpoint_shapes(), "{method}");
    }
}

#[test]
fn every_parameter_but_the_documented_ones_receives_a_gradient() {
    let device = Default::default();
    let mut rng = Rng::new(76);
    for method in all_methods() {
        for (layers, blocks) in [(2, 2), (2, 1), (2, 4), (3, 3)] {
            let config = tiny_config(method, layers, blocks);
            let model = model_on::<Ad64>(&config, &random_params(&config, rng.next_u64()), &device);
            let tokens = token_tensor::<Ad64>(&random_tokens(&mut rng, 2, 6, 23), &device);
            let grads = model.forward(tokens).unwrap().sum().backward();
            let mut without = Vec::new();
            model
                .clone()
                .visit_named_params(&mut WithoutGradient(&grads, &mut without));
            assert_eq!(
                without,
                config.parameters_without_gradient(),
                "{method}, {layers} layers, {blocks} blocks"
            );
        }
    }
}

type Grads = <Ad64 as burn::tensor::backend::AutodiffBackend>::Gradients;

/// Names the parameters `grads` holds no gradient for.
struct WithoutGradient<'a>(&'a Grads, &'a mut Vec<String>);

impl WithoutGradient<'_> {
    fn check<const D: usize>(&mut self, name: String, param: &Param<Tensor<Ad64, D>>) {
        if param.val().grad(self.0).is_none() {
            self.1.push(name);
        }
    }
}

impl haares_core::checkpoint::ParamVisitor<Ad64> for WithoutGradient<'_> {
    fn vector(&mut self, name: String, param: &mut Param<Tensor<Ad64, 1>>) {
        self.check(name, param);
    }
    fn linear(&mut self, name: String, param: &mut Param<Tensor<Ad64, 2>>) {
        self.check(name, param);
    }
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<Ad64, 2>>) {
        self.check(name, param);
    }
}

struct NameRecorder<'a>(&'a mut Vec<String>);

impl<B: burn::tensor::backend::Backend> haares_core::checkpoint::ParamVisitor<B>
    for NameRecorder<'_>
{
    fn vector(&mut self, name: String, _: &mut Param<Tensor<B, 1>>) {
        self.0.push(name);
    }
    fn linear(&mut self, name: String, _: &mut Param<Tensor<B, 2>>) {
        self.0.push(name);
    }
    fn matrix(&mut self, name: String, _: &mut Param<Tensor<B, 2>>) {
        self.0.push(name);
    }
}

#[test]
fn a_config_beyond_a_bound_is_refused_naming_the_field_and_the_bound() {
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let params = random_params(&config, 71);
    let cases = [
        (
            "n_layers",
            edited(&config, |c| c.n_layers = 100_000),
            limits::MAX_LAYERS,
        ),
        (
            "d_model",
            edited(&config, |c| c.d_model = 1 << 16),
            limits::MAX_WIDTH,
        ),
        (
            "vocab_size",
            edited(&config, |c| c.vocab_size = 1 << 30),
            limits::MAX_VOCAB,
        ),
        (
            "d_ff",
            edited(&config, |c| c.d_ff = 1 << 20),
            limits::MAX_FF_WIDTH,
        ),
        (
            "n_heads",
            edited(&config, |c| c.d_model = 4096).with_n_heads(2048),
            limits::MAX_HEADS,
        ),
        (
            "max_seq_len",
            config.clone().with_max_seq_len(1 << 21),
            limits::MAX_CONTEXT,
        ),
        (
            "max_seq_len",
            edited(&config, |c| c.d_model = 128).with_max_seq_len(1 << 20),
            limits::MAX_ROTARY_TABLE,
        ),
    ];
    for (field, lying, bound) in cases {
        let error = load_error(&file_of(&lying, &params));
        assert!(
            error.contains(&format!("field `{field}`")) && error.contains(&bound.to_string()),
            "{field}: {error}"
        );
    }
    // A million layers at width 2^20: refused at once, not after thrashing.
    let absurd = edited(&config, |c| {
        c.n_layers = 1 << 20;
        c.d_model = 1 << 20;
    });
    assert!(load_error(&file_of(&absurd, &params)).contains("above the bound"));
}

#[test]
fn a_config_within_bounds_is_checked_against_the_tensors_before_allocating() {
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let params = random_params(&config, 72);

    // More layers than the file holds: the counts, then the first tensor the file lacks.
    let deeper = edited(&config, |c| c.n_layers = 1000).with_blocks(4);
    let error = load_error(&file_of(&deeper, &params));
    let implied: usize = deeper
        .checkpoint_layout()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    let held: usize = params.values().map(|d| d.num_elements()).sum();
    assert!(
        error.contains(&format!("implies {implied} parameters"))
            && error.contains(&format!("the file holds {held}"))
            && error.contains("tensor `layers.2.attn_norm.weight` is missing"),
        "{error}"
    );

    // A wider model: the embedding is the first disagreement, with both shapes.
    let wider = edited(&config, |c| c.d_model = 4096).with_n_heads(8);
    let error = load_error(&file_of(&wider, &params));
    assert!(
        error.contains(
            "tensor `embed.weight`: the config implies shape [23, 4096], the file holds [23, 16]"
        ),
        "{error}"
    );

    // A vocabulary at the bound: refused by its shape, nothing allocated for it (the heap is
    // measured in haares-bench's tests/bench/model_file_memory.rs).
    let larger = edited(&config, |c| c.vocab_size = limits::MAX_VOCAB);
    let error = load_error(&file_of(&larger, &params));
    assert!(
        error.contains("tensor `embed.weight`: the config implies shape [2097152, 16]"),
        "{error}"
    );

    // Another method: the counts agree up to the routers, the first router is named.
    let standard = config.clone().with_method(ResidualMethod::Standard);
    let error = load_error(&file_of(&standard, &params));
    assert!(
        error.contains("is not a parameter of a `standard` model"),
        "{error}"
    );
}

#[test]
fn non_finite_weights_are_refused_by_default_and_load_when_asked() {
    let config = tiny_config(ResidualMethod::BlockAttnRes, 2, 2);
    let mut params = random_params(&config, 73);
    let mut values = params["layers.1.attn.wv.weight"].to_vec::<f64>().unwrap();
    values[3] = f64::NAN;
    values[7] = f64::INFINITY;
    params.insert(
        "layers.1.attn.wv.weight".into(),
        TensorData::new(values, [16, 16]),
    );
    let bytes = file_of(&config, &params);

    let error = load_error(&bytes);
    assert!(
        error.contains("`layers.1.attn.wv.weight` (2 of 256 values)")
            && error.contains("--allow-non-finite"),
        "{error}"
    );
    let allowed = LoadOptions {
        allow_non_finite: true,
    };
    let model =
        HaaresModel::<B64>::from_safetensors_bytes_with(&bytes, &Default::default(), allowed)
            .expect("loads when asked");
    let out = logits(&model, &[vec![1, 2, 3]]);
    assert!(out.iter().any(|v| v.is_nan()), "the NaN reaches the logits");
}

/// `params` as a file of `dtype` (F16 or BF16), and the f64 values that file holds.
fn half_file(
    config: &ModelConfig,
    params: &HashMap<String, TensorData>,
    dtype: Dtype,
) -> (Vec<u8>, HashMap<String, TensorData>) {
    let round = |v: f64| -> (f64, [u8; 2]) {
        match dtype {
            Dtype::F16 => (f16::from_f64(v).to_f64(), f16::from_f64(v).to_le_bytes()),
            _ => (bf16::from_f64(v).to_f64(), bf16::from_f64(v).to_le_bytes()),
        }
    };
    let mut rounded = HashMap::new();
    let mut encoded = Vec::new();
    for (name, data) in params {
        let (values, bytes): (Vec<f64>, Vec<[u8; 2]>) =
            data.to_vec::<f64>().unwrap().into_iter().map(round).unzip();
        rounded.insert(name.clone(), TensorData::new(values, data.shape.clone()));
        encoded.push((name.clone(), data.shape.to_vec(), bytes.concat()));
    }
    let views: Vec<(&str, TensorView<'_>)> = encoded
        .iter()
        .map(|(name, shape, bytes)| {
            (
                name.as_str(),
                TensorView::new(dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    let metadata = HashMap::from([(
        CONFIG_METADATA_KEY.to_string(),
        serde_json::to_string(config).unwrap(),
    )]);
    (
        safetensors::serialize(views, Some(metadata)).unwrap(),
        rounded,
    )
}

#[test]
fn f16_and_bf16_files_load_as_the_values_they_hold() {
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let params = random_params(&config, 74);
    let tokens = vec![vec![3, 1, 4, 1, 5, 9]];
    for dtype in [Dtype::F16, Dtype::BF16] {
        let (bytes, rounded) = half_file(&config, &params, dtype);
        let loaded = HaaresModel::<B64>::from_safetensors_bytes(&bytes, &Default::default())
            .unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
        assert_eq!(
            logits(&loaded, &tokens),
            logits(&model_from(&config, &rounded), &tokens),
            "{dtype:?}: the file's values, widened exactly"
        );
        assert_ne!(
            rounded, params,
            "{dtype:?} rounds the f64 values (the test can tell)"
        );
    }
}

#[test]
fn a_dtype_no_model_holds_is_named() {
    let config = tiny_config(ResidualMethod::Standard, 1, 1);
    let params = random_params(&config, 75);
    let mut encoded: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, data) in &params {
        let (dtype, bytes) = match name.as_str() {
            "final_norm.weight" => (Dtype::I32, vec![0u8; 4 * data.num_elements()]),
            _ => (
                Dtype::F64,
                data.to_vec::<f64>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        };
        encoded.push((name.clone(), dtype, data.shape.to_vec(), bytes));
    }
    let views: Vec<(&str, TensorView<'_>)> = encoded
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let metadata = HashMap::from([(
        CONFIG_METADATA_KEY.to_string(),
        serde_json::to_string(&config).unwrap(),
    )]);
    let bytes = safetensors::serialize(views, Some(metadata)).unwrap();
    let error = load_error(&bytes);
    assert!(
        error.contains("tensor `final_norm.weight` has dtype I32"),
        "{error}"
    );
}
