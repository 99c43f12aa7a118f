//! Every operation's checks (`core/*_checks.rs`) on the CPU backends in f32, part of
//! `tests/portability.rs`; the cube backends run the same checks there, one test per operation.

use burn::backend::Autodiff;
use haares_core::HaaresBackend;

use crate::{
    attention_checks, cross_entropy_checks, matmul_checks, norm_checks, projections_checks,
    read_checks, rotary_checks, slot_sums_checks, softmax_checks, source_write_checks,
    swiglu_checks,
};

/// Every operation's checks on the two CPU backends in f32: NdArray, which runs each operation's
/// reference, and Flex, which runs its loops where it has them. The cube backends run the same
/// checks on their kernels (`cube_backend_tests!`); the f64 suite runs them on NdArray f64 and on
/// Flex (`core/swiglu.rs` and the files beside it).
#[test]
fn cpu_backends_pass_every_operation_check() {
    use burn::backend::{Flex, NdArray};
    // NdArray's f32 `recip` is an approximate SIMD instruction, which Burn's autodiff of the
    // reference's divisions takes: the nodes are compared with that autodiff, so at its error.
    // The causal softmax's gradient carries at least two of its quotients: three times the
    // instruction's bound, and no less than the 2e-4 these checks had on AVX-512 hosts.
    every_operation_check::<NdArray<f32>>((3.0 * approximate_reciprocal_error()).max(2e-4));
    every_operation_check::<Flex>(2e-5);
}

/// The largest relative error of the approximate reciprocal NdArray's f32 `recip` runs on this
/// CPU (through `macerator`, once a tensor is large enough for SIMD): x86's `rcp14` where AVX-512
/// is present (at most 2⁻¹⁴, Intel's bound), its `rcp` on AVX2 and SSE hosts (at most 1.5 · 2⁻¹²,
/// six times as large; an AVX2 host's softmax gradient check differed by 6.9e-4). Other
/// architectures are given the larger bound.
fn approximate_reciprocal_error() -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        return 2f64.powi(-14);
    }
    1.5 * 2f64.powi(-12)
}

/// The operation checks of one backend, at f32's tolerances: a few roundings of f32 against f64
/// and against the reference; every check on the autodiff backend, whose gradients (or whose
/// reference's gradients) are Burn's autodiff of the reference, to within `autodiff` at least.
fn every_operation_check<B: HaaresBackend>(autodiff: f64)
where
    Autodiff<B>: HaaresBackend,
{
    let at_least = |tolerance: f64| tolerance.max(autodiff);
    matmul_checks::nodes_agree_with_autodiff_of_matmul::<Autodiff<B>>(at_least(2e-6));
    swiglu_checks::swiglu_agrees_with_f64_and_the_plain_operations::<B>(1e-5);
    swiglu_checks::swiglu_propagates_nan::<B>();
    swiglu_checks::swiglu_node_agrees_with_autodiff_of_the_reference::<Autodiff<B>>(autodiff);
    softmax_checks::causal_softmax_agrees_with_f64_and_the_plain_operations::<B>(1e-5);
    softmax_checks::causal_softmax_propagates_nan::<B>();
    softmax_checks::causal_softmax_node_agrees_with_autodiff_of_the_reference::<Autodiff<B>>(
        autodiff,
    );
    norm_checks::rms_norm_agrees_with_f64_and_the_plain_operations::<B>(1e-5);
    norm_checks::rms_norm_node_agrees_with_autodiff_of_the_reference::<Autodiff<B>>(autodiff);
    rotary_checks::rotary_agrees_with_f64_and_the_plain_operations::<B>(1e-5, 1e-5);
    rotary_checks::rotary_node_agrees_with_autodiff_of_the_plain_operations::<Autodiff<B>>(
        autodiff,
    );
    attention_checks::attention_pair_agrees_with_f64::<B>(2e-5);
    attention_checks::attention_gradients_agree_with_f64::<Autodiff<B>>(at_least(2e-5));
    projections_checks::packed_primitives_agree_with_f64::<B>(1e-5);
    projections_checks::packed_sublayers_agree_with_the_separate_projections::<Autodiff<B>>(
        at_least(5e-5),
    );
    cross_entropy_checks::cross_entropy_pair_agrees_with_f64::<B>(2e-6);
    cross_entropy_checks::cross_entropy_gradient_agrees_with_f64::<Autodiff<B>>(at_least(2e-6));
    slot_sums_checks::row_dots_match::<B>();
    slot_sums_checks::weighted_sums_match::<B>();
    slot_sums_checks::added_scaled_rows_match::<B>();
    source_write_checks::mean_squares_and_their_gradients_match::<B>();
    source_write_checks::rms_match_multipliers_match::<B>();
    source_write_checks::signed_sums_with_mean_squares_match::<B>(false);
    source_write_checks::pair_writes_match::<B>();
    read_checks::read_forward_matches_the_composition::<B>();
    // Flex's read sums its gradients from f32 dot products whose order of addition follows the
    // host's vector width; the bias's gradient, a sum over slots and tokens that cancels, was off
    // by 1.7e-5 of its size on an AVX2 host (where NdArray's, summed in f64, matched f64's).
    read_checks::read_backward_matches_the_composition::<B>(5e-5);
    read_checks::operator_matches_the_reference_read::<Autodiff<B>>();
}
