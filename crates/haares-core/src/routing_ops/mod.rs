//! The routing operator: eq:routingweights as two differentiable operations with their own
//! backward passes, over sources that are never stacked.
//!
//! A read site's logits and mixture are
//!
//! ```text
//! z'_s = c_s ⊙ (u · raw_s) / √(m_s + ε)      (scores;  u = q ⊙ w, the key-norm weight folded in)
//! h̃    = Σ_s α_s ⊙ c_s ⊙ raw_s               (mixture; α = softmax_s(z' + b))
//! ```
//!
//! for slots stored as token rows `raw_s` (`[tokens, d]`) with a constant per-token scale `c_s`
//! (RMS matching's multiplier, or 1) and the cached mean square `m_s = mean((c_s ⊙ raw_s)²)`.
//! The bias and the softmax stay ordinary tensor operations on `[S, tokens]`, so the routing
//! weights are differentiable outputs like the mixture.
//!
//! All work that touches `S · tokens · d` numbers goes through five backend primitives,
//! [`RoutingBackend::row_dots`], [`RoutingBackend::weighted_sum`],
//! [`RoutingBackend::scaled_rows`], [`RoutingBackend::add_scaled_rows`] and
//! [`RoutingBackend::weighted_total`]; everything else is `O(S · tokens)`. The default
//! implementations are plain Burn tensor operations ([`naive`], the reference every faster
//! implementation is tested against). Flex replaces them with SIMD loops over its buffers
//! (`flex.rs`) and NdArray with loops over its host arrays (`ndarray.rs`); the cube backends (CUDA,
//! wgpu) replace the first two with CubeCL kernels that read every source of a chunk in one pass
//! (`cube.rs`), a whole read with one kernel each way (`cube_read.rs`), and the per-token row
//! operations around it (a mean square and its gradient, RMS matching's multiplier) with one each
//! (`cube_rows.rs`).
//!
//! On the autodiff backend (`autodiff.rs`) the two operations are single graph nodes whose backward
//! recomputes what it needs from the sources: they keep no normalised key, no stacked tensor and
//! no per-slot `[tokens, d]` intermediate for the backward pass, only the sources themselves
//! (which the bank holds anyway) and `[S, tokens]` scalars.
//!
//! A router reads through [`RoutingBackend::routing_read`], the scores, the bias, the softmax and
//! the mixture (and the RMSNorm that reads the mixture next, [`ReadNorm`]) as one operation
//! (`read.rs`). By default it is the composition of the two
//! operations above; on the autodiff backend it is one node with one backward pass
//! (`autodiff_read.rs`), and on Flex its loops go token by token (`flex_read.rs`), so that each
//! slot row is read once forward and once backward, where the two operations read it twice and
//! twice.

mod autodiff;
mod autodiff_read;
mod autodiff_slots;
mod composition;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
mod cube_kernels;
#[cfg(feature = "cube")]
mod cube_read;
#[cfg(feature = "cube")]
mod cube_read_kernels;
#[cfg(feature = "cube")]
mod cube_rows;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
mod cube_sources;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(crate) use cube_sources::cuda_sources;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod flex_read;
#[cfg(feature = "flex")]
mod flex_read_grad;
#[cfg(feature = "flex")]
mod flex_rows;
#[cfg(feature = "flex")]
mod flex_sums;
pub mod naive;
#[cfg(feature = "ndarray")]
mod ndarray;
pub mod pair_write;
mod read;

pub use pair_write::{PairWrite, RmsMatching};
pub use read::{
    MixtureAndWeights, NormBackward, QueryGradients, ReadBackward, ReadBias, ReadForward,
    ReadGradients, ReadNorm, ReadQuery, bias_gradient,
};

use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

pub(crate) use composition::{
    ScoresForward, mean_squares, mixture_backward, scales, scores_backward, scores_forward,
};
use composition::{raws, slot_column};

use crate::activation_ops::ActivationBackend;
use crate::config::RoutingPath;

/// One slot of a read, as token rows.
///
/// # Shapes
/// - raw: `[tokens, d]`; scale, mean_square: `[tokens, 1]`
#[derive(Debug, Clone)]
pub struct SlotRows<B: Backend> {
    /// The tensor the slot is stored as.
    pub raw: Tensor<B, 2>,
    /// Constant per-token scale `c` (no gradient flows into it); the slot's value is `c ⊙ raw`.
    pub scale: Option<Tensor<B, 2>>,
    /// `mean((c ⊙ raw)²)` per token, the key norm's mean square. On a backend that
    /// [folds mean squares](RoutingBackend::folds_mean_squares), the autodiff backend's read takes
    /// its gradient through `raw` by that formula, whatever graph formed it.
    pub mean_square: Tensor<B, 2>,
}

