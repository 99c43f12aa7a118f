//! RMSNorm (`ops::norm`) on NdArray f64 (the reference) and Flex f32 (its SIMD loops): against
//! f64 written out and against the reference, and the node's gradients against Burn's autodiff
//! of the reference (the checks: `norm_checks.rs`).

use burn::backend::{Autodiff, Flex};

use crate::common::{Ad64, B64};
use crate::norm_checks::{
    rms_norm_agrees_with_f64_and_the_plain_operations,
    rms_norm_node_agrees_with_autodiff_of_the_reference,
};

/// Flex's RMSNorm loops and NdArray's plain operations against f64 written out.
#[test]
fn rms_norm_agrees_with_f64_on_flex_and_in_f64() {
    rms_norm_agrees_with_f64_and_the_plain_operations::<Flex>(1e-5);
    rms_norm_agrees_with_f64_and_the_plain_operations::<B64>(1e-12);
}

#[test]
fn rms_norm_node_agrees_with_autodiff_of_the_reference_in_f64_and_on_flex() {
    rms_norm_node_agrees_with_autodiff_of_the_reference::<Ad64>(1e-12);
    rms_norm_node_agrees_with_autodiff_of_the_reference::<Autodiff<Flex>>(2e-6);
}
