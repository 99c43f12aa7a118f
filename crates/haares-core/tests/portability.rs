//! Portability: the core suite's numerical checks, generic over the backend, in f32 — the forward
//! pass of every method against the f64 reference (`core/reference.rs`), causality, and gradient
//! flow to every parameter — and the CubeCL kernels of the routing operator and the fused
//! activations. They run on NdArray always, on wgpu in every test build but ignored unless asked
//! for (`-- --ignored wgpu`: any Vulkan, Metal or DX12 adapter; CI uses Mesa's software Vulkan,
//! lavapipe; docs/decisions.md, decision 27), and on CUDA with `--features cuda` (an NVIDIA GPU).
//! f32 models' checkpoints are checked here too (`f32/checkpoints.rs`).
//!
//! Its own test binary: NdArray<f32> must not share a process with the f64 suite (one CPU device,
//! one process-wide default float type).
#![allow(dead_code)] // the shared helpers serve the f64 suite too

#[path = "core/attention_checks.rs"]
mod attention_checks;
#[path = "core/common.rs"]
mod common;
#[path = "core/cross_entropy_checks.rs"]
mod cross_entropy_checks;
#[cfg(feature = "cuda")]
#[path = "core/cublas_checks.rs"]
mod cublas_checks;
#[path = "../examples/foreign_decoder/model.rs"]
mod foreign_model;
#[path = "core/matmul_checks.rs"]
mod matmul_checks;
#[path = "core/norm_checks.rs"]
mod norm_checks;
#[path = "core/projections_checks.rs"]
mod projections_checks;
#[path = "core/read_checks.rs"]
mod read_checks;
#[path = "core/reference.rs"]
mod reference;
#[path = "core/rotary_checks.rs"]
mod rotary_checks;
#[path = "core/slot_sums_checks.rs"]
mod slot_sums_checks;
#[path = "core/softmax_checks.rs"]
mod softmax_checks;
#[path = "core/source_write_checks.rs"]
mod source_write_checks;
#[path = "core/stream_checks.rs"]
mod stream_checks;
#[path = "core/swiglu_checks.rs"]
mod swiglu_checks;

use burn::backend::Autodiff;
use haares_core::{HaaresBackend, RoutingPath, TrainingBackend};

use common::*;
use reference::{Products, reference_logits_with};

/// f32 against f64: tolerance relative to the largest logit, for backends whose matrix products
/// round in f32.
const F32_TOLERANCE: f64 = 2e-4;
/// The same on CUDA, where Burn's f32 matrix products run on tensor cores in TF32 (a 10-bit
/// mantissa; its GEMM peak on an H100 is above the card's plain-f32 peak). TF32 rounding of the
/// products alone moves these models' logits by up to 1.1e-2 of their scale (2.3e-2 were the
/// operands truncated instead of rounded): `tf32_rounding_stays_within_the_cuda_tolerance`
/// measures that on the CPU with the reference's emulated TF32 products, and keeps this bound
/// above it. A routing fault is still caught here at O(1), and tightly by the kernel and operator
/// checks (`core/read_checks.rs`, `core/slot_sums_checks.rs`), which run no matrix product.
const TF32_TOLERANCE: f64 = 3e-2;

/// One whole-model check: a config, its parameters and a batch of tokens.
struct Case {
    config: haares_core::ModelConfig,
    params: std::collections::HashMap<String, burn::tensor::TensorData>,
    tokens: Vec<Vec<usize>>,
}

impl Case {
    fn label(&self) -> String {
        let config = &self.config;
        format!(
            "{} (L = {}, N = {}, {:?} path)",
            config.method.name(),
            config.n_layers,
            config.blocks,
            config.routing
        )
    }

    /// The reference logits and their scale (the largest magnitude, at least 1).
    fn reference(&self, products: Products) -> (Vec<f64>, f64) {
        let logits = reference_logits_with(&self.config, &self.params, &self.tokens, products);
        let scale = logits.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        (logits, scale)
    }
}

