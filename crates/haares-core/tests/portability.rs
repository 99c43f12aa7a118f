//! Portability: the core suite's numerical checks, generic over the backend, in f32 — the forward
//! pass of every method against the f64 reference (`core/reference.rs`), causality, and gradient
//! flow to every parameter — and the routing operator's CubeCL kernels. They run on NdArray always,
//! on wgpu with `--features wgpu` (any Vulkan, Metal or DX12 adapter; CI uses Mesa's software
//! Vulkan, lavapipe) and on CUDA with `--features cuda` (an NVIDIA GPU).
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
use haares_core::{RoutingBackend, RoutingPath, TrainingBackend};

use common::*;
use reference::reference_logits;

/// f32 against f64: tolerance relative to the largest logit, for backends whose matrix products
/// round in f32.
const F32_TOLERANCE: f64 = 2e-4;
/// The same on CUDA, where Burn's f32 matrix products run on tensor cores in TF32 (a 10-bit
/// mantissa; its GEMM peak on an H100 is above the card's plain-f32 peak): rounding, not a
/// mismatch, moves logits by about 3e-3 of their scale there (docs/benchmarks.md).
const TF32_TOLERANCE: f64 = 1e-2;

/// Every method's logits against the f64 reference; prints each one's relative error, then fails
/// with every method that exceeds `tolerance`.
fn forward_matches_the_reference<B: RoutingBackend>(device: &B::Device, tolerance: f64) {
    let mut rng = Rng::new(77);
    let mut failures = Vec::new();
    // Even, odd and single-event blocks (m = 4, 3, 1).
    for (layers, blocks) in [(4, 2), (3, 2), (2, 4)] {
        for routing in [RoutingPath::Reference, RoutingPath::Fused] {
            for method in all_methods() {
                let config = tiny_config(method, layers, blocks).with_routing(routing);
                let params = random_params_for::<B>(&config, rng.next_u64(), device);
                let tokens = random_tokens(&mut rng, 2, 7, config.vocab_size);
                let expected = reference_logits(&config, &params, &tokens);
                let actual = logits_on(&model_on::<B>(&config, &params, device), &tokens, device);
                let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let relative = max_abs_diff(&expected, &actual) / scale;
                let line = format!(
                    "{} (L = {layers}, N = {blocks}, {routing:?} path) on {}: \
                     max |module − reference| / scale = {relative:.2e}",
                    config.method.name(),
                    B::name(device)
                );
                println!("{line}");
                // A NaN error fails too.
                if relative.is_nan() || relative >= tolerance {
                    failures.push(line);
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "above the tolerance {tolerance:e}:\n{}",
        failures.join("\n")
    );
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

fn every_check<B: TrainingBackend>(device: &B::Device, tolerance: f64) {
    forward_matches_the_reference::<B>(device, tolerance);
    // Float kernels may tile differently, never mix positions: past logits move by rounding at most.
    check_causality::<B>(device, 1e-5);
    gradients_reach_every_parameter::<B>(device);
}

#[test]
fn ndarray_f32_passes_the_numerical_checks() {
    every_check::<Autodiff<burn::backend::NdArray<f32>>>(&Default::default(), F32_TOLERANCE);
}

/// One cube backend's tests: the numerical checks on the whole model and the routing operator's
/// kernels (`kernels` below). With the backend's feature on, the checks must run: a missing device
/// fails with how to get one, it is never counted as a pass. The backend is the one the runners
/// use: Burn's cube backend without kernel fusion (Burn 0.21's fused kernels fail the reference
/// check; docs/deviations.md).
#[cfg(feature = "cube")]
macro_rules! cube_backend_tests {
    ($name:ident, $backend:ty, $tolerance:expr, $missing:literal) => {
        mod $name {
            use burn::backend::Autodiff;
            use burn::tensor::Tensor;
            use burn::tensor::backend::Backend;

            type Cube = $backend;

            #[test]
            fn passes_the_numerical_checks() {
                let device = Default::default();
                let probe = std::panic::catch_unwind(|| {
                    Tensor::<Cube, 1>::zeros([1], &device).into_data();
                });
                assert!(probe.is_ok(), $missing);
                println!("device: {}", <Cube as Backend>::name(&device));
                super::every_check::<Autodiff<Cube>>(&device, $tolerance);
            }

            /// Until a hardware GPU passes the kernel checks, `Auto` must not select them.
            #[test]
            fn auto_takes_the_reference_path() {
                use haares_core::RoutingPath;
                assert_eq!(RoutingPath::Auto.resolve::<Cube>(), RoutingPath::Reference);
                assert_eq!(
                    RoutingPath::Auto.resolve::<Autodiff<Cube>>(),
                    RoutingPath::Reference
                );
            }

            #[test]
            fn row_dot_kernels_match_the_plain_primitive() {
                super::kernels::row_dots_match::<Cube>();
            }

            #[test]
            fn weighted_sum_kernels_match_the_plain_primitive() {
                super::kernels::weighted_sums_match::<Cube>();
            }

            #[test]
            fn the_operator_on_kernels_matches_the_reference_read_and_its_gradients() {
                super::kernels::operator_matches_the_reference_read::<Autodiff<Cube>>();
            }
        }
    };
}

#[cfg(feature = "wgpu")]
cube_backend_tests!(
    wgpu,
    burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>,
    crate::F32_TOLERANCE,
    "no wgpu adapter: install a Vulkan driver (Debian: `apt-get install mesa-vulkan-drivers` \
     for the lavapipe software device) or run without `--features wgpu`"
);

#[cfg(feature = "cuda")]
cube_backend_tests!(
    cuda,
    burn_cubecl::CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, f32, i32, u8>,
    crate::TF32_TOLERANCE,
    "no CUDA device: run on a machine with an NVIDIA GPU and its driver, or without \
     `--features cuda`"
);

#[cfg(feature = "cube")]
mod kernels {
    //! The routing operator's CubeCL kernels against its plain tensor-operation primitives
    //! (`routing_ops::naive`) on the same device, on fresh random inputs: one slot to several
    //! launches' worth, widths below, between and above a cube's thread count, a row shared by
    //! all tokens and one per token, and strided (non-contiguous) inputs.
    use burn::module::Param;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};
    use haares_core::router::DepthRouterConfig;
    use haares_core::routing_ops::naive;
    use haares_core::{DetailBias, RoutingBackend, SourceBank};

    use super::common::{Rng, max_abs_diff, random_matrix, random_slot_views, tensor_values};

    const SLOT_COUNTS: [usize; 5] = [1, 3, 16, 17, 40];
    /// (tokens, d): a single number, widths that do not divide the thread count, several strides.
    const SHAPES: [(usize, usize); 3] = [(1, 1), (37, 70), (130, 256)];

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

    /// Checks both implementations against the same sum in f64 on the host: the kernel to f32
    /// rounding, the plain primitive loosely, since Burn may run its matrix products in TF32
    /// (CUDA). A layout bug in either shows as an error of the order of the scale.
    fn assert_both_right<B: Backend>(
        kernel: Tensor<B, 2>,
        plain: Tensor<B, 2>,
        expected: Vec<f64>,
        what: String,
    ) {
        let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (name, actual, tolerance) in
            [("kernel", kernel, 1e-5), ("plain primitive", plain, 1e-2)]
        {
            assert_eq!(
                actual.dims().iter().product::<usize>(),
                expected.len(),
                "{what}: {name} shape"
            );
            let diff = max_abs_diff(&tensor_values(actual), &expected);
            assert!(
                diff < tolerance * scale,
                "{what}: max |{name} − f64 sum| = {diff:e} (scale {scale:.2})"
            );
        }
    }

    /// `Σ_k slot[n, k] · row[n or 0, k]` per slot and token, in f64: `[S, tokens]` row-major.
    fn host_row_dots<B: Backend>(slots: &[Tensor<B, 2>], rows: &Tensor<B, 2>) -> Vec<f64> {
        let [shared, d] = rows.dims();
        let rows = tensor_values(rows.clone());
        let row = |n: usize| &rows[if shared == 1 { 0 } else { n * d }..][..d];
        slots
            .iter()
            .flat_map(|slot| {
                let values = tensor_values(slot.clone());
                let tokens = values.len() / d;
                (0..tokens)
                    .map(|n| (0..d).map(|k| values[n * d + k] * row(n)[k]).sum::<f64>())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// `Σ_s weights[s, n] · slot_s[n, k]` in f64: `[tokens, d]` row-major.
    fn host_weighted_sum<B: Backend>(slots: &[Tensor<B, 2>], weights: &Tensor<B, 2>) -> Vec<f64> {
        let [_, tokens] = weights.dims();
        let weights = tensor_values(weights.clone());
        let mut sum = vec![0.0; slots[0].dims().iter().product()];
        for (slot, values) in slots.iter().enumerate() {
            let values = tensor_values(values.clone());
            let d = values.len() / tokens;
            for (index, value) in values.iter().enumerate() {
                sum[index] += weights[slot * tokens + index / d] * value;
            }
        }
        sum
    }

    pub fn row_dots_match<B: RoutingBackend>() {
        let mut rng = Rng::new(2024);
        for count in SLOT_COUNTS {
            for (tokens, d) in SHAPES {
                let slots = random_slot_views::<B>(&mut rng, count, tokens, d);
                for shared in [true, false] {
                    let rows = random_matrix(&mut rng, [if shared { 1 } else { tokens }, d]);
                    assert_both_right(
                        B::row_dots(&slots, rows.clone()),
                        naive::row_dots(&slots, rows.clone()),
                        host_row_dots(&slots, &rows),
                        format!("row_dots, S = {count}, {tokens} × {d}, shared row {shared}"),
                    );
                }
            }
        }
    }

    pub fn weighted_sums_match<B: RoutingBackend>() {
        let mut rng = Rng::new(2025);
        for count in SLOT_COUNTS {
            for (tokens, d) in SHAPES {
                let slots = random_slot_views::<B>(&mut rng, count, tokens, d);
                // The weights as a strided view: the right half of a wider tensor.
                let weights =
                    random_matrix(&mut rng, [count, 2 * tokens]).narrow(1, tokens, tokens);
                assert_both_right(
                    B::weighted_sum(&slots, weights.clone()),
                    naive::weighted_sum(&slots, weights.clone()),
                    host_weighted_sum(&slots, &weights),
                    format!("weighted_sum, S = {count}, {tokens} × {d}"),
                );
            }
        }
    }

    /// The whole routing operator on the kernels, forward and backward: a fused read on the
    /// autodiff backend `Ad` against the reference read on the same device, in its mixture, its
    /// weights and every gradient (each slot, the query, the key-norm weight, the detail bias),
    /// for one slot, a HAARES bank and the largest bank (97 slots: several kernel launches and
    /// autodiff nodes).
    pub fn operator_matches_the_reference_read<
        Ad: RoutingBackend + burn::tensor::backend::AutodiffBackend,
    >() {
        let mut rng = Rng::new(2026);
        for pairs in [0, 4, 48] {
            let (batch, seq, d) = (2, 5, 24);
            let mut router = DepthRouterConfig::new(d)
                .with_detail_bias(Some(DetailBias::Learned { init: -2.0 }))
                .init::<Ad>(&Default::default());
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
            if pairs == 0 {
                // One slot: weight 1 everywhere, and the mixture is the slot itself.
                let slot = tensor_values(values[0].clone());
                for (path, read) in [("reference", &reference), ("fused", &fused)] {
                    let mixture_error = max_abs_diff(&read[0], &slot);
                    let weight_error = read[1].iter().fold(0.0f64, |m, w| m.max((w - 1.0).abs()));
                    assert!(
                        mixture_error < 1e-5 && weight_error < 1e-6,
                        "S = 1, {path} read: mixture off by {mixture_error:e}, weights off 1 by \
                         {weight_error:e}"
                    );
                }
            }
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