/// A backend that computes the routing operator. Every Burn backend can implement it with the
/// default methods; Flex and NdArray override the primitives with host loops, the cube backends
/// override two of them and the whole read with kernels (and send `Auto` to the fused path on
/// CUDA only), and the
/// autodiff backend overrides the operations with their own backward passes.
///
/// A routing backend also computes the backbone's fused activations ([`ActivationBackend`]), so
/// that this one bound serves every module of the model.
pub trait RoutingBackend: ActivationBackend {
    /// The path [`RoutingPath::Auto`] takes on this backend: fused unless the backend says
    /// otherwise.
    fn auto_routing() -> RoutingPath {
        RoutingPath::Fused
    }

    /// Whether the autodiff backend's read hands its backward pass
    /// [`ReadBackward::fold_mean_squares`]: each slot's mean-square gradient added to its rows'
    /// gradient in the read's own pass, so that the mean squares are no parents of the read
    /// and receive no gradient (their nodes' backward passes and the additions of their
    /// gradients across reads are not run). The cube backends' read kernel does it at no cost
    /// (it holds the row); on the CPU backends it would be a pass over every slot row per read
    /// instead of one per source, so they keep the mean squares as parents (the default).
    fn folds_mean_squares() -> bool {
        false
    }

    /// `out[s, n] = Σ_k slots[s][n, k] · rows[n, k]` for every slot `s` and token `n`.
    ///
    /// # Shapes
    /// - each slot: `[tokens, d]`; rows: `[tokens, d]`, or `[1, d]` for one row shared by all
    /// - output: `[S, tokens]`
    fn row_dots(slots: &[Tensor<Self, 2>], rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        naive::row_dots(slots, rows)
    }

    /// `out[n, k] = Σ_s weights[s, n] · slots[s][n, k]`.
    ///
    /// # Shapes
    /// - each slot: `[tokens, d]`; weights: `[S, tokens]`
    /// - output: `[tokens, d]`
    fn weighted_sum(slots: &[Tensor<Self, 2>], weights: Tensor<Self, 2>) -> Tensor<Self, 2> {
        naive::weighted_sum(slots, weights)
    }

    /// `out_s[n, k] = columns[s, n] · rows[n, k]` (or `rows[0, k]` for one shared row), for the
    /// slots `s` that are `wanted`: the per-slot gradients of both operations.
    ///
    /// # Shapes
    /// - columns: `[S, tokens]`; rows: `[tokens, d]` or `[1, d]`
    /// - output: `S` entries of `[tokens, d]`, `None` where not wanted
    fn scaled_rows(
        columns: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
        wanted: &[bool],
    ) -> Vec<Option<Tensor<Self, 2>>> {
        naive::scaled_rows(columns, rows, wanted)
    }

    /// `out_s = into_s + columns[s, ·] ⊗ rows` for the wanted slots: the products of
    /// [`scaled_rows`](Self::scaled_rows), each added to a gradient already accumulated where
    /// there is one. The backward passes hand each slot's gradient to the sum its source already
    /// holds, in one pass instead of a product and an addition.
    ///
    /// # Shapes
    /// - into: `S` entries of `[tokens, d]` or `None`; columns: `[S, tokens]`; rows: `[tokens, d]`
    ///   or `[1, d]`
    /// - output: `S` entries of `[tokens, d]`, `None` where not wanted
    fn add_scaled_rows(
        into: Vec<Option<Tensor<Self, 2>>>,
        columns: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
        wanted: &[bool],
    ) -> Vec<Option<Tensor<Self, 2>>> {
        naive::add_scaled_rows(Self::scaled_rows(columns, rows, wanted), into)
    }

    /// `out[k] = Σ_s Σ_n weights[s, n] · slots[s][n, k]`: the scores' gradient with respect to
    /// the folded query.
    ///
    /// # Shapes
    /// - each slot: `[tokens, d]`; weights: `[S, tokens]`
    /// - output: `[d]`
    fn weighted_total(slots: &[Tensor<Self, 2>], weights: Tensor<Self, 2>) -> Tensor<Self, 1> {
        naive::weighted_total(slots, weights)
    }

