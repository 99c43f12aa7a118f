//! Attention's causal softmax (App. A) as one differentiable operation with its own backward
//! pass, for the plain attention path (the fused one never forms the `[seq, seq]` scores):
//!
//! ```text
//! y_ij = e^{x_ij} / Σ_{k≤i} e^{x_ik} for j ≤ i, 0 after        ∂x_ij = y_ij (∂y_ij − Σ_k y_ik ∂y_ik)
//! ```
//!
//! The backward pass keeps only the output. Written as Burn's operations ([`naive`]) it is a mask
//! addition, a subtraction, an exponential (evaluated again in the backward pass), a sum and a
//! division, each a pass over `[batch, heads, seq, seq]`.
//!
//! - [`naive`]: the reference.
//! - `flex.rs`: SIMD loops, whole matrices to a task.
//! - `cube.rs`: one cube per query row, one launch each way.
//! - `autodiff.rs`: one graph node.
//!
//! `tests/core/softmax_checks.rs` checks the backend's operation and its node against f64 and the
//! reference; `tests/core/softmax.rs` runs it on NdArray f64 and Flex, `tests/portability.rs` on
//! NdArray f32, Flex, wgpu and CUDA.

mod autodiff;
#[cfg(feature = "cube")]
pub(super) mod cube;
#[cfg(feature = "flex")]
mod flex;
pub mod naive;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(super) mod sources;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A backend that computes the causal softmax as one operation each way. Every Burn backend can
/// implement it with the defaults, the plain operations of [`naive`].
pub trait SoftmaxBackend: Backend {
    /// The softmax over the last dimension of scores whose query `i` may see keys `j ≤ i` only:
    /// `softmax(x + M)` for the causal mask `M` (0 on and below the diagonal, −∞ above), zero above
    /// the diagonal. The scores above the diagonal are not read.
    ///
    /// # Shapes
    /// - scores, output: `[..., seq, seq]` (queries, keys)
    fn causal_softmax<const D: usize>(scores: Tensor<Self, D>) -> Tensor<Self, D> {
        naive::causal_softmax(scores)
    }

    /// `∂L/∂x` of [`causal_softmax`](Self::causal_softmax) from its output `y` and `∂L/∂y`.
    ///
    /// # Shapes
    /// - probabilities, grad, output: `[..., seq, seq]`
    fn causal_softmax_backward<const D: usize>(
        probabilities: Tensor<Self, D>,
        grad: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        naive::causal_softmax_backward(probabilities, grad)
    }
}

uses_the_reference!(SoftmaxBackend on ndarray, fusion);
