//! Shared test fixtures: explicitly seeded random weights (never the backend's global RNG, which
//! races between parallel tests), tiny configurations and helpers.

use std::collections::HashMap;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Int, Tensor, TensorData};
use haares_base::SplitMix64;
use haares_core::{HaaresModel, HaaresOptions, ModelConfig, ResidualMethod};

pub type B64 = NdArray<f64>;
pub type Ad64 = Autodiff<NdArray<f64>>;

/// SplitMix64 with Box–Muller normals: deterministic test data from a seed.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    pub fn uniform(&mut self) -> f64 {
        self.0.next_f64()
    }
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f64> {
        (0..n).map(|_| self.normal() * std).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Every method and ablation the model supports.
pub fn all_methods() -> Vec<ResidualMethod> {
    vec![
        ResidualMethod::Standard,
        ResidualMethod::ReZero,
        ResidualMethod::LayerScale { init: None },
        ResidualMethod::BlockAttnRes,
        ResidualMethod::haares(),
        ResidualMethod::Haares(HaaresOptions::duplicated_cumulative()),
        ResidualMethod::Haares(HaaresOptions::random_signs(7)),
        ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(0.0)),
        ResidualMethod::Haares(HaaresOptions::without_rms_match()),
    ]
}

/// A tiny model: vocabulary 23, d = 16, d_ff = 24, 2 heads of width 8.
pub fn tiny_config(method: ResidualMethod, n_layers: usize, blocks: usize) -> ModelConfig {
    ModelConfig::new(23, 16, 24, n_layers)
        .with_n_heads(2)
        .with_blocks(blocks)
        .with_max_seq_len(16)
        .with_method(method)
}

/// Random weights for every parameter of `config`, in checkpoint names and layout. Queries,
/// biases, gates and norm weights are all perturbed so that no routing path is trivial.
pub fn random_params(config: &ModelConfig, seed: u64) -> HashMap<String, TensorData> {
    random_params_for::<B64>(config, seed, &Default::default())
}

/// [`random_params`], taking the shapes from a model built on backend `B`.
pub fn random_params_for<B: burn::tensor::backend::Backend>(
    config: &ModelConfig,
    seed: u64,
    device: &B::Device,
) -> HashMap<String, TensorData> {
    let shapes = config
        .init::<B>(device)
        .expect("valid test config")
        .checkpoint_shapes();
    let mut rng = Rng::new(seed);
    shapes
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let (offset, std) = if name.ends_with("norm.weight") {
                (1.0, 0.2)
            } else if name.ends_with("detail_bias") {
                (-1.0, 0.5)
            } else if name.ends_with("query") || name.ends_with("gate") || name.ends_with("scale") {
                (0.0, 0.7)
            } else {
                (0.0, 0.3)
            };
            let values: Vec<f64> = rng
                .normals(n, std)
                .into_iter()
                .map(|v| v + offset)
                .collect();
            (name, TensorData::new(values, shape))
        })
        .collect()
}

pub fn random_tokens(rng: &mut Rng, batch: usize, seq: usize, vocab: usize) -> Vec<Vec<usize>> {
    (0..batch)
        .map(|_| (0..seq).map(|_| rng.below(vocab)).collect())
        .collect()
}

pub fn token_tensor<B: burn::tensor::backend::Backend>(
    tokens: &[Vec<usize>],
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let (batch, seq) = (tokens.len(), tokens[0].len());
    let flat: Vec<i64> = tokens.iter().flatten().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(flat, [batch, seq]), device)
}

pub fn model_from(config: &ModelConfig, params: &HashMap<String, TensorData>) -> HaaresModel<B64> {
    model_on::<B64>(config, params, &Default::default())
}

pub fn logits(model: &HaaresModel<B64>, tokens: &[Vec<usize>]) -> Vec<f64> {
    logits_on(model, tokens, &Default::default())
}

/// [`model_from`] on any backend (parameters converted to its float type).
pub fn model_on<B: burn::tensor::backend::Backend>(
    config: &ModelConfig,
    params: &HashMap<String, TensorData>,
    device: &B::Device,
) -> HaaresModel<B> {
    HaaresModel::from_named_tensors(config, params.clone(), device)
        .expect("parameters match the config")
}

/// [`logits`] on any backend, as f64.
pub fn logits_on<B: haares_core::HaaresBackend>(
    model: &HaaresModel<B>,
    tokens: &[Vec<usize>],
    device: &B::Device,
) -> Vec<f64> {
    tensor_values(
        model
            .forward(token_tensor::<B>(tokens, device))
            .expect("valid tokens"),
    )
}