/// The whole-model cases, the same on every backend: every method at even, odd and single-event
/// blocks (m = 4, 3, 1), on both routing paths, with fresh parameters and tokens each.
fn reference_cases<B: burn::tensor::backend::Backend>(device: &B::Device) -> Vec<Case> {
    let mut rng = Rng::new(77);
    let mut cases = Vec::new();
    for (layers, blocks) in [(4, 2), (3, 2), (2, 4)] {
        for routing in [RoutingPath::Reference, RoutingPath::Fused] {
            for method in all_methods() {
                let config = tiny_config(method, layers, blocks).with_routing(routing);
                let params = random_params_for::<B>(&config, rng.next_u64(), device);
                let tokens = random_tokens(&mut rng, 2, 7, config.vocab_size);
                cases.push(Case {
                    config,
                    params,
                    tokens,
                });
            }
        }
    }
    cases
}

/// Every method's logits against the f64 reference; prints each one's relative error, then fails
/// with every method that exceeds `tolerance`.
fn forward_matches_the_reference<B: HaaresBackend>(device: &B::Device, tolerance: f64) {
    let mut failures = Vec::new();
    for case in reference_cases::<B>(device) {
        let (expected, scale) = case.reference(Products::Exact);
        let model = model_on::<B>(&case.config, &case.params, device);
        let actual = logits_on(&model, &case.tokens, device);
        let relative = max_abs_diff(&expected, &actual) / scale;
        let line = format!(
            "{} on {}: max |module − reference| / scale = {relative:.2e}",
            case.label(),
            B::name(device)
        );
        println!("{line}");
        // A NaN error fails too.
        if relative.is_nan() || relative >= tolerance {
            failures.push(line);
        }
    }
    assert!(
        failures.is_empty(),
        "above the tolerance {tolerance:e}:\n{}",
        failures.join("\n")
    );
}

/// Calibrates [`TF32_TOLERANCE`] without a GPU: the reference with every matrix product's operands
/// rounded to TF32 (round to nearest, as CubeCL converts; and truncated, a coarser bound) against
/// the exact reference, over the very cases CUDA checks. Fails if TF32 rounding alone could fail
/// the CUDA check, or if the emulation stops rounding (then it would calibrate nothing).
#[test]
fn tf32_rounding_stays_within_the_cuda_tolerance() {
    let mut worst = [0.0f64; 2];
    for case in reference_cases::<burn::backend::NdArray<f32>>(&Default::default()) {
        let (exact, scale) = case.reference(Products::Exact);
        for (worst, truncate) in worst.iter_mut().zip([false, true]) {
            let (rounded, _) = case.reference(Products::Tf32 { truncate });
            let relative = max_abs_diff(&exact, &rounded) / scale;
            println!(
                "{}, TF32 (truncate: {truncate}): {relative:.2e}",
                case.label()
            );
            *worst = worst.max(relative);
        }
    }
    let [nearest, truncated] = worst;
    println!("largest: {nearest:.2e} rounded to nearest, {truncated:.2e} truncated");
    assert!(
        nearest > F32_TOLERANCE,
        "emulated TF32 moved no case beyond f32 rounding ({nearest:.2e}): the emulation is off"
    );
    assert!(
        truncated < TF32_TOLERANCE && 2.0 * nearest < TF32_TOLERANCE,
        "TF32 rounding alone moves logits by {nearest:.2e} (truncated: {truncated:.2e}) of their \
         scale: TF32_TOLERANCE = {TF32_TOLERANCE:e} leaves no margin for it"
    );
}

fn every_check<B: TrainingBackend>(device: &B::Device, tolerance: f64) {
    forward_matches_the_reference::<B>(device, tolerance);
    // Float kernels may tile differently, never mix positions: past logits move by rounding at most.
    check_causality::<B>(device, 1e-5);
    f32_gradients::gradients_reach_every_parameter::<B>(device);
}

