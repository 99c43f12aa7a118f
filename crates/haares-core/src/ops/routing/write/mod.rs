//! A source's write and what its next read needs: eq:update's signed sum `C ← C + u`,
//! `D ← D + s·u`, the mean square a source's key norm divides by, and eq:rmsmatch's multiplier;
//! for a HAARES pair, all of them as one operation.
//!
//! As separate operations a write launches the cumulative sum, the detail's sum and the
//! multiplier: three launches per event in a block's late half, two in its early half (where the
//! detail is the cumulative sum itself), on a cube backend. All three read only the token's own
//! row, so a cube backend does them in one.
//!
//! - [`naive`]: the reference, in Burn's tensor operations.
//! - `flex.rs`: the signed sum as one SIMD pass.
//! - `cube.rs`: one kernel per write, mean squares and multiplier included.
//! - `autodiff.rs`: the sums and mean squares as graph nodes whose backward passes add into the
//!   gradient a source has accumulated.
//!
//! `tests/core/source_write_checks.rs` checks every backend's write against f64 (NdArray, Flex,
//! wgpu and CUDA, from `tests/portability.rs`); `tests/core/source_write.rs` checks Flex's loop and
//! the node against the reference in f64.

mod autodiff;
#[cfg(feature = "cube")]
pub(in crate::ops) mod cube;
#[cfg(feature = "flex")]
mod flex;
pub mod naive;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::ops::SlotSumsBackend;

/// RMS matching's constants (eq:rmsmatch): the clip `γ` and the `ε` added to `RMS(D)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsMatching {
    /// The clip `γ`: the multiplier stays in `[1/γ, γ]`.
    pub gamma: f64,
    /// The `ε` of the multiplier's denominator `RMS(D) + ε`.
    pub epsilon: f64,
}

/// What [`SourceWriteBackend::pair_write`] returns: the new pair, each sum's mean square over the
/// last dimension, and the detail's multiplier.
///
/// # Shapes
/// - cumulative, detail: the term's shape `[…, d]`; the mean squares and the multiplier: `[…, 1]`
#[derive(Debug, Clone)]
pub struct PairWrite<B: Backend, const D: usize> {
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

/// A backend that computes a source's write. Every Burn backend can implement it with the
/// defaults, the plain operations of [`naive`] over its [slot sums](SlotSumsBackend).
pub trait SourceWriteBackend: SlotSumsBackend {
    /// `sum + sign · term`: the block accumulator's write (eq:update), `C ← C + u` and
    /// `D ← D + s·u`. On the autodiff backend one node whose backward pass adds `sign · ∂L/∂out`
    /// to the gradient `term` has accumulated so far, in one pass: Burn's subtraction negates the
    /// gradient in one pass, and its container adds the result in another.
    ///
    /// # Shapes
    /// - sum, term, output: the same shape
    fn signed_sum<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> Tensor<Self, D> {
        naive::signed_sum(sum, term, sign)
    }

    /// [`signed_sum`](Self::signed_sum) and, where the backend forms it in the same pass, the
    /// sum's mean square over the last dimension (`[…, 1]`): the mean square the new `C` or `D`
    /// will be read with, as [`row_mean_square`](Self::row_mean_square) would compute it. By
    /// default `None` (the source then computes its own); one launch on the cube backends, where
    /// the two would be two. On the autodiff backend the mean square is a node of its own over
    /// the sum, with [`row_mean_square`](Self::row_mean_square)'s backward pass, which runs only
    /// where a gradient reaches it (a read that does not fold it).
    ///
    /// # Shapes
    /// - sum, term, output: the same shape; mean square: that shape with a last dimension of 1
    fn signed_sum_with_mean_square<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        (Self::signed_sum(sum, term, sign), None)
    }

    /// `mean(rows²)` per token: the mean square a source's key norm divides by
    /// (eq:routingweights), computed once per source. A row dot product of the rows with
    /// themselves, so every backend's `row_dots` serves; on the autodiff backend one node whose
    /// backward pass adds `(2/d)·g ⊗ rows` to the rows' accumulated gradient.
    ///
    /// # Shapes
    /// - rows: `[tokens, d]`
    /// - output: `[tokens, 1]`
    fn row_mean_square(rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let sums = Self::row_dots(std::slice::from_ref(&rows), rows.clone());
        sums.reshape([tokens, 1]).div_scalar(d_model as f64)
    }

    /// The backward pass of [`row_mean_square`](Self::row_mean_square): `into + (2/d)·g ⊗ rows`
    /// (`∂ mean(x²)/∂x = (2/d)·x` per token), added to the gradient the rows have accumulated so
    /// far where there is one.
    ///
    /// # Shapes
    /// - into, rows, output: `[tokens, d]`; grad: `[tokens, 1]`
    fn row_mean_square_backward(
        into: Option<Tensor<Self, 2>>,
        grad: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let column = grad.reshape([1, tokens]).mul_scalar(2.0 / d_model as f64);
        Self::add_scaled_rows(vec![into], column, rows, &[true])
            .pop()
            .flatten()
            .expect("a wanted slot has a gradient")
    }

    /// eq:rmsmatch's multiplier from the two mean squares the fused router holds,
    /// `a = clip(√m_C / (√m_D + ε), 1/γ, γ)` per token, a constant with no gradient (the
    /// equation's stop-gradient), and the matched detail's mean square `m_D · a²`, whose gradient
    /// reaches `m_D` (times `a²`). By default the tensor operations (on lavapipe nine launches
    /// for `a`, and a product); one kernel on the cube backends, and on the autodiff backend the
    /// inner backend's values with a node for the matched mean square alone.
    ///
    /// # Shapes
    /// - cumulative_mean_square, detail_mean_square: `[tokens, 1]`
    /// - output: `(a, m_D · a²)`, each `[tokens, 1]`
    fn rms_match_multiplier(
        cumulative_mean_square: Tensor<Self, 2>,
        detail_mean_square: Tensor<Self, 2>,
        gamma: f64,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let ratio = cumulative_mean_square.detach().sqrt()
            / (detail_mean_square.clone().detach().sqrt() + epsilon);
        let multiplier = ratio.clamp(1.0 / gamma, gamma).detach();
        let matched = detail_mean_square * multiplier.clone().square();
        (multiplier, matched)
    }

    /// One write of a HAARES block's pair with what its next read needs ([`PairWrite`]):
    /// eq:update's `C ← C + u` and `D ← D + s·u`, the mean square of each new sum, and
    /// eq:rmsmatch's multiplier with the matched detail's mean square. `detail` is `None` while
    /// the detail is the cumulative sum itself (every sign so far `+1`, and `sign` is `+1`): the
    /// new detail is then the new `C`, and the multiplier compares `C` with itself. By default
    /// the operations ([`naive::compose`]); one launch on the cube backends, where they are
    /// three; on the autodiff backend the inner backend's values with the operations' nodes.
    ///
    /// # Shapes
    /// - cumulative, detail, term: the same shape `[…, d]`
    fn pair_write<const D: usize>(
        cumulative: Tensor<Self, D>,
        detail: Option<Tensor<Self, D>>,
        term: Tensor<Self, D>,
        sign: f64,
        matching: RmsMatching,
    ) -> PairWrite<Self, D> {
        naive::compose(cumulative, detail, term, sign, matching)
    }
}

uses_the_reference!(SourceWriteBackend on ndarray, fusion);
