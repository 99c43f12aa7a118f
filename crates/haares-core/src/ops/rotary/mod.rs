//! RoPE with a scale (App. A): every interleaved pair `(x_{2i}, x_{2i+1})` of every head turned by
//! its position's angle, then scaled, `y = s (x ⊙ cos + (x P) ⊙ sin)`; the scale carries
//! attention's `1/√d_h` on the queries. One differentiable operation, on separate heads and on a
//! packed `[batch, seq, 3·heads, d_h]` projection (the queries' heads turned and scaled, the
//! keys' turned, the values' as they are).
//!
//! - [`naive`]: the reference, `x P` as one small matrix product ([`MatmulBackend`] is its bound).
//! - `flex.rs`: one loop over the pairs, a task of whole positions on Rayon's pool.
//! - `cube.rs`: one thread per element, one launch each way; one launch on a packed projection.
//! - `autodiff.rs`: one graph node.
//!
//! `tests/core/rotary_checks.rs` checks the backend's operation and its node against f64 and the
//! reference; `tests/core/rotary.rs` runs it on NdArray f64 and Flex, `tests/portability.rs` on
//! NdArray f32, Flex, wgpu and CUDA.

mod autodiff;
#[cfg(feature = "cube")]
pub(super) mod cube;
#[cfg(feature = "flex")]
mod flex;
pub mod naive;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(super) mod sources;

use crate::ops::MatmulBackend;
use burn::tensor::Tensor;

/// A backend that computes RoPE as one operation each way, on separate heads and on a packed
/// projection. Every Burn backend can implement it with the defaults, the plain operations of
/// [`naive`].
pub trait RotaryBackend: MatmulBackend {
    /// RoPE with a scale (App. A; [`crate::rotary::RotaryTable`]): every interleaved pair
    /// `(x_{2i}, x_{2i+1})` of every head turned by its position's angle, then scaled,
    /// `y = s (x ⊙ cos + (x P) ⊙ sin)`, where `x P = (−x₁, x₀, −x₃, x₂, …)` turns each pair a
    /// quarter turn. The scale carries attention's `1/√d_h` on the queries.
    ///
    /// # Shapes
    /// - x, output: `[batch, seq, heads, d_h]`
    /// - cos, sin: `[max_seq_len, heads · d_h]`, `seq ≤ max_seq_len` (the table's rows from 0)
    /// - quarter_turn: `[d_h, d_h]`
    fn rotary(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        naive::rotary(x, cos, sin, quarter_turn, scale)
    }

    /// `∂L/∂x` of [`rotary`](Self::rotary) given `∂L/∂y`: each pair turned back by its angle and
    /// scaled, `∂x = s (∂y ⊙ cos − (∂y P) ⊙ sin)` (a rotation's inverse is its transpose).
    ///
    /// # Shapes
    /// - grad, output: `[batch, seq, heads, d_h]`; the tables as for [`rotary`](Self::rotary)
    fn rotary_backward(
        grad: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        naive::rotary_backward(grad, cos, sin, quarter_turn, scale)
    }

    /// RoPE on a packed `[batch, seq, 3·heads, d_h]` projection: the queries' heads turned and
    /// scaled by `query_scale`, the keys' turned, the values' as they are.
    fn rotary_packed(
        qkv: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        naive::rotary_packed(qkv, cos, sin, quarter_turn, query_scale)
    }

    /// The packed projection's gradient from the attention's `[∂Q, ∂K, ∂V]`: the first two
    /// turned back ([`rotary_backward`](Self::rotary_backward)), the three joined along the
    /// heads, `[batch, seq, 3·heads, d_h]`.
    fn rotary_join(
        gradients: [Tensor<Self, 4>; 3],
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        naive::rotary_join(gradients, cos, sin, quarter_turn, query_scale)
    }
}

uses_the_reference!(RotaryBackend on ndarray, fusion);
