//! One write of a HAARES block's pair (eq:update) together with what the pair's next read needs:
//! the mean squares of the new `C` and `D`, and RMS matching's multiplier for `D` (eq:rmsmatch).
//!
//! As separate operations a write launches the cumulative sum, the detail's sum and the
//! multiplier: three launches per event in a block's late half, two in its early half (where the
//! detail is the cumulative sum itself), on a cube backend. All three read only the token's own
//! row, so a cube backend does them in one (`cube_rows.rs`); the composition here is the reference
//! it is tested against and what every other backend runs.

use burn::tensor::Tensor;

use super::RoutingBackend;

/// RMS matching's constants (eq:rmsmatch): the clip `γ` and the `ε` added to `RMS(D)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsMatching {
    /// The clip `γ`: the multiplier stays in `[1/γ, γ]`.
    pub gamma: f64,
    /// The `ε` of the multiplier's denominator `RMS(D) + ε`.
    pub epsilon: f64,
}

/// What [`RoutingBackend::pair_write`] returns: the new pair, each sum's mean square over the
/// last dimension, and the detail's multiplier.
///
/// # Shapes
/// - cumulative, detail: the term's shape `[…, d]`; the mean squares and the multiplier: `[…, 1]`
#[derive(Debug, Clone)]
pub struct PairWrite<B: RoutingBackend, const D: usize> {
    /// `C + u`.
    pub cumulative: Tensor<B, D>,
    /// `mean((C + u)²)`.
    pub cumulative_mean_square: Tensor<B, D>,
    /// `D + s·u` and its mean square; `None` where the detail is the cumulative sum itself.
    pub detail: Option<(Tensor<B, D>, Tensor<B, D>)>,
    /// eq:rmsmatch's `a = clip(√m_C / (√m_D + ε), 1/γ, γ)` for the new pair, a constant with no
    /// gradient.
    pub multiplier: Tensor<B, D>,
    /// The matched detail's mean square `m_D · a²`, whose gradient reaches `m_D`.
    pub matched_mean_square: Tensor<B, D>,
}

/// [`RoutingBackend::pair_write`] as its operations: the two signed sums with the mean squares
/// the backend forms with them (or [`RoutingBackend::row_mean_square`] where it forms none), then
/// [`RoutingBackend::rms_match_multiplier`].
pub fn compose<B: RoutingBackend, const D: usize>(
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
fn with_mean_square<B: RoutingBackend, const D: usize>(
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
