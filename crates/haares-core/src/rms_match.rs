//! RMS matching of the detail to its cumulative source (eq:rmsmatch).

use burn::tensor::{Tensor, backend::Backend};

use crate::norm::rms;
use crate::ops::HaaresBackend;
use crate::source_bank::{Source, rows};

/// eq:rmsmatch: `D̂ = D · sg[clip(RMS(C) / (RMS(D) + ε), 1/γ, γ)]`.
///
/// The RMS is taken over the hidden (last) dimension separately at every (batch, position)
/// (docs/decisions.md, decision 1: the only choice that keeps the model causal), in the backend's
/// float type (fp32 in training). The multiplier is detached, so the gradient with respect to `D`
/// is exactly `a·I` and nothing flows into `C`. Degenerate cases follow from the formula:
/// `C = 0, D ≠ 0` gives `D/γ`, and `D = 0` stays `0`.
///
/// # Shapes
/// - detail, cumulative: `[..., d]`
/// - output: `[..., d]`
pub fn rms_match<B: Backend, const D: usize>(
    detail: Tensor<B, D>,
    cumulative: Tensor<B, D>,
    gamma: f64,
    epsilon: f64,
) -> Tensor<B, D> {
    let multiplier = rms_match_multiplier(detail.clone(), cumulative, gamma, epsilon);
    detail * multiplier
}

/// The detached multiplier `a = sg[clip(RMS(C) / (RMS(D) + ε), 1/γ, γ)]` of eq:rmsmatch.
///
/// # Shapes
/// - detail, cumulative: `[..., d]`
/// - output: `[..., 1]`
pub fn rms_match_multiplier<B: Backend, const D: usize>(
    detail: Tensor<B, D>,
    cumulative: Tensor<B, D>,
    gamma: f64,
    epsilon: f64,
) -> Tensor<B, D> {
    let ratio = rms(cumulative.detach()) / (rms(detail.detach()) + epsilon);
    ratio.clamp(1.0 / gamma, gamma).detach()
}

/// eq:rmsmatch from the mean squares the fused router already holds: the multiplier `a =
/// sg[clip(√mean(C²) / (√mean(D²) + ε), 1/γ, γ)]` needs no further pass over `C` or `D`, the
/// matched detail's own mean square is `a² · mean(D²)`, and `D̂ = a·D` is handed over as `D` with
/// the per-token scale `a` ([`Source::rescaled`]), so it is never formed: the fused router applies
/// `a` to its per-token scalars. The multiplier and the matched mean square are the backend's
/// [`SourceWriteBackend::rms_match_multiplier`](crate::ops::SourceWriteBackend::rms_match_multiplier)
/// (one kernel on the GPU backends).
///
/// # Shapes
/// - detail value: `[batch, seq, d]`; cumulative mean square: `[batch, seq, 1]`
/// - output: the slot `a·D`, with its mean square `[batch, seq, 1]`
pub fn rms_match_source<B: HaaresBackend>(
    detail: Source<B>,
    cumulative_mean_square: Tensor<B, 3>,
    gamma: f64,
    epsilon: f64,
) -> Source<B> {
    let shape = cumulative_mean_square.dims();
    let detail_mean_square = detail.mean_square();
    let (multiplier, matched_mean_square) = B::rms_match_multiplier(
        rows(cumulative_mean_square),
        rows(detail_mean_square),
        gamma,
        epsilon,
    );
    detail.rescaled(
        multiplier.reshape(shape),
        matched_mean_square.reshape(shape),
    )
}
