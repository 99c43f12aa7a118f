//! The packed projections (`ops::projections`) on NdArray f64 and Flex f32, both of which run the
//! reference: the joins and splits against f64 written out, and each packed sublayer's node
//! against the separate projections, output and every gradient (the checks:
//! `projections_checks.rs`).

use burn::backend::{Autodiff, Flex};

use crate::common::{Ad64, B64};
use crate::projections_checks::{
    packed_primitives_agree_with_f64, packed_sublayers_agree_with_the_separate_projections,
};

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
