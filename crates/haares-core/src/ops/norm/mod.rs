//! Affine RMSNorm over rows, `y = x / sqrt(mean(x²) + ε) ⊙ w` (tab:reprobackbone), as one
//! differentiable operation with its own backward pass: one kernel launch each way on the cube
//! backends, where its tensor operations are as many launches.
//!
//! - [`naive`]: the reference, in Burn's tensor operations (NdArray runs it).
//! - `flex.rs`: SIMD loops over whole rows on Rayon's pool.
//! - `cube.rs`: one cube per row, the row's sums reduced in shared memory.
//! - `autodiff.rs`: one graph node.
//!
//! `tests/core/norm_checks.rs` checks the backend's operation and its node against f64 and the
//! reference; `tests/core/norm.rs` runs it on NdArray f64 and Flex, `tests/portability.rs` on
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

/// A backend that computes affine RMSNorm as one operation each way. Every Burn backend can
/// implement it with the defaults, the plain operations of [`naive`].
pub trait NormBackend: Backend {
    /// Affine RMSNorm over the rows of `x`: `y = x / sqrt(mean(x²) + ε) ⊙ w` (tab:reprobackbone;
    /// [`crate::norm::RmsNorm`]).
    ///
    /// # Shapes
    /// - x, output: `[rows, d]`
    /// - weight: `[d]`
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        naive::rms_norm(x, weight, epsilon)
    }

    /// The gradients `(∂L/∂x, ∂L/∂w)` of [`rms_norm`](Self::rms_norm), given `∂L/∂y`: with
    /// `r = 1 / sqrt(mean(x²) + ε)` and `x̂ = x r` per row, `∂x = r (∂y⊙w − x̂ mean(∂y⊙w⊙x̂))` and
    /// `∂w = Σ_rows ∂y⊙x̂`.
    ///
    /// # Shapes
    /// - x, grad, `∂x`: `[rows, d]`
    /// - weight, `∂w`: `[d]`
    fn rms_norm_backward(
        x: Tensor<Self, 2>,
        weight: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        naive::rms_norm_backward(x, weight, grad, epsilon)
    }
}

uses_the_reference!(NormBackend on ndarray, fusion);
