//! SwiGLU (`ops::swiglu`) on NdArray f64 (the reference) and Flex f32 (its SIMD loops): the
//! operation against f64 and against the reference, NaN in and out, and the node's gradients
//! against Burn's autodiff of the reference (the checks: `swiglu_checks.rs`).

use burn::backend::{Autodiff, Flex};

use crate::common::Ad64;
use crate::swiglu_checks::{
    swiglu_agrees_with_f64_and_the_plain_operations,
    swiglu_node_agrees_with_autodiff_of_the_reference, swiglu_propagates_nan,
};

/// Flex's SwiGLU loops against f64 (to within a few f32 roundings) and against the plain f32
/// operations; transposed operands take the plain path.
#[test]
fn flex_swiglu_agrees_with_f64_and_with_the_plain_operations() {
    swiglu_agrees_with_f64_and_the_plain_operations::<Flex>(1e-6);
}

#[test]
fn flex_swiglu_propagates_nan() {
    swiglu_propagates_nan::<Flex>();
}

#[test]
fn swiglu_node_agrees_with_autodiff_of_the_reference_in_f64_and_on_flex() {
    swiglu_node_agrees_with_autodiff_of_the_reference::<Ad64>(1e-12);
    swiglu_node_agrees_with_autodiff_of_the_reference::<Autodiff<Flex>>(2e-6);
}
