//! The causal softmax (`ops::softmax`) on NdArray f64 (the reference) and Flex f32 (its SIMD
//! loops): the operation against f64 and against the reference, NaN in and out, and the node's
//! gradient against Burn's autodiff of the reference (the checks: `softmax_checks.rs`).

use burn::backend::{Autodiff, Flex};

use crate::common::Ad64;
use crate::softmax_checks::{
    causal_softmax_agrees_with_f64_and_the_plain_operations,
    causal_softmax_node_agrees_with_autodiff_of_the_reference, causal_softmax_propagates_nan,
};

/// Flex's causal softmax loops against f64 and against the plain f32 operations.
#[test]
fn flex_causal_softmax_agrees_with_f64_and_with_the_plain_operations() {
    causal_softmax_agrees_with_f64_and_the_plain_operations::<Flex>(1e-6);
}

#[test]
fn flex_causal_softmax_propagates_nan() {
    causal_softmax_propagates_nan::<Flex>();
}

#[test]
fn causal_softmax_node_agrees_with_autodiff_of_the_reference_in_f64_and_on_flex() {
    causal_softmax_node_agrees_with_autodiff_of_the_reference::<Ad64>(1e-12);
    causal_softmax_node_agrees_with_autodiff_of_the_reference::<Autodiff<Flex>>(2e-6);
}
