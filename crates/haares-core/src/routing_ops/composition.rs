//! The scores' and the mixture's backward passes and the scores' forward pass as tensor
//! operations over the backend's primitives, with the per-slot gatherings they use: the parts of
//! the composition (`read.rs`) and of the autodiff nodes (`autodiff.rs`).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{RoutingBackend, SlotRows};

/// The forward pass of [`RoutingBackend::routing_scores`] with what its backward pass reuses.
#[derive(Debug, Clone)]
pub(crate) struct ScoresForward<B: Backend> {
    /// `z'`, `[S, tokens]`.
    pub scores: Tensor<B, 2>,
    /// `c / √(m + ε)`, `[S, tokens]`: the factor from a dot product to its score.
    pub coefficients: Tensor<B, 2>,
    /// The key norm's ε.
    pub epsilon: f64,
}

pub(crate) fn scores_forward<B: RoutingBackend>(
    slots: &[SlotRows<B>],
    folded_query: Tensor<B, 1>,
    epsilon: f64,
) -> ScoresForward<B> {
    let d_model = folded_query.dims()[0];
    let dots = B::row_dots(&raws(slots), folded_query.reshape([1, d_model]));
    // A division, not a multiplication by `recip`: Burn's NdArray computes an f32 `recip` with the
    // approximate SIMD instruction (≈ 1e-4 relative error).
    let coefficients = scales(slots) / (mean_squares(slots) + epsilon).sqrt();
    ScoresForward {
        scores: dots * coefficients.clone(),
        coefficients,
        epsilon,
    }
}

/// Gradients of [`RoutingBackend::routing_scores`] with respect to its inputs.
pub(crate) struct ScoresGradients<B: Backend> {
    /// `∂L/∂raw_s`, `[tokens, d]`, for the slots asked for.
    pub raws: Vec<Option<Tensor<B, 2>>>,
    /// `∂L/∂m_s`, `[tokens, 1]`, for the slots asked for.
    pub mean_squares: Vec<Option<Tensor<B, 2>>>,
    /// `∂L/∂u`, `[d]`.
    pub folded_query: Tensor<B, 1>,
}

/// The backward pass of the scores, from the sources: with `g = ∂L/∂z'` and `w = g ⊙ c/√(m + ε)`,
/// `∂L/∂raw_s = w_s ⊗ u`, `∂L/∂m_s = −½ g_s ⊙ z'_s / (m_s + ε)` and `∂L/∂u = Σ_s raw_sᵀ w_s`.
/// Each `∂L/∂raw_s` is added to `into_s`, the gradient the slot's source has accumulated so far.
pub(crate) fn scores_backward<B: RoutingBackend>(
    slots: &[SlotRows<B>],
    folded_query: Tensor<B, 1>,
    forward: ScoresForward<B>,
    grad: Tensor<B, 2>,
    into: Vec<Option<Tensor<B, 2>>>,
    wanted: &[bool],
    mean_squares_wanted: &[bool],
) -> ScoresGradients<B> {
    let [_, tokens] = grad.dims();
    let d_model = folded_query.dims()[0];
    let query_row = folded_query.reshape([1, d_model]);
    let dot_grads = grad.clone() * forward.coefficients;
    let raws_grads = B::add_scaled_rows(into, dot_grads.clone(), query_row, wanted);
    let mean_square_grads =
        (grad * forward.scores / (mean_squares(slots) + forward.epsilon)) * -0.5;
    let mean_squares = (0..slots.len())
        .map(|slot| {
            mean_squares_wanted[slot].then(|| slot_column(&mean_square_grads, slot, tokens))
        })
        .collect();
    ScoresGradients {
        raws: raws_grads,
        mean_squares,
        folded_query: B::weighted_total(&raws(slots), dot_grads),
    }
}

/// The backward pass of the mixture: with `g = ∂L/∂h̃`, `∂L/∂raw_s = g ⊙ α_s c_s` and
/// `∂L/∂α_s = c_s ⊙ (g · raw_s)` per token. Returns the slot gradients asked for (each added to
/// `into_s`, as in [`scores_backward`]) and `∂L/∂α`.
pub(crate) fn mixture_backward<B: RoutingBackend>(
    slots: &[SlotRows<B>],
    weights: Tensor<B, 2>,
    grad: Tensor<B, 2>,
    into: Vec<Option<Tensor<B, 2>>>,
    wanted: &[bool],
) -> (Vec<Option<Tensor<B, 2>>>, Tensor<B, 2>) {
    let scales = scales(slots);
    let raws_grads = B::add_scaled_rows(into, weights * scales.clone(), grad.clone(), wanted);
    let weights_grad = B::row_dots(&raws(slots), grad) * scales;
    (raws_grads, weights_grad)
}

/// Row `slot` of an `[S, tokens]` tensor as a `[tokens, 1]` column (contiguous, no copy).
pub(super) fn slot_column<B: Backend>(
    slot_major: &Tensor<B, 2>,
    slot: usize,
    tokens: usize,
) -> Tensor<B, 2> {
    slot_major.clone().narrow(0, slot, 1).reshape([tokens, 1])
}

pub(super) fn raws<B: Backend>(slots: &[SlotRows<B>]) -> Vec<Tensor<B, 2>> {
    slots.iter().map(|slot| slot.raw.clone()).collect()
}

/// Per-slot rows of `[tokens, 1]` columns, `[S, tokens]`.
fn slot_major<B: Backend>(columns: impl Iterator<Item = Tensor<B, 2>>) -> Tensor<B, 2> {
    let rows: Vec<_> = columns
        .map(|column| {
            let tokens = column.dims()[0];
            column.reshape([1, tokens])
        })
        .collect();
    Tensor::cat(rows, 0)
}

/// Every slot's scale (1 where it has none), `[S, tokens]`.
pub(crate) fn scales<B: Backend>(slots: &[SlotRows<B>]) -> Tensor<B, 2> {
    slot_major(slots.iter().map(|slot| match &slot.scale {
        Some(scale) => scale.clone(),
        None => slot.mean_square.ones_like(),
    }))
}

pub(crate) fn mean_squares<B: Backend>(slots: &[SlotRows<B>]) -> Tensor<B, 2> {
    slot_major(slots.iter().map(|slot| slot.mean_square.clone()))
}
