//! A source's write in plain tensor operations: eq:update's signed sum, and a HAARES pair's
//! whole write as its operations, the reference for every kernel and graph node of [`super`].

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{PairWrite, RmsMatching, SourceWriteBackend};

/// [`SourceWriteBackend::signed_sum`]: for the half-split
/// signs `±1` one addition or subtraction, the same number as multiplying by the sign first.
pub fn signed_sum<B: Backend, const D: usize>(
    sum: Tensor<B, D>,
    term: Tensor<B, D>,
    sign: f64,
) -> Tensor<B, D> {
    if sign == 1.0 {
        sum + term
    } else if sign == -1.0 {
        sum - term
    } else {
        sum + term.mul_scalar(sign)
    }
}

/// [`SourceWriteBackend::pair_write`] as its operations: the two signed sums with the mean squares
/// the backend forms with them (or [`SourceWriteBackend::row_mean_square`] where it forms none),
/// then
/// [`SourceWriteBackend::rms_match_multiplier`].
pub fn compose<B: SourceWriteBackend, const D: usize>(
    cumulative: Tensor<B, D>,
    detail: Option<Tensor<B, D>>,
    term: Tensor<B, D>,
    sign: f64,
    matching: RmsMatching,
) -> PairWrite<B, D> {
    let (cumulative, cumulative_mean_square) = with_mean_square(B::signed_sum_with_mean_square(
        cumulative,
        term.clone(),
        1.0,
    ));
    let detail =
        detail.map(|detail| with_mean_square(B::signed_sum_with_mean_square(detail, term, sign)));
    let detail_mean_square = detail
        .as_ref()
        .map_or(&cumulative_mean_square, |(_, mean_square)| mean_square);
    let shape = cumulative_mean_square.dims();
    let tokens = shape.iter().product();
    let (multiplier, matched_mean_square) = B::rms_match_multiplier(
        cumulative_mean_square.clone().reshape([tokens, 1]),
        detail_mean_square.clone().reshape([tokens, 1]),
        matching.gamma,
        matching.epsilon,
    );
    PairWrite {
        cumulative,
        cumulative_mean_square,
        detail,
        multiplier: multiplier.reshape(shape),
        matched_mean_square: matched_mean_square.reshape(shape),
    }
}

/// A sum with the mean square formed beside it, or one formed now.
fn with_mean_square<B: SourceWriteBackend, const D: usize>(
    (sum, mean_square): (Tensor<B, D>, Option<Tensor<B, D>>),
) -> (Tensor<B, D>, Tensor<B, D>) {
    let mean_square = mean_square.unwrap_or_else(|| {
        let mut shape = sum.dims();
        let d_model = shape[D - 1];
        let rows = sum
            .clone()
            .reshape([sum.shape().num_elements() / d_model, d_model]);
        shape[D - 1] = 1;
        B::row_mean_square(rows).reshape(shape)
    });
    (sum, mean_square)
}