#[test]
fn ndarray_f32_passes_the_numerical_checks() {
    every_check::<Autodiff<burn::backend::NdArray<f32>>>(&Default::default(), F32_TOLERANCE);
}

/// The residual stream around the foreign decoder's sublayers on Flex in f32: its read loops
/// (the fused path) against the reference path (the cube backends run the same check below).
#[test]
fn flex_residual_stream_fused_path_matches_the_reference_path() {
    stream_checks::fused_stream_matches_the_reference_stream::<Autodiff<burn::backend::Flex>>(5e-5);
}

/// One cube backend's tests: the numerical checks on the whole model and the routing operator's
/// kernels (`kernels` below). With the backend's feature on, the checks must run: a missing device
/// fails with how to get one, it is never counted as a pass. The backend is the one the runners
/// use: Burn's cube backend without kernel fusion (Burn 0.21's fused kernels fail the reference
/// check; docs/deviations.md). Arguments: the module's name, the backend, the whole model's
/// tolerance, the matrix-product check's contraction lengths and tolerance (`matmul_checks`), the
/// least tolerance of a kernel against plain operations that run matrix products (RoPE's quarter
/// turn, the separate projections: 0 where products round in f32, TF32's rounding on CUDA), that
/// of the read kernels' f32 sums against the composition on the CPU, whether `Auto` takes the
/// fused path, and the message for a missing device.
#[cfg(feature = "cube")]
macro_rules! cube_backend_tests {
    (
        $name:ident,
        $backend:ty,
        $tolerance:expr,
        $products:expr,
        $plain_products:expr,
        $read_sums:expr,
        $auto_fused:expr,
        $missing:literal,
        [$($needs_device:meta)?]
    ) => {
        mod $name {
            use burn::backend::Autodiff;
            use burn::tensor::Tensor;
            use burn::tensor::backend::Backend;

            type Cube = $backend;

            #[test]
            $(#[$needs_device])?
            fn passes_the_numerical_checks() {
                let device = Default::default();
                let probe = std::panic::catch_unwind(|| {
                    Tensor::<Cube, 1>::zeros([1], &device).into_data();
                });
                assert!(probe.is_ok(), $missing);
                println!("device: {}", <Cube as Backend>::name(&device));
                super::every_check::<Autodiff<Cube>>(&device, $tolerance);
            }

            /// `Auto` takes the kernels where they passed every check on a GPU and were timed
            /// faster there (CUDA), the reference path elsewhere (wgpu).
            #[test]
            fn auto_takes_the_measured_path() {
                use haares_core::RoutingPath;
                let expected = if $auto_fused {
                    RoutingPath::Fused
                } else {
                    RoutingPath::Reference
                };
                assert_eq!(RoutingPath::Auto.resolve::<Cube>(), expected);
                assert_eq!(RoutingPath::Auto.resolve::<Autodiff<Cube>>(), expected);
            }

            #[test]
            $(#[$needs_device])?
            fn row_dot_kernels_and_plain_primitive_match_f64_sums() {
                super::slot_sums_checks::row_dots_match::<Cube>();
            }

            #[test]
            $(#[$needs_device])?
            fn read_kernels_match_the_composition() {
                super::read_checks::read_forward_matches_the_composition::<Cube>();
                super::read_checks::read_backward_matches_the_composition::<Cube>($read_sums);
            }

            #[test]
            $(#[$needs_device])?
            fn row_kernels_match_f64() {
                super::source_write_checks::mean_squares_and_their_gradients_match::<Cube>();
                super::slot_sums_checks::added_scaled_rows_match::<Cube>();
                super::source_write_checks::rms_match_multipliers_match::<Cube>();
                super::source_write_checks::signed_sums_with_mean_squares_match::<Cube>(true);
                super::source_write_checks::pair_writes_match::<Cube>();
            }

            #[test]
            $(#[$needs_device])?
            fn weighted_sum_and_total_kernels_and_plain_primitives_match_f64_sums() {
                super::slot_sums_checks::weighted_sums_match::<Cube>();
            }

            /// SwiGLU's, the causal softmax's, RMSNorm's and RoPE's kernels, both directions,
            /// against f64 and the plain operations; NaN in, NaN out. The kernels round as f32 does
            /// (CubeCL's accurate `exp`, no fast math), within a few roundings of Flex's loops.
            #[test]
            $(#[$needs_device])?
            fn activation_kernels_match_f64_and_the_plain_operations() {
                use super::{norm_checks, softmax_checks, swiglu_checks};
                swiglu_checks::swiglu_agrees_with_f64_and_the_plain_operations::<Cube>(1e-5);
                softmax_checks::causal_softmax_agrees_with_f64_and_the_plain_operations::<Cube>(
                    1e-5,
                );
                norm_checks::rms_norm_agrees_with_f64_and_the_plain_operations::<Cube>(1e-5);
                swiglu_checks::swiglu_propagates_nan::<Cube>();
                softmax_checks::causal_softmax_propagates_nan::<Cube>();
                super::rotary_checks::rotary_agrees_with_f64_and_the_plain_operations::<Cube>(
                    1e-5,
                    f64::max(1e-5, $plain_products),
                );
            }

            #[test]
            $(#[$needs_device])?
            fn activation_nodes_match_autodiff_of_the_plain_operations() {
                use super::{norm_checks, softmax_checks, swiglu_checks};
                swiglu_checks::swiglu_node_agrees_with_autodiff_of_the_reference::<Autodiff<Cube>>(
                    2e-5,
                );
                norm_checks::rms_norm_node_agrees_with_autodiff_of_the_reference::<Autodiff<Cube>>(
                    2e-5,
                );
                softmax_checks::causal_softmax_node_agrees_with_autodiff_of_the_reference::<
                    Autodiff<Cube>,
                >(2e-5);
                super::rotary_checks::rotary_node_agrees_with_autodiff_of_the_plain_operations::<
                    Autodiff<Cube>,
                >(f64::max(1e-5, $plain_products));
            }

            /// Causal attention's kernel pair (one launch forward, two backward) against f64,
            /// and the fused node's gradients.
            #[test]
            $(#[$needs_device])?
            fn attention_kernels_match_f64() {
                super::attention_checks::attention_pair_agrees_with_f64::<Cube>(2e-5);
                super::attention_checks::attention_gradients_agree_with_f64::<Autodiff<Cube>>(2e-5);
                assert!(<Cube as haares_core::ops::AttentionBackend>::fuses_causal_attention(128));
            }

            /// The packed projections' join and split kernels against f64, and the packed
            /// sublayers' nodes against the separate projections, output and every gradient.
            #[test]
            $(#[$needs_device])?
            fn packed_projection_kernels_match_f64_and_the_separate_projections() {
                super::projections_checks::packed_primitives_agree_with_f64::<Cube>(1e-5);
                super::projections_checks::packed_sublayers_agree_with_the_separate_projections::<
                    Autodiff<Cube>,
                >(f64::max(5e-5, $plain_products));
                assert!(<Cube as haares_core::ops::ProjectionBackend>::packs_projections());
            }

            /// The weighted cross-entropy's kernels (one launch each way, one for the loss's
            /// total) against f64, and the fused nodes' gradients.
            #[test]
            $(#[$needs_device])?
            fn cross_entropy_kernels_match_f64() {
                super::cross_entropy_checks::cross_entropy_pair_agrees_with_f64::<Cube>(2e-6);
                super::cross_entropy_checks::cross_entropy_gradient_agrees_with_f64::<
                    Autodiff<Cube>,
                >(2e-6);
                super::cross_entropy_checks::summed_cross_entropy_gradient_agrees_with_f64::<
                    Autodiff<Cube>,
                >(2e-6);
            }

            /// Burn's matrix product where cubek-matmul 0.2.0's double-buffered and specialized
            /// kernels overrun the contraction: in an autotuned build they are candidates.
            #[test]
            $(#[$needs_device])?
            fn matrix_products_match_f64_at_odd_stage_counts() {
                let (contractions, tolerance) = $products;
                super::matmul_checks::products_agree_with_f64_at_odd_stage_counts::<Cube>(
                    &contractions,
                    tolerance,
                );
                super::matmul_checks::nodes_agree_with_autodiff_of_matmul::<Autodiff<Cube>>(
                    tolerance,
                );
            }

            /// The residual stream around sublayers that are not ours (the foreign decoder, three
            /// events per layer): the read kernels' path against the reference path.
            #[test]
            $(#[$needs_device])?
            fn residual_stream_fused_path_matches_the_reference_path() {
                super::stream_checks::fused_stream_matches_the_reference_stream::<Autodiff<Cube>>(
                    5e-5,
                );
            }

            #[test]
            $(#[$needs_device])?
            fn the_operator_on_kernels_matches_the_cpu_reference_read_and_its_gradients() {
                super::read_checks::operator_matches_the_reference_read::<Autodiff<Cube>>();
            }
        }
    };
}

/// Burn's kernel fusion over wgpu (`burn::backend::Wgpu` as Burn defines it), with the plain
/// operations: the check of whether fusion can be offered, run then without autotuning
/// (test builds are autotuned since, docs/decisions.md, decision 27). Only with `--features
/// fusion`; CI compiles it (its GPU-feature check) but does not run it. What it gave is in
/// docs/deviations.md ("GPU backends without Burn's kernel fusion").
#[cfg(all(feature = "wgpu", feature = "fusion"))]
mod wgpu_fusion {
    use burn::backend::{Autodiff, Wgpu};

    #[test]
    fn passes_the_numerical_checks() {
        super::every_check::<Autodiff<Wgpu>>(&Default::default(), crate::F32_TOLERANCE);
    }
}

/// The same on CUDA (`--features cuda,fusion`), at CUDA's tolerance.
#[cfg(all(feature = "cuda", feature = "fusion"))]
mod cuda_fusion {
    use burn::backend::{Autodiff, Cuda};

    #[test]
    fn passes_the_numerical_checks() {
        super::every_check::<Autodiff<Cuda>>(&Default::default(), crate::TF32_TOLERANCE);
    }
}

// The public aliases a library user writes (docs/library.md, "The backend bound").
#[cfg(feature = "wgpu")]
cube_backend_tests!(
    wgpu,
    haares_core::backend::Wgpu,
    crate::F32_TOLERANCE,
    (crate::matmul_checks::EVERY_STAGE_DEPTH, 1e-4),
    0.0,
    1e-5,
    false,
    "no wgpu adapter: install a Vulkan driver (Debian: `apt-get install mesa-vulkan-drivers` \
     for the lavapipe software device)",
    [ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
);

#[cfg(feature = "cuda")]
cube_backend_tests!(
    cuda,
    haares_core::backend::Cuda,
    crate::TF32_TOLERANCE,
    (crate::matmul_checks::TENSOR_CORE_STAGE_DEPTHS, 5e-3),
    // On an H200: RoPE against its plain form 1.3e-4 and 1.6e-4 of the scale (the kernel matched
    // f64 within 1e-5), the packed projections against the separate ones 3.3e-4; one TF32
    // rounding is 4.9e-4 of an operand.
    2e-3,
    // On an H200 one read gradient differed from the composition by 1.05e-5 of its scale: NVRTC
    // contracts a·b + c into one rounding by default (`--fmad=true`) and the kernel sums in
    // another order than the CPU.
    3e-5,
    true,
    "no CUDA device: run on a machine with an NVIDIA GPU and its driver, or without \
     `--features cuda`",
    []
);

#[path = "f32/checkpoints.rs"]
mod f32_checkpoints;
#[path = "f32/gradients.rs"]
mod f32_gradients;
#[path = "f32/operations.rs"]
mod f32_operations;
