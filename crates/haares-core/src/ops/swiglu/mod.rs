//! SwiGLU's gated product `h = SiLU(g) ⊙ u`, `SiLU(g) = g σ(g)` (App. A), as one differentiable
//! operation with its own backward pass:
//!
//! ```text
//! h = g σ(g) ⊙ u        ∂g = ∂h ⊙ u ⊙ σ(g) (1 + g (1 − σ(g))),   ∂u = ∂h ⊙ g σ(g)
//! ```
//!
//! The forward pass reads its inputs once and writes its output once; the backward pass keeps
//! only the inputs (which the products keep anyway) and evaluates the sigmoid again, where Burn's
//! autodiff of the plain form ([`naive`]) keeps a sigmoid node and two products. On a packed
//! `[rows, 2 d_ff]` projection `[G U]` it reads both halves in place.
//!
//! - [`naive`]: the reference, in Burn's tensor operations.
//! - `flex.rs`: SIMD loops with a vectorised exponential (Flex's own calls libm's scalar `expf`).
//! - `cube.rs`: one CubeCL kernel per direction, and one for the packed backward pass.
//! - `autodiff.rs`: one graph node each, separate and packed.
//!
//! `tests/core/swiglu_checks.rs` checks the backend's operation and its node against f64 and the
//! reference; `tests/core/swiglu.rs` runs it on NdArray f64 and Flex, `tests/portability.rs` on
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

/// A backend that computes SwiGLU as one operation each way. Every Burn backend can implement it
/// with the defaults, the plain operations of [`naive`].
pub trait SwigluBackend: Backend {
    /// SwiGLU's gated product `SiLU(gate) ⊙ up`, with `SiLU(g) = g σ(g)`.
    ///
    /// # Shapes
    /// - gate, up, output: the same shape
    fn swiglu<const D: usize>(gate: Tensor<Self, D>, up: Tensor<Self, D>) -> Tensor<Self, D> {
        naive::swiglu(gate, up)
    }

    /// The gradients `(∂L/∂gate, ∂L/∂up)` of [`swiglu`](Self::swiglu), given `∂L/∂h`.
    ///
    /// # Shapes
    /// - gate, up, grad and both outputs: the same shape
    fn swiglu_backward<const D: usize>(
        gate: Tensor<Self, D>,
        up: Tensor<Self, D>,
        grad: Tensor<Self, D>,
    ) -> (Tensor<Self, D>, Tensor<Self, D>) {
        naive::swiglu_backward(gate, up, grad)
    }

    /// [`swiglu`](Self::swiglu) of the halves of a packed `[rows, 2 d_ff]` projection
    /// `[G U]`: `SiLU(G) ⊙ U`, `[rows, d_ff]`.
    fn swiglu_packed(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        naive::swiglu_packed(gate_up)
    }

    /// `[∂G ∂U]` of [`swiglu_packed`](Self::swiglu_packed) given `∂L/∂h`.
    fn swiglu_packed_backward(gate_up: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
        naive::swiglu_packed_backward(gate_up, grad)
    }
}

uses_the_reference!(SwigluBackend on ndarray, fusion);
