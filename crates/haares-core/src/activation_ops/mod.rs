//! The backbone's two elementwise operations that dominate a CPU step after the matrix products,
//! each as one differentiable operation with its own backward pass: SwiGLU's gated product
//! `SiLU(gate) ⊙ up` (App. A) and attention's causal softmax; and RMSNorm with its gain and RoPE,
//! one operation each for the cube backends, where their tensor operations are as many kernel
//! launches; and causal attention itself, one operation over the projections' layout that the
//! cube backends run as a flash-style kernel pair (`cube_attention.rs`), and the cross-entropy of
//! the tied head's logits (`cube_cross_entropy.rs`). Beside them, attention's move of
//! its heads between the positions' dimension and their own ([`ActivationBackend::swap_heads`]),
//! a layout change that Flex, given Burn's view, copies slowly, and the matrix product itself
//! ([`ActivationBackend::matmul`]), whose output Flex copies once more than it needs to.
//!
//! Written as Burn tensor operations ([`naive`], the reference), SiLU is a sigmoid node and two
//! products, and Burn's autodiff evaluates the sigmoid again in the backward pass; the softmax is
//! a mask addition, a subtraction, an exponential (evaluated again in the backward pass), a sum
//! and a division. Each is one pass over a `[tokens, d_ff]` or `[batch, heads, seq, seq]` tensor,
//! with a tensor kept for the backward pass. As single operations:
//!
//! ```text
//! swiglu:          h = g σ(g) ⊙ u             ∂g = ∂h ⊙ u ⊙ σ(g) (1 + g (1 − σ(g))),  ∂u = ∂h ⊙ g σ(g)
//! causal_softmax:  y_ij = e^{x_ij} / Σ_{k≤i} e^{x_ik} for j ≤ i, 0 after
//!                  ∂x_ij = y_ij (∂y_ij − Σ_k y_ik ∂y_ik)
//! ```
//!
//! the forward pass reads its inputs once and writes its output once, the backward pass keeps only
//! the inputs (SwiGLU, whose products keep them anyway) or the output (the softmax), and
//! neither evaluates the sigmoid's or softmax's exponentials from a stored copy of an
//! intermediate. Every backend implements the trait with the plain defaults; Flex replaces the
//! four primitives with SIMD loops (`flex.rs`, with a vectorised exponential: Flex's own calls
//! libm's scalar `expf`) and the product with a direct call of its `gemm` kernel
//! (`flex_matmul.rs`), the cube backends (CUDA, wgpu) replace the four with one CubeCL kernel
//! each (`cube.rs`), and the autodiff backend makes each operation one graph node
//! (`autodiff.rs`). `tests/core/activations.rs` and `tests/core/matmul.rs` check the loops and
//! the nodes against the plain operations. On the cube backends the projections of one input are
//! one product, read in place by RoPE, attention and SwiGLU ([`packed`]; `autodiff_packed.rs`,
//! `cube_packed.rs`).

mod autodiff;
mod autodiff_packed;
#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "cube")]
mod cube_attention;
#[cfg(feature = "cube")]
mod cube_cross_entropy;
#[cfg(feature = "cube")]
mod cube_norm;
#[cfg(feature = "cube")]
mod cube_packed;
#[cfg(feature = "cube")]
mod cube_rotary;
#[cfg(feature = "cube")]
mod cube_softmax;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
mod cube_sources;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(crate) use cube_sources::cuda_sources;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod flex_matmul;
pub mod naive;
pub mod packed;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// A backend that computes the backbone's fused activations. Every Burn backend can implement it
/// with the default methods (the plain tensor operations of [`naive`]).
pub trait ActivationBackend: Backend {
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

    /// RoPE with a scale (App. A; [`crate::rope::RotaryTable`]): every interleaved pair
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
    /// width `head_dim`: the cube backends' kernels (`cube_attention.rs`), up to 128. The CPU backends
    /// keep the plain operations, whose products are their fastest kernels.
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

    /// Whether [`cross_entropy`](Self::cross_entropy) runs as the fused pair: the cube backends'
    /// kernels (`cube_cross_entropy.rs`).
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

