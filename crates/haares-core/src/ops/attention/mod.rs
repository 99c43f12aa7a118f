//! Causal attention of every head, `softmax(Q Kᵀ + M) V` with the causal mask `M` (App. A), for
//! queries already scaled by `1/√d_h`, in the projections' own `[batch, seq, heads, d_h]`
//! layout, and the move of the heads between the positions' dimension and their own.
//!
//! Where a backend fuses it ([`AttentionBackend::fuses_causal_attention`]), attention is one
//! operation that keeps each query's log-sum-exp and no `[seq, seq]` tensor:
//!
//! ```text
//! O = softmax(S) V,  S = Q Kᵀ + M,  lse_i = ln Σ_{j≤i} e^{S_ij}
//! ∂V = Pᵀ ∂O,  ∂S = P ⊙ (∂O Vᵀ − Δ),  Δ_i = Σ_e ∂O_ie O_ie,  ∂Q = ∂S K,  ∂K = ∂Sᵀ Q
//! ```
//!
//! with `P = e^{S − lse}` recomputed. Elsewhere it is the plain composition: the heads moved, a
//! product, the causal softmax ([`crate::ops::softmax`]), a product, the heads moved back.
//!
//! - [`naive`]: the reference, and the composition NdArray runs.
//! - `flex.rs`: the fused pair on Flex (f32; other float types take the reference), and the
//!   heads' move, written at once in runs of `d_h`.
//!   - `flex_fused.rs`: one pass per sequence and head, the `[seq, seq]` matrices in the task's
//!     own buffers, the masked half of every product skipped.
//!   - `flex_tiles.rs`: its products, blocks of rows with their sums in registers.
//!   - `flex_heads.rs`: a head copied into padded rows, transposed, and written back.
//! - `cube.rs` with `cube/`: the flash-style kernel pair, one launch forward and two backward.
//! - `autodiff.rs`: one graph node, over separate heads or a packed projection with RoPE.
//!
//! `tests/core/attention_checks.rs` checks the backend's operation and its node against f64 and the
//! reference; `tests/core/attention.rs` runs it on NdArray f64 and Flex, `tests/portability.rs` on
//! NdArray f32, Flex, wgpu and CUDA.

mod autodiff;
#[cfg(feature = "cube")]
pub(super) mod cube;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod flex_fused;
#[cfg(feature = "flex")]
mod flex_heads;
#[cfg(feature = "flex")]
mod flex_tiles;
pub mod naive;

use crate::ops::{RotaryBackend, SoftmaxBackend};
use burn::tensor::Tensor;

/// A backend that computes causal attention, fused where it can. Every Burn backend can implement
/// it with the defaults: the plain composition of [`naive`], which RoPE, the softmax and the
/// matrix product it is built from (its supertraits) make fast where they are.
pub trait AttentionBackend: RotaryBackend + SoftmaxBackend {
    /// Causal attention of every head, `softmax(Q Kᵀ + M) V` with the causal mask `M` (App. A;
    /// [`naive::causal_attention_by_head`]), for queries already scaled by `1/√d_h`, with the
    /// heads in the projections' own layout. Where the backend fuses attention at this head
    /// width ([`fuses_causal_attention`](Self::fuses_causal_attention)) it is
    /// [`causal_attention_forward`](Self::causal_attention_forward), and the autodiff backend
    /// makes it one node whose backward pass is
    /// [`causal_attention_backward`](Self::causal_attention_backward); elsewhere it is the plain
    /// operations ([`naive::causal_attention`]), each a node of its own.
    ///
    /// # Shapes
    /// - query, key, value, output: `[batch, seq, heads, d_h]`
    fn causal_attention(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
    ) -> Tensor<Self, 4> {
        match Self::fuses_causal_attention(query.dims()[3]) {
            true => Self::causal_attention_forward(query, key, value).0,
            false => naive::causal_attention(query, key, value),
        }
    }

    /// Whether [`causal_attention`](Self::causal_attention) runs as the fused pair for heads of
    /// width `head_dim`: the cube backends' kernels (`cube.rs`), up to 128, and Flex's pass
    /// (`flex_fused.rs`) at every width. NdArray keeps the plain operations.
    fn fuses_causal_attention(_head_dim: usize) -> bool {
        false
    }

    /// The fused attention's forward pass: the output and each query's log-sum-exp over the
    /// scores it sees, `lse_i = ln Σ_{j ≤ i} e^{q_i · k_j}`, which is all the backward pass keeps
    /// of the softmax (no `[seq, seq]` tensor).
    ///
    /// # Shapes
    /// - query, key, value, output: `[batch, seq, heads, d_h]`
    /// - log-sum-exp: `[batch, seq, heads]`
    fn causal_attention_forward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
    ) -> (Tensor<Self, 4>, Tensor<Self, 3>) {
        naive::causal_attention_forward(query, key, value)
    }

    /// The gradients `[∂Q, ∂K, ∂V]` of
    /// [`causal_attention_forward`](Self::causal_attention_forward)'s output, given `∂L/∂O`: with `P = e^{S − lse}` recomputed from the scores `S = Q Kᵀ`,
    /// `∂V = Pᵀ ∂O`, `∂S = P ⊙ (∂O Vᵀ − Δ)` where `Δ_i = Σ_e ∂O_ie O_ie`, `∂Q = ∂S K` and
    /// `∂K = ∂Sᵀ Q`.
    ///
    /// # Shapes
    /// - query, key, value, output, grad and the three gradients: `[batch, seq, heads, d_h]`
    /// - log-sum-exp: `[batch, seq, heads]`
    fn causal_attention_backward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
        output: Tensor<Self, 4>,
        logsumexp: Tensor<Self, 3>,
        grad: Tensor<Self, 4>,
    ) -> [Tensor<Self, 4>; 3] {
        naive::causal_attention_backward(query, key, value, output, logsumexp, grad)
    }

    /// `x` with its dimensions 1 and 2 swapped: attention's move of the heads in front of the
    /// positions (`[batch, seq, heads, d_h]` → `[batch, heads, seq, d_h]`) and back. Its own
    /// inverse, so it is also its backward pass.
    ///
    /// The plain form is Burn's `swap_dims`, a view. Each use of the view that needs its elements
    /// in order (the reshape that merges the heads, and in the backward pass the reshapes that
    /// split them) then copies it, which Flex does element by element through a strided
    /// iterator: ≈ 4% of a CPU step. Flex writes the swapped tensor at once, in runs of `d_h`
    /// elements.
    ///
    /// # Shapes
    /// - x: `[a, b, c, e]`
    /// - output: `[a, c, b, e]`
    fn swap_heads(x: Tensor<Self, 4>) -> Tensor<Self, 4> {
        naive::swap_heads(x)
    }

    /// [`causal_attention`](Self::causal_attention) of a packed `[batch, seq, 3·heads, d_h]`
    /// projection (the queries' heads, the keys', the values'), with [`rotary`](crate::ops::RotaryBackend::rotary)
    /// on the queries, scaled by `query_scale`, and on the keys: `[batch, seq, heads, d_h]`.
    fn causal_attention_packed(
        qkv: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        naive::causal_attention_packed(qkv, cos, sin, quarter_turn, query_scale)
    }
}

uses_the_reference!(AttentionBackend on ndarray, fusion);
