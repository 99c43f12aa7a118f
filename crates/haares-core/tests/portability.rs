//! Portability: the core suite's numerical checks, generic over the backend, in f32 — the forward
//! pass of every method against the f64 reference (`core/reference.rs`), causality, and gradient
//! flow to every parameter. They run on NdArray always and on wgpu with `--features wgpu`
//! (any Vulkan, Metal or DX12 adapter; CI uses Mesa's software Vulkan, lavapipe).
//!
//! Its own test binary: NdArray<f32> must not share a process with the f64 suite (one CPU device,
//! one process-wide default float type).
#![allow(dead_code)] // the shared helpers serve the f64 suite too

#[path = "core/common.rs"]
mod common;
#[path = "core/reference.rs"]
mod reference;

use burn::backend::Autodiff;
use burn::module::Param;
use burn::tensor::Tensor;
use haares_core::checkpoint::ParamVisitor;
use haares_core::{RoutingBackend, TrainingBackend};

use common::*;
use reference::reference_logits;

/// f32 against f64: tolerance relative to the largest logit.
const TOLERANCE: f64 = 2e-4;

fn forward_matches_the_reference<B: RoutingBackend>(device: &B::Device) {
    let mut rng = Rng::new(77);
    // Even, odd and single-event blocks (m = 4, 3, 1).
    for (layers, blocks) in [(4, 2), (3, 2), (2, 4)] {
        for method in all_methods() {
            let config = tiny_config(method, layers, blocks);
            let params = random_params_for::<B>(&config, rng.next_u64(), device);
            let tokens = random_tokens(&mut rng, 2, 7, config.vocab_size);
            let expected = reference_logits(&config, &params, &tokens);
            let actual = logits_on(&model_on::<B>(&config, &params, device), &tokens, device);
            let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let diff = max_abs_diff(&expected, &actual);
            assert!(
                diff < TOLERANCE * scale,
                "{} (L = {layers}, N = {blocks}) on {}: max |module − reference| = {diff:e} (scale {scale:.2})",
                config.method.name(),
                B::name(device)
            );
        }
    }
}

/// Collects, per parameter, whether its gradient exists, is finite, and is nonzero.
struct GradientReport<'a, B: TrainingBackend> {
    grads: &'a B::Gradients,
    problems: Vec<String>,
}

impl<B: TrainingBackend> GradientReport<'_, B> {
    fn check<const D: usize>(&mut self, name: String, param: &Param<Tensor<B, D>>) {
        // The first read site's only slot is the embedding: a softmax over one slot is constant,
        // so its router gets a zero gradient, and its detail bias, which no slot uses, none
        // (core/routing.rs tests that exactly).
        let constant_site = name.starts_with("layers.0.attn_router.");
        match param.grad(self.grads) {
            None if constant_site => {}
            None => self.problems.push(format!("{name}: no gradient")),
            Some(grad) => {
                let values = tensor_values(grad);
                if values.iter().any(|v| !v.is_finite()) {
                    self.problems.push(format!("{name}: non-finite gradient"));
                } else if !constant_site && values.iter().all(|v| *v == 0.0) {
                    self.problems.push(format!("{name}: zero gradient"));
                }
            }
        }
    }
}

impl<B: TrainingBackend> ParamVisitor<B> for GradientReport<'_, B> {
    fn vector(&mut self, name: String, param: &mut Param<Tensor<B, 1>>) {
        self.check(name, param);
    }
    fn linear(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.check(name, param);
    }
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.check(name, param);
    }
}

fn gradients_reach_every_parameter<B: TrainingBackend>(device: &B::Device) {
    let mut rng = Rng::new(63);
    for method in all_methods() {
        let config = tiny_config(method, 4, 2);
        let mut model = model_on::<B>(
            &config,
            &random_params_for::<B>(&config, rng.next_u64(), device),
            device,
        );
        let tokens = token_tensor::<B>(&random_tokens(&mut rng, 2, 6, config.vocab_size), device);
        let grads = model
            .forward(tokens)
            .expect("valid tokens")
            .powi_scalar(2)
            .mean()
            .backward();
        let mut report = GradientReport::<B> {
            grads: &grads,
            problems: Vec::new(),
        };
        model.visit_named_params(&mut report);
        assert!(
            report.problems.is_empty(),
            "{} on {}: {:?}",
            method.name(),
            B::name(device),
            report.problems
        );
    }
}

