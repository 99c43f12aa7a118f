//! RoPE (`ops::rotary`) on NdArray f64 (the reference) and Flex f32 (its loop): against the
//! rotation written out in f64 and the plain operations, and the node's gradient against Burn's
//! autodiff of the reference (the checks: `rotary_checks.rs`).

use burn::backend::{Autodiff, Flex};

use crate::common::{Ad64, B64};
use crate::rotary_checks::{
    rotary_agrees_with_f64_and_the_plain_operations,
    rotary_node_agrees_with_autodiff_of_the_plain_operations,
};

/// Flex's RoPE loop and NdArray's plain operations against the rotation written out in f64,
/// and its node's gradient against Burn's autodiff.
#[test]
fn rotary_agrees_with_f64_on_flex_and_in_f64() {
    rotary_agrees_with_f64_and_the_plain_operations::<Flex>(1e-6, 1e-6);
    rotary_agrees_with_f64_and_the_plain_operations::<B64>(1e-12, 1e-12);
    rotary_node_agrees_with_autodiff_of_the_plain_operations::<Autodiff<Flex>>(1e-6);
    rotary_node_agrees_with_autodiff_of_the_plain_operations::<Ad64>(1e-12);
}