/// Causality for every method (docs/decisions.md, decision 1): changing the tokens after position t
/// moves no logit at positions ≤ t by more than `tolerance`, and visibly moves the later ones.
pub fn check_causality<B: haares_core::HaaresBackend>(device: &B::Device, tolerance: f64) {
    let (seq, t) = (8, 3);
    let mut rng = Rng::new(51);
    for method in all_methods() {
        let config = tiny_config(method, 4, 4);
        let params = random_params_for::<B>(&config, rng.next_u64(), device);
        let model = model_on::<B>(&config, &params, device);
        let original = random_tokens(&mut rng, 2, seq, config.vocab_size);
        let mut changed = original.clone();
        for row in changed.iter_mut() {
            for token in row[t + 1..].iter_mut() {
                *token = (*token + 1 + rng.below(config.vocab_size - 1)) % config.vocab_size;
            }
        }
        let (a, b) = (
            logits_on(&model, &original, device),
            logits_on(&model, &changed, device),
        );
        let vocab = config.vocab_size;
        for row in 0..2 {
            let past = |x: &[f64]| x[row * seq * vocab..(row * seq + t + 1) * vocab].to_vec();
            let future =
                |x: &[f64]| x[(row * seq + t + 1) * vocab..(row + 1) * seq * vocab].to_vec();
            assert!(
                max_abs_diff(&past(&a), &past(&b)) < tolerance,
                "{} on {}: past logits moved",
                method.name(),
                B::name(device)
            );
            assert!(
                max_abs_diff(&future(&a), &future(&b)) > 1e-3,
                "{}: the change must be visible later",
                method.name()
            );
        }
    }
}

pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// `max |a − b| ≤ relative · max(max |b|, 1)`.
pub fn assert_close_at_scale(actual: &[f64], expected: &[f64], relative: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(actual, expected);
    assert!(
        diff <= relative * scale,
        "{what}: max difference {diff:e} at scale {scale:e}"
    );
}

pub fn tensor_values<B: burn::tensor::backend::Backend, const D: usize>(
    tensor: Tensor<B, D>,
) -> Vec<f64> {
    tensor.into_data().convert::<f64>().to_vec::<f64>().unwrap()
}

/// A `[rows, cols]` matrix of normals with standard deviation 1 on `B`'s default device.
pub fn random_matrix<B: burn::tensor::backend::Backend>(
    rng: &mut Rng,
    shape: [usize; 2],
) -> Tensor<B, 2> {
    let values = rng.normals(shape[0] * shape[1], 1.0);
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// `count` random `[tokens, d]` slots, cycling through the layouts a slot can arrive in:
/// contiguous, a transposed view, and a view narrowed out of wider rows.
pub fn random_slot_views<B: burn::tensor::backend::Backend>(
    rng: &mut Rng,
    count: usize,
    tokens: usize,
    d: usize,
) -> Vec<Tensor<B, 2>> {
    (0..count)
        .map(|slot| match slot % 3 {
            1 => random_matrix(rng, [d, tokens]).transpose(),
            2 => random_matrix(rng, [tokens, d + 3]).narrow(1, 2, d),
            _ => random_matrix(rng, [tokens, d]),
        })
        .collect()
}

pub fn tensor<B: burn::tensor::backend::Backend, const D: usize>(
    values: Vec<f64>,
    shape: [usize; D],
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// `|a − b| ≤ max(tolerance · |b|, absolute)` for every element.
pub fn assert_close(actual: &[f64], expected: &[f64], tolerance: f64, absolute: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (at, (a, b)) in actual.iter().zip(expected).enumerate() {
        let bound = (tolerance * b.abs()).max(absolute);
        assert!(
            (a - b).abs() <= bound,
            "{what}: element {at} is {a:e}, expected {b:e} (bound {bound:e})"
        );
    }
}

/// `max |a − b| ≤ tolerance · max(max |b|, floor)`: for results that cancel, compared at the
/// tensor's scale.
pub fn assert_within_scale(
    actual: &[f64],
    expected: &[f64],
    tolerance: f64,
    floor: f64,
    what: &str,
) {
    let scale = expected.iter().fold(floor, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(actual, expected);
    assert!(
        diff <= tolerance * scale,
        "{what}: max difference {diff:e} at scale {scale:e}"
    );
}

/// `Σ w ⊙ output` for random `w` drawn from `seed`, so that every output element's gradient
/// differs.
pub fn weighted_total<B: burn::tensor::backend::Backend, const D: usize>(
    output: Tensor<B, D>,
    seed: u64,
) -> Tensor<B, 1> {
    let shape = output.dims();
    let weights = Rng::new(seed).normals(shape.iter().product(), 1.0);
    (output * tensor::<B, D>(weights, shape)).sum()
}

pub fn gradient<B: burn::tensor::backend::AutodiffBackend, const D: usize>(
    tensor: &Tensor<B, D>,
    grads: &B::Gradients,
) -> Vec<f64> {
    tensor_values(tensor.grad(grads).expect("a tracked input has a gradient"))
}

/// A `shape` tensor of f32 normals of spread `std` drawn from `rng`, on the default device.
#[allow(dead_code)] // the portability suite's read checks
pub fn random_on<B: burn::tensor::backend::Backend, const D: usize>(
    rng: &mut Rng,
    shape: [usize; D],
    std: f64,
) -> Tensor<B, D> {
    let count = shape.iter().product();
    let values: Vec<f32> = rng
        .normals(count, std)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// This crate's directory in the checkout under test: cargo's `CARGO_MANIFEST_DIR` when it runs the
/// test, else the one compiled in. A test binary is reused from a shared target directory by
/// another checkout of the same sources, and the compiled-in path would then read the first
/// checkout's files.
#[allow(dead_code)] // not every test file reads the checkout
pub fn crate_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
