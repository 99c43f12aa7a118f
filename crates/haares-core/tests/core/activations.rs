//! The fused activations (`activation_ops`) on Flex f32 and NdArray f64: Flex's SIMD loops
//! against f64 and against the plain tensor operations, and the autodiff nodes' gradients against
//! Burn's autodiff of the plain operations (the checks: `activation_checks.rs`).

use burn::backend::{Autodiff, Flex};

use crate::activation_checks::{
    causal_softmax_agrees_with_f64_and_the_plain_operations, nan_propagates,
    nodes_agree_with_autodiff_of_the_plain_operations,
    rms_norm_agrees_with_f64_and_the_plain_operations,
    swiglu_agrees_with_f64_and_the_plain_operations,
};
use crate::attention_checks::{attention_gradients_agree_with_f64, attention_pair_agrees_with_f64};
use crate::common::{Ad64, B64};
use crate::cross_entropy_checks::{
    cross_entropy_gradient_agrees_with_f64, cross_entropy_pair_agrees_with_f64,
};
use crate::packed_checks::{
    packed_primitives_agree_with_f64, packed_sublayers_agree_with_the_separate_projections,
};
use crate::rotary_checks::{
    rotary_agrees_with_f64_and_the_plain_operations,
    rotary_node_agrees_with_autodiff_of_the_plain_operations,
};

/// Flex's SwiGLU loops against f64 (to within a few f32 roundings) and against the plain f32
/// operations; transposed operands take the plain path.
#[test]
fn flex_swiglu_agrees_with_f64_and_with_the_plain_operations() {
    swiglu_agrees_with_f64_and_the_plain_operations::<Flex>(1e-6);
}

/// Flex's causal softmax loops against f64 and against the plain f32 operations.
#[test]
fn flex_causal_softmax_agrees_with_f64_and_with_the_plain_operations() {
    causal_softmax_agrees_with_f64_and_the_plain_operations::<Flex>(1e-6);
}

/// RMSNorm's plain operations (the form Flex and NdArray run) against f64 written out.
#[test]
fn rms_norm_agrees_with_f64_on_flex_and_in_f64() {
    rms_norm_agrees_with_f64_and_the_plain_operations::<Flex>(1e-5);
    rms_norm_agrees_with_f64_and_the_plain_operations::<B64>(1e-12);
}

/// RoPE's plain operations (Flex's and NdArray's form) against the rotation written out in f64,
/// and its node's gradient against Burn's autodiff.
#[test]
fn rotary_agrees_with_f64_on_flex_and_in_f64() {
    rotary_agrees_with_f64_and_the_plain_operations::<Flex>(1e-6);
    rotary_agrees_with_f64_and_the_plain_operations::<B64>(1e-12);
    rotary_node_agrees_with_autodiff_of_the_plain_operations::<Autodiff<Flex>>(1e-6);
    rotary_node_agrees_with_autodiff_of_the_plain_operations::<Ad64>(1e-12);
}

/// The packed projections' joins and splits (the plain forms Flex and NdArray run) against f64
/// written out, and each packed sublayer's node against the separate projections, output and
/// every gradient.
#[test]
fn packed_projections_agree_with_f64_and_the_separate_projections() {
    packed_primitives_agree_with_f64::<Flex>(1e-6);
    packed_primitives_agree_with_f64::<B64>(1e-12);
    packed_sublayers_agree_with_the_separate_projections::<Autodiff<Flex>>(2e-5);
    packed_sublayers_agree_with_the_separate_projections::<Ad64>(1e-12);
}

/// Causal attention's plain pair (the output with each query's log-sum-exp, and the backward
/// pass from them; the reference of the cube backends' kernels) and the differentiable operation
/// against f64 written out.
#[test]
fn causal_attention_agrees_with_f64_on_flex_and_in_f64() {
    attention_pair_agrees_with_f64::<B64>(1e-12);
    attention_pair_agrees_with_f64::<Flex>(2e-5);
    attention_gradients_agree_with_f64::<Ad64>(1e-12);
    attention_gradients_agree_with_f64::<Autodiff<Flex>>(2e-5);
}

/// The weighted cross-entropy's plain pair (the reference of the cube backends' kernels) and the
/// differentiable operation against f64 written out.
#[test]
fn cross_entropy_agrees_with_f64_on_flex_and_in_f64() {
    cross_entropy_pair_agrees_with_f64::<B64>(1e-12);
    cross_entropy_pair_agrees_with_f64::<Flex>(2e-6);
    cross_entropy_gradient_agrees_with_f64::<Ad64>(1e-12);
    cross_entropy_gradient_agrees_with_f64::<Autodiff<Flex>>(2e-6);
}

#[test]
fn flex_loops_propagate_nan() {
    nan_propagates::<Flex>();
}

#[test]
fn nodes_agree_with_autodiff_of_the_plain_operations_in_f64() {
    nodes_agree_with_autodiff_of_the_plain_operations::<Ad64>(1e-12);
}

#[test]
fn nodes_agree_with_autodiff_of_the_plain_operations_on_flex() {
    nodes_agree_with_autodiff_of_the_plain_operations::<Autodiff<Flex>>(2e-6);
}