fn every_check<B: TrainingBackend>(device: &B::Device) {
    forward_matches_the_reference::<B>(device);
    // Float kernels may tile differently, never mix positions: past logits move by rounding at most.
    check_causality::<B>(device, 1e-5);
    gradients_reach_every_parameter::<B>(device);
}

#[test]
fn ndarray_f32_passes_the_numerical_checks() {
    every_check::<Autodiff<burn::backend::NdArray<f32>>>(&Default::default());
}

/// With `--features wgpu` the checks must run: a missing adapter fails with how to get one, it is
/// never counted as a pass. The backend is the one the runners use: Burn's cube backend without
/// kernel fusion (Burn 0.21's fused kernels fail the reference check; docs/deviations.md).
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_passes_the_numerical_checks() {
    use burn::tensor::backend::Backend;
    let device = wgpu::device();
    let probe = std::panic::catch_unwind(|| {
        Tensor::<wgpu::Wgpu, 1>::zeros([1], &device).into_data();
    });
    assert!(
        probe.is_ok(),
        "no wgpu adapter: install a Vulkan driver (Debian: `apt-get install mesa-vulkan-drivers` \
         for the lavapipe software device) or run without `--features wgpu`"
    );
    println!("wgpu device: {}", <wgpu::Wgpu as Backend>::name(&device));
    every_check::<Autodiff<wgpu::Wgpu>>(&device);
}

