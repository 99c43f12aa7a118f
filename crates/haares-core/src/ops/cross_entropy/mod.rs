//! The weighted cross-entropy of the tied head's logits at their targets (the training
//! objective's terms; docs/decisions.md, decision 11):
//!
//! ```text
//! loss_r = w_r (lse_r − x_r,target_r),  lse_r = ln Σ_k e^{x_rk}     ∂x_rk = g_r w_r (e^{x_rk − lse_r} − [k = target_r])
//! ```
//!
//! Where a backend fuses it, one operation that keeps only the logits and each row's
//! log-sum-exp; elsewhere Burn's `log_softmax` and `gather`.
//!
//! - [`naive`]: the reference.
//! - `cube.rs`: one cube per row of logits, one launch each way, and one cube for the loss's total
//!   over the rows.
//! - `autodiff.rs`: one graph node.
//!
//! `tests/core/cross_entropy_checks.rs` checks the backend's operation and its nodes against f64
//! and the reference; `tests/core/cross_entropy.rs` runs it on NdArray f64 and Flex,
//! `tests/portability.rs` on NdArray f32, Flex, wgpu and CUDA.

mod autodiff;
#[cfg(feature = "cube")]
pub(super) mod cube;
pub mod naive;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(super) mod sources;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// A backend that computes the tied head's weighted cross-entropy, fused where it can. Every Burn
/// backend can implement it with the defaults, the plain operations of [`naive`].
pub trait CrossEntropyBackend: Backend {
    /// The cross-entropy of every row of the tied head's logits at its target, weighted:
    /// `w_r (ln Σ_k e^{x_rk} − x_r,target_r)` (the training objective's terms; docs/decisions.md,
    /// decision 11, with the pad mask as the weights). Where the backend fuses it
    /// ([`fuses_cross_entropy`](Self::fuses_cross_entropy)) it is
    /// [`cross_entropy_forward`](Self::cross_entropy_forward), and the autodiff backend makes it
    /// one node whose backward pass is [`cross_entropy_backward`](Self::cross_entropy_backward);
    /// elsewhere it is the plain operations ([`naive::cross_entropy`]). Targets must lie in the
    /// vocabulary.
    ///
    /// # Shapes
    /// - logits: `[rows, vocab]`
    /// - targets, weights, output: `[rows]`
    fn cross_entropy(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> Tensor<Self, 1> {
        match Self::fuses_cross_entropy() {
            true => Self::cross_entropy_forward(logits, targets, weights).0,
            false => naive::cross_entropy(logits, targets, weights),
        }
    }

    /// The sum of [`cross_entropy`](Self::cross_entropy) over the rows, `Σ_r w_r (lse_r −
    /// x_r,target_r)`: the numerator of the training loss (decision 11). Where the backend fuses
    /// the cross-entropy, the fused forward pass and [`loss_total`](Self::loss_total), and under
    /// autodiff one node whose backward pass hands every row the sum's gradient; elsewhere the
    /// plain operations and Burn's `sum`.
    ///
    /// # Shapes
    /// - logits: `[rows, vocab]`
    /// - targets, weights: `[rows]`
    /// - output: `[1]`
    fn summed_cross_entropy(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> Tensor<Self, 1> {
        match Self::fuses_cross_entropy() {
            true => Self::loss_total(Self::cross_entropy_forward(logits, targets, weights).0),
            false => naive::loss_total(naive::cross_entropy(logits, targets, weights)),
        }
    }

    /// `Σ_r losses_r`, the fused forward pass's losses summed: [`naive::loss_total`] (Burn's
    /// `sum`) unless the backend has a kernel for it (the cube backends, `cube.rs`).
    ///
    /// # Shapes
    /// - losses: `[rows]`
    /// - output: `[1]`
    fn loss_total(losses: Tensor<Self, 1>) -> Tensor<Self, 1> {
        naive::loss_total(losses)
    }

    /// Whether [`cross_entropy`](Self::cross_entropy) runs as the fused pair: the cube backends'
    /// kernels (`cube.rs`).
    fn fuses_cross_entropy() -> bool {
        false
    }

    /// The fused cross-entropy's forward pass: each row's weighted loss and its log-sum-exp
    /// `ln Σ_k e^{x_rk}`, which is all its backward pass keeps besides the logits.
    ///
    /// # Shapes
    /// - logits: `[rows, vocab]`
    /// - targets, weights, losses, log-sum-exp: `[rows]`
    fn cross_entropy_forward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> (Tensor<Self, 1>, Tensor<Self, 1>) {
        naive::cross_entropy_forward(logits, targets, weights)
    }

    /// `∂L/∂logits` of [`cross_entropy_forward`](Self::cross_entropy_forward)'s losses given
    /// `∂L/∂loss`: `∂x_rk = g_r w_r (e^{x_rk − lse_r} − [k = target_r])`.
    ///
    /// # Shapes
    /// - logits, output: `[rows, vocab]`
    /// - targets, weights, log-sum-exp, grad: `[rows]`
    fn cross_entropy_backward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
        logsumexp: Tensor<Self, 1>,
        grad: Tensor<Self, 1>,
    ) -> Tensor<Self, 2> {
        naive::cross_entropy_backward(logits, targets, weights, logsumexp, grad)
    }
}

uses_the_reference!(CrossEntropyBackend on ndarray, flex, fusion);
