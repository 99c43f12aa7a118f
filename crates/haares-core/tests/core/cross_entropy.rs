//! The weighted cross-entropy (`ops::cross_entropy`) on NdArray f64 and Flex f32, both of which
//! run the reference: the pair and the differentiable operation against f64 written out (the
//! checks: `cross_entropy_checks.rs`).

use burn::backend::{Autodiff, Flex};

use crate::common::{Ad64, B64};
use crate::cross_entropy_checks::{
    cross_entropy_gradient_agrees_with_f64, cross_entropy_pair_agrees_with_f64,
    summed_cross_entropy_gradient_agrees_with_f64,
};

/// The weighted cross-entropy's plain pair (the reference of the cube backends' kernels) and the
/// differentiable operation against f64 written out.
#[test]
fn cross_entropy_agrees_with_f64_on_flex_and_in_f64() {
    cross_entropy_pair_agrees_with_f64::<B64>(1e-12);
    cross_entropy_pair_agrees_with_f64::<Flex>(2e-6);
    cross_entropy_gradient_agrees_with_f64::<Ad64>(1e-12);
    cross_entropy_gradient_agrees_with_f64::<Autodiff<Flex>>(2e-6);
    summed_cross_entropy_gradient_agrees_with_f64::<Ad64>(1e-12);
    summed_cross_entropy_gradient_agrees_with_f64::<Autodiff<Flex>>(2e-6);
}
