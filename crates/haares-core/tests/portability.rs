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
    use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
    type Wgpu = CubeBackend<WgpuRuntime, f32, i32, u32>;
    let device = WgpuDevice::default();
    let probe = std::panic::catch_unwind(|| {
        Tensor::<Wgpu, 1>::zeros([1], &device).into_data();
    });
    assert!(
        probe.is_ok(),
        "no wgpu adapter: install a Vulkan driver (Debian: `apt-get install mesa-vulkan-drivers` \
         for the lavapipe software device) or run without `--features wgpu`"
    );
    println!("wgpu device: {}", <Wgpu as Backend>::name(&device));
    every_check::<Autodiff<Wgpu>>(&device);
}