    /// `sum + sign · term`: the block accumulator's write (eq:update), `C ← C + u` and
    /// `D ← D + s·u`. On the autodiff backend one node whose backward pass adds `sign · ∂L/∂out`
    /// to the gradient `term` has accumulated so far, in one pass: Burn's subtraction negates the
    /// gradient in one pass, and its container adds the result in another.
    ///
    /// # Shapes
    /// - sum, term, output: the same shape
    fn signed_sum<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> Tensor<Self, D> {
        naive::signed_sum(sum, term, sign)
    }

    /// [`signed_sum`](Self::signed_sum) and, where the backend forms it in the same pass, the
    /// sum's mean square over the last dimension (`[…, 1]`): the mean square the new `C` or `D`
    /// will be read with, as [`row_mean_square`](Self::row_mean_square) would compute it. By
    /// default `None` (the source then computes its own); one launch on the cube backends, where
    /// the two would be two. On the autodiff backend the mean square is a node of its own over
    /// the sum, with [`row_mean_square`](Self::row_mean_square)'s backward pass, which runs only
    /// where a gradient reaches it (a read that does not fold it).
    ///
    /// # Shapes
    /// - sum, term, output: the same shape; mean square: that shape with a last dimension of 1
    fn signed_sum_with_mean_square<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        (Self::signed_sum(sum, term, sign), None)
    }

    /// `mean(rows²)` per token: the mean square a source's key norm divides by
    /// (eq:routingweights), computed once per source. A row dot product of the rows with
    /// themselves, so every backend's `row_dots` serves; on the autodiff backend one node whose
    /// backward pass adds `(2/d)·g ⊗ rows` to the rows' accumulated gradient.
    ///
    /// # Shapes
    /// - rows: `[tokens, d]`
    /// - output: `[tokens, 1]`
    fn row_mean_square(rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let sums = Self::row_dots(std::slice::from_ref(&rows), rows.clone());
        sums.reshape([tokens, 1]).div_scalar(d_model as f64)
    }

    /// The backward pass of [`row_mean_square`](Self::row_mean_square): `into + (2/d)·g ⊗ rows`
    /// (`∂ mean(x²)/∂x = (2/d)·x` per token), added to the gradient the rows have accumulated so
    /// far where there is one.
    ///
    /// # Shapes
    /// - into, rows, output: `[tokens, d]`; grad: `[tokens, 1]`
    fn row_mean_square_backward(
        into: Option<Tensor<Self, 2>>,
        grad: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let column = grad.reshape([1, tokens]).mul_scalar(2.0 / d_model as f64);
        Self::add_scaled_rows(vec![into], column, rows, &[true])
            .pop()
            .flatten()
            .expect("a wanted slot has a gradient")
    }

    /// eq:rmsmatch's multiplier from the two mean squares the fused router holds,
    /// `a = clip(√m_C / (√m_D + ε), 1/γ, γ)` per token, a constant with no gradient (the
    /// equation's stop-gradient), and the matched detail's mean square `m_D · a²`, whose gradient
    /// reaches `m_D` (times `a²`). By default the tensor operations (on lavapipe nine launches
    /// for `a`, and a product); one kernel on the cube backends, and on the autodiff backend the
    /// inner backend's values with a node for the matched mean square alone.
    ///
    /// # Shapes
    /// - cumulative_mean_square, detail_mean_square: `[tokens, 1]`
    /// - output: `(a, m_D · a²)`, each `[tokens, 1]`
    fn rms_match_multiplier(
        cumulative_mean_square: Tensor<Self, 2>,
        detail_mean_square: Tensor<Self, 2>,
        gamma: f64,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let ratio = cumulative_mean_square.detach().sqrt()
            / (detail_mean_square.clone().detach().sqrt() + epsilon);
        let multiplier = ratio.clamp(1.0 / gamma, gamma).detach();
        let matched = detail_mean_square * multiplier.clone().square();
        (multiplier, matched)
    }

    /// One write of a HAARES block's pair with what its next read needs ([`PairWrite`]):
    /// eq:update's `C ← C + u` and `D ← D + s·u`, the mean square of each new sum, and
    /// eq:rmsmatch's multiplier with the matched detail's mean square. `detail` is `None` while
    /// the detail is the cumulative sum itself (every sign so far `+1`, and `sign` is `+1`): the
    /// new detail is then the new `C`, and the multiplier compares `C` with itself. By default
    /// the operations ([`pair_write::compose`]); one launch on the cube backends, where they are
    /// three; on the autodiff backend the inner backend's values with the operations' nodes.
    ///
    /// # Shapes
    /// - cumulative, detail, term: the same shape `[…, d]`
    fn pair_write<const D: usize>(
        cumulative: Tensor<Self, D>,
        detail: Option<Tensor<Self, D>>,
        term: Tensor<Self, D>,
        sign: f64,
        matching: RmsMatching,
    ) -> PairWrite<Self, D> {
        pair_write::compose(cumulative, detail, term, sign, matching)
    }

    /// The scaled dot products `z'_s = c_s ⊙ (u · raw_s) / √(m_s + ε)` of every slot with the
    /// folded query `u` (eq:routingweights without its bias).
    ///
    /// # Shapes
    /// - folded_query: `[d]`
    /// - output: `[S, tokens]`
    fn routing_scores(
        slots: &[SlotRows<Self>],
        folded_query: Tensor<Self, 1>,
        epsilon: f64,
    ) -> Tensor<Self, 2> {
        scores_forward(slots, folded_query, epsilon).scores
    }

    /// The mixture `h̃ = Σ_s α_s ⊙ c_s ⊙ raw_s` of eq:routingweights.
    ///
    /// # Shapes
    /// - weights: `[S, tokens]`
    /// - output: `[tokens, d]`
    fn routing_mixture(slots: &[SlotRows<Self>], weights: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let raws = raws(slots);
        Self::weighted_sum(&raws, weights * scales(slots))
    }

    /// A whole read: the scores with the folded query `q ⊙ w`, the bias `b` on the slots that
    /// take it (or none), the softmax over slots and the mixture, and the RMSNorm the mixture
    /// goes through next where there is one, as one operation (`read.rs`), differentiable in `q`,
    /// `w`, `b` and the norm's gain themselves. Returns the output (`RMSNorm(h̃)` with a norm,
    /// `h̃` without) and the weights; by default [`routing_read_forward`](Self::routing_read_forward)'s,
    /// and on the autodiff backend two graph nodes with one backward pass.
    ///
    /// # Shapes
    /// - query: `[d]` each; bias: `[1]`; gain: `[d]`
    /// - output: `[tokens, d]`; weights `[S, tokens]`
    fn routing_read(
        slots: &[SlotRows<Self>],
        query: ReadQuery<Self>,
        bias: Option<ReadBias<Self>>,
        epsilon: f64,
        norm: Option<ReadNorm<Self>>,
    ) -> MixtureAndWeights<Self> {
        let read = Self::routing_read_forward(slots, &query, bias.as_ref(), epsilon, norm.as_ref());
        (read.normed.unwrap_or(read.mixture), read.weights)
    }

    /// The forward pass of [`routing_read`](Self::routing_read), with the scores its backward
    /// pass reuses. By default the composition of [`routing_scores`](Self::routing_scores),
    /// Burn's softmax and [`routing_mixture`](Self::routing_mixture).
    fn routing_read_forward(
        slots: &[SlotRows<Self>],
        query: &ReadQuery<Self>,
        bias: Option<&ReadBias<Self>>,
        epsilon: f64,
        norm: Option<&ReadNorm<Self>>,
    ) -> ReadForward<Self> {
        read::compose(slots, query, bias, epsilon, norm)
    }

    /// The backward pass of [`routing_read`](Self::routing_read), each slot's gradient added to
    /// `into` (what its source has accumulated), for the slots (and mean squares) wanted.
    fn routing_read_backward(
        read: ReadBackward<Self>,
        into: Vec<Option<Tensor<Self, 2>>>,
        wanted: &[bool],
        mean_squares_wanted: &[bool],
    ) -> ReadGradients<Self> {
        read::compose_backward(read, into, wanted, mean_squares_wanted)
    }
}

pub(crate) use crate::autodiff_node::from_primitive;

/// A backend that trains HAARES models: autodiff over a backend with the routing operator, so that
/// both the training model and its `valid()` copy can route.
pub trait TrainingBackend: AutodiffBackend<InnerBackend: RoutingBackend> + RoutingBackend {}

/// Burn's kernel fusion over a backend: the plain operations, which fusion may merge.
#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend> RoutingBackend for burn_fusion::Fusion<B> {}

impl<B> TrainingBackend for B where B: AutodiffBackend<InnerBackend: RoutingBackend> + RoutingBackend
{}
