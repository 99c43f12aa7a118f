//! A read in plain tensor operations over the backend's slot sums: the scores and the mixture as
//! two operations with their own backward passes (what the autodiff nodes of `autodiff.rs` run),
//! and the whole read as their composition with Burn's softmax between them, the default and the
//! reference the faster paths are tested against.
//!
//! As two operations with a softmax between them, the forward pass reads every slot twice (the
//! scores, then the mixture) and the backward pass reads it twice more and adds into its
//! accumulated gradient twice (the mixture's share, then the scores'). As one operation a
//! backend can go token by token instead: score, normalise and mix a token's slot rows while they
//! are in cache, and in the backward pass form each slot row's whole gradient, both shares, in one
//! update.

use burn::tensor::Tensor;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;

use super::{
    ReadBackward, ReadBias, ReadForward, ReadGradients, ReadNorm, ReadQuery, RoutingBackend,
    bias_gradient,
};
use crate::ops::routing::{SlotRows, mean_squares, raws, scales, slot_column};

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

/// The read as the scores, the bias, Burn's softmax over slots and the mixture, then the norm
/// where it has one ([`NormBackend::rms_norm`](crate::ops::NormBackend::rms_norm)).
pub fn compose<B: RoutingBackend>(
    slots: &[SlotRows<B>],
    query: &ReadQuery<B>,
    bias: Option<&ReadBias<B>>,
    epsilon: f64,
    norm: Option<&ReadNorm<B>>,
) -> ReadForward<B> {
    let scores = B::routing_scores(slots, query.folded(), epsilon);
    let logits = match bias {
        Some(bias) => scores.clone() + bias.column(),
        None => scores.clone(),
    };
    let weights = softmax(logits, 0);
    let mixture = B::routing_mixture(slots, weights.clone());
    ReadForward {
        normed: norm.map(|norm| B::rms_norm(mixture.clone(), norm.gain.clone(), norm.epsilon)),
        mixture,
        weights,
        scores,
    }
}

/// The backward pass of [`compose`]: the norm's where the read has one, the mixture's, the
/// softmax's (`∂(z' + b) = α ⊙ (∂α − Σ_s α_s ∂α_s)`), then the scores', and the query's two
/// vectors' from the folded query's. Slot gradients are added to `into`.
pub fn compose_backward<B: RoutingBackend>(
    read: ReadBackward<B>,
    into: Vec<Option<Tensor<B, 2>>>,
    wanted: &[bool],
    mean_squares_wanted: &[bool],
) -> ReadGradients<B> {
    let (read, gain) = read.without_norm();
    let slots = &read.slots;
    let fold = read.fold_mean_squares;
    // Folding needs the mean-square gradient of every slot whose rows want one.
    let mean_squares_wanted: Vec<bool> = match fold {
        true => wanted.to_vec(),
        false => mean_squares_wanted.to_vec(),
    };
    let (into, mixture_weights_grad) =
        mixture_backward(slots, read.weights.clone(), read.mixture_grad, into, wanted);
    let weights_grad = match read.weights_grad {
        Some(grad) => mixture_weights_grad + grad,
        None => mixture_weights_grad,
    };
    let along_slots = (read.weights.clone() * weights_grad.clone()).sum_dim(0);
    let logits_grad = read.weights * (weights_grad - along_slots);
    let coefficients = scales(slots) / (mean_squares(slots) + read.epsilon).sqrt();
    let forward = ScoresForward {
        scores: read.scores,
        coefficients,
        epsilon: read.epsilon,
    };
    let bias = read
        .bias_wanted
        .then(|| bias_gradient(logits_grad.clone().sum_dim(1), &read.biased_slots));
    let scores = scores_backward(
        slots,
        read.query.folded(),
        forward,
        logits_grad,
        into,
        wanted,
        &mean_squares_wanted,
    );
    let (raws, mean_squares) = match fold {
        true => (
            fold_mean_squares(slots, scores.raws, scores.mean_squares),
            vec![None; slots.len()],
        ),
        false => (scores.raws, scores.mean_squares),
    };
    ReadGradients {
        raws,
        mean_squares,
        query: read.query.gradients(scores.folded_query),
        bias,
        gain,
    }
}

/// `∂raw_s + (2/d)(∂m_s c_s²) raw_s` for each slot with both gradients: the mean square's
/// gradient taken through the rows it was computed from, by the mean square's own backward pass
/// ([`RoutingBackend::row_mean_square_backward`], one launch on the cube backends).
fn fold_mean_squares<B: RoutingBackend>(
    slots: &[SlotRows<B>],
    raws: Vec<Option<Tensor<B, 2>>>,
    mean_squares: Vec<Option<Tensor<B, 2>>>,
) -> Vec<Option<Tensor<B, 2>>> {
    raws.into_iter()
        .zip(mean_squares)
        .zip(slots)
        .map(
            |((raw_grad, mean_square_grad), slot)| match (raw_grad, mean_square_grad) {
                (Some(raw_grad), Some(mean_square_grad)) => {
                    let grad = match &slot.scale {
                        Some(scale) => mean_square_grad * scale.clone() * scale.clone(),
                        None => mean_square_grad,
                    };
                    Some(B::row_mean_square_backward(
                        Some(raw_grad),
                        grad,
                        slot.raw.clone(),
                    ))
                }
                (raw_grad, _) => raw_grad,
            },
        )
        .collect()
}