    /// The matrix product over the last two dimensions, `[..., m, k] · [..., k, n]`, both
    /// operands with the same leading (batch) dimensions: every projection of the backbone (as
    /// `[tokens, d_in] · [d_in, d_out]`), attention's two products, RoPE's quarter turn and the
    /// tied head. Its backward pass is two more products, `∂A = ∂C Bᵀ` and `∂B = Aᵀ ∂C`.
    ///
    /// The plain form is Burn's `matmul`. Flex's allocates each output as zeroed bytes and copies
    /// them into an aligned buffer before writing the product, ≈ 10% of a CPU step; Flex's form
    /// here writes the product into a buffer of its own (`flex_matmul.rs`). A projection written
    /// as one `[tokens, d_in]` product, where Burn's `Linear` multiplies a `[batch, seq, d_in]`
    /// input, also takes its weight's gradient in one product, not one per batch row and a sum.
    ///
    /// # Shapes
    /// - lhs: `[..., m, k]`; rhs: `[..., k, n]`
    /// - output: `[..., m, n]`
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        naive::matmul(lhs, rhs)
    }

    /// `lhs · rhsᵀ` over the last two dimensions: attention's scores `Q Kᵀ` and the tied head's
    /// `h Eᵀ`. As [`matmul`](Self::matmul) of a transposed view it computes the same; as an
    /// operation of its own its backward pass writes `∂rhs = ∂Cᵀ lhs` in `rhs`'s own layout,
    /// where the view's gradient is a transposed view again, which every later use (the heads'
    /// swap, RoPE's reshapes, the embedding's gradient sum) would copy element by element.
    ///
    /// # Shapes
    /// - lhs: `[..., m, k]`; rhs: `[..., n, k]`
    /// - output: `[..., m, n]`
    fn matmul_transposed_rhs<const D: usize>(
        lhs: Tensor<Self, D>,
        rhs: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        Self::matmul(lhs, rhs.swap_dims(D - 2, D - 1))
    }

    /// Whether the backbone multiplies projections of one input side by side and reads the
    /// packed product in place ([`packed`]; docs/decisions.md, decision 23): the cube backends,
    /// where every product and addition is a kernel launch. The CPU backends keep them apart.
    fn packs_projections() -> bool {
        false
    }

    /// `x [W₁ … W_k]`, one product: `x` `[tokens, d_in]`, weights `[d_in, d_i]`, output
    /// `[tokens, Σ d_i]`.
    fn projections(x: Tensor<Self, 2>, weights: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        Self::matmul(x, Self::concat_columns(weights))
    }

    /// `[A₁ … A_k]` for `[rows, c_i]` parts: `[rows, Σ c_i]`.
    fn concat_columns(parts: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        packed::concat_columns(parts)
    }

    /// The inverse of [`concat_columns`](Self::concat_columns): `[rows, widths[i]]` parts.
    fn split_columns(whole: Tensor<Self, 2>, widths: &[usize]) -> Vec<Tensor<Self, 2>> {
        packed::split_columns(whole, widths)
    }

    /// [`causal_attention`](Self::causal_attention) of a packed `[batch, seq, 3·heads, d_h]`
    /// projection (the queries' heads, the keys', the values'), with [`rotary`](Self::rotary)
    /// on the queries, scaled by `query_scale`, and on the keys: `[batch, seq, heads, d_h]`.
    fn causal_attention_packed(
        qkv: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        packed::causal_attention_packed(qkv, cos, sin, quarter_turn, query_scale)
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
        packed::rotary_packed(qkv, cos, sin, quarter_turn, query_scale)
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
        packed::rotary_join(gradients, cos, sin, quarter_turn, query_scale)
    }

    /// [`swiglu`](Self::swiglu) of the halves of a packed `[rows, 2 d_ff]` projection
    /// `[G U]`: `SiLU(G) ⊙ U`, `[rows, d_ff]`.
    fn swiglu_packed(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        packed::swiglu_packed(gate_up)
    }

    /// `[∂G ∂U]` of [`swiglu_packed`](Self::swiglu_packed) given `∂L/∂h`.
    fn swiglu_packed_backward(gate_up: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
        packed::swiglu_packed_backward(gate_up, grad)
    }
}

#[cfg(feature = "ndarray")]
impl<E> ActivationBackend for burn::backend::NdArray<E>
where
    E: burn::backend::ndarray::FloatNdArrayElement,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
{
}

/// Burn's kernel fusion over a backend: the plain operations, which fusion may merge.
#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend> ActivationBackend for burn_fusion::Fusion<B> {}