#[cfg(feature = "wgpu")]
mod wgpu {
    //! The routing operator's CubeCL kernels against its plain tensor-operation primitives
    //! (`routing_ops::naive`) on the same device, on fresh random inputs: one slot to several
    //! launches' worth, widths below, between and above a cube's thread count, a row shared by
    //! all tokens and one per token, and strided (non-contiguous) inputs.
    use burn::backend::Autodiff;
    use burn::module::Param;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};
    use haares_core::router::DepthRouterConfig;
    use haares_core::routing_ops::naive;
    use haares_core::{DetailBias, RoutingBackend, SourceBank};

    use super::common::{Rng, max_abs_diff, tensor_values};

    pub type Wgpu =
        burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;

    pub fn device() -> burn::backend::wgpu::WgpuDevice {
        Default::default()
    }

    const SLOT_COUNTS: [usize; 5] = [1, 3, 16, 17, 40];
    /// (tokens, d): a single number, widths that do not divide the thread count, several strides.
    const SHAPES: [(usize, usize); 3] = [(1, 1), (37, 70), (130, 256)];

    fn random(rng: &mut Rng, shape: [usize; 2]) -> Tensor<Wgpu, 2> {
        random_on(rng, shape, 1.0)
    }

    fn random_on<B: Backend, const D: usize>(
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

    /// Slots stored contiguously, except every third, which is a transposed view.
    fn random_slots(rng: &mut Rng, count: usize, tokens: usize, d: usize) -> Vec<Tensor<Wgpu, 2>> {
        (0..count)
            .map(|slot| match slot % 3 {
                2 => random(rng, [d, tokens]).transpose(),
                _ => random(rng, [tokens, d]),
            })
            .collect()
    }

    fn assert_close(kernel: Tensor<Wgpu, 2>, plain: Tensor<Wgpu, 2>, what: String) {
        assert_eq!(kernel.dims(), plain.dims(), "{what}: shapes differ");
        let (kernel, plain) = (tensor_values(kernel), tensor_values(plain));
        let scale = plain.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&kernel, &plain);
        assert!(
            diff < 1e-5 * scale,
            "{what}: max |kernel − plain| = {diff:e} (scale {scale:.2})"
        );
    }

    #[test]
    fn row_dot_kernels_match_the_plain_primitive() {
        let mut rng = Rng::new(2024);
        for count in SLOT_COUNTS {
            for (tokens, d) in SHAPES {
                let slots = random_slots(&mut rng, count, tokens, d);
                for shared in [true, false] {
                    let rows = random(&mut rng, [if shared { 1 } else { tokens }, d]);
                    assert_close(
                        Wgpu::row_dots(&slots, rows.clone()),
                        naive::row_dots(&slots, rows),
                        format!("row_dots, S = {count}, {tokens} × {d}, shared row {shared}"),
                    );
                }
            }
        }
    }

    #[test]
    fn weighted_sum_kernels_match_the_plain_primitive() {
        let mut rng = Rng::new(2025);
        for count in SLOT_COUNTS {
            for (tokens, d) in SHAPES {
                let slots = random_slots(&mut rng, count, tokens, d);
                // The weights as a strided view: the right half of a wider tensor.
                let weights = random(&mut rng, [count, 2 * tokens]).narrow(1, tokens, tokens);
                assert_close(
                    Wgpu::weighted_sum(&slots, weights.clone()),
                    naive::weighted_sum(&slots, weights),
                    format!("weighted_sum, S = {count}, {tokens} × {d}"),
                );
            }
        }
    }

    /// The whole routing operator on the kernels, forward and backward: a fused read on
    /// `Autodiff<wgpu>` against the reference read on the same device, in its mixture, its
    /// weights and every gradient (each slot, the query, the key-norm weight, the detail bias),
    /// for one slot, a HAARES bank and the largest bank (97 slots: several kernel launches and
    /// autodiff nodes).
    #[test]
    fn the_operator_on_kernels_matches_the_reference_read_and_its_gradients() {
        type Ad = Autodiff<Wgpu>;
        let mut rng = Rng::new(2026);
        for pairs in [0, 4, 48] {
            let (batch, seq, d) = (2, 5, 24);
            let mut router = DepthRouterConfig::new(d)
                .with_detail_bias(Some(DetailBias::Learned { init: -2.0 }))
                .init::<Ad>(&device());
            router.query = Param::from_tensor(random_on(&mut rng, [d], 0.8).require_grad());
            router.key_norm.weight =
                Param::from_tensor((random_on::<Ad, 1>(&mut rng, [d], 0.3) + 1.0).require_grad());
            let values: Vec<Tensor<Ad, 3>> = (0..=2 * pairs)
                .map(|_| {
                    let std = 0.05 + 3.0 * rng.uniform();
                    random_on(&mut rng, [batch, seq, d], std).require_grad()
                })
                .collect();
            let mut bank = SourceBank::new(values[0].clone());
            for pair in values[1..].chunks(2) {
                bank.push_pair(pair[0].clone(), Some(pair[1].clone()));
            }
            let seed = rng.next_u64();
            let everything = |fused: bool| {
                let read = if fused {
                    router.forward_fused(&bank)
                } else {
                    router.forward(&bank)
                };
                let mut loss_rng = Rng::new(seed);
                let mixture_weights = random_on::<Ad, 3>(&mut loss_rng, read.mixture.dims(), 1.0);
                let weight_weights = random_on::<Ad, 3>(&mut loss_rng, read.weights.dims(), 1.0);
                let grads = ((read.mixture.clone() * mixture_weights).sum()
                    + (read.weights.clone() * weight_weights).sum())
                .backward();
                let mut all = vec![tensor_values(read.mixture), tensor_values(read.weights)];
                all.extend(
                    values
                        .iter()
                        .map(|v| tensor_values(v.grad(&grads).unwrap())),
                );
                all.push(tensor_values(router.query.val().grad(&grads).unwrap()));
                all.push(tensor_values(
                    router.key_norm.weight.val().grad(&grads).unwrap(),
                ));
                if pairs > 0 {
                    let bias = router.detail_bias.as_ref().unwrap().val();
                    all.push(tensor_values(bias.grad(&grads).unwrap()));
                }
                all
            };
            let (reference, fused) = (everything(false), everything(true));
            for (index, (expected, actual)) in reference.iter().zip(&fused).enumerate() {
                let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let diff = max_abs_diff(expected, actual);
                assert!(
                    diff < 1e-4 * scale,
                    "S = {}: entry {index} (mixture, weights, slots…, query, key norm, bias) \
                     differs by {diff:e} (scale {scale:.2})",
                    2 * pairs + 1
                );
            }
        }
    }
}
