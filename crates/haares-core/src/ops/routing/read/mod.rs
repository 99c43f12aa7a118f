//! A read of the routing operator (eq:routingweights): a read site's scores over its slots, the
//! bias, the softmax over slots and the mixture, with the RMSNorm that reads the mixture next,
//! as one differentiable operation. A site's logits and mixture are
//!
//! ```text
//! z'_s = c_s ⊙ (u · raw_s) / √(m_s + ε)      (scores;  u = q ⊙ w, the key-norm weight folded in)
//! h̃    = Σ_s α_s ⊙ c_s ⊙ raw_s               (mixture; α = softmax_s(z' + b))
//! ```
//!
//! for slots stored as token rows `raw_s` (`[tokens, d]`) with a constant per-token scale `c_s`
//! (RMS matching's multiplier, or 1) and the cached mean square `m_s = mean((c_s ⊙ raw_s)²)`.
//! The bias and the softmax stay ordinary tensor operations on `[S, tokens]`, so the routing
//! weights are differentiable outputs like the mixture. Everything that touches `S · tokens · d`
//! numbers goes through the [slot sums](crate::ops::SlotSumsBackend).
//!
//! - [`naive`]: the reference: the scores and the mixture as two operations with their own
//!   backward passes, and the read as their composition.
//! - `flex.rs` (`flex_forward.rs`, `flex_backward.rs`): loops that go token by token, so that each
//!   slot row is read once forward and once backward, where the two operations read it twice and
//!   twice.
//! - `cube.rs` with `cube/`: one kernel each way for a whole read.
//! - `autodiff.rs` (`autodiff_read.rs`): the scores and the mixture as one graph node each, and a
//!   whole read as one node with one backward pass. The nodes keep no normalised key, no stacked
//!   tensor and no per-slot `[tokens, d]` intermediate, only the sources themselves (which the
//!   bank holds anyway) and `[S, tokens]` scalars.
//!
//! `tests/core/read_checks.rs` checks every backend's read against the reference (NdArray, Flex,
//! wgpu and CUDA, from `tests/portability.rs`), `tests/core/read.rs` Flex's loops in f64 and f32,
//! and `tests/core/fused.rs` the routing operator against the literal equation.

mod autodiff;
mod autodiff_read;
#[cfg(feature = "cube")]
pub(in crate::ops) mod cube;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod flex_backward;
#[cfg(feature = "flex")]
mod flex_forward;
pub mod naive;
mod path;
mod types;

pub use path::RoutingPath;
pub use types::{
    MixtureAndWeights, NormBackward, QueryGradients, ReadBackward, ReadBias, ReadForward,
    ReadGradients, ReadNorm, ReadQuery, bias_gradient,
};

use burn::tensor::Tensor;

use super::{SlotRows, raws, scales};
use crate::ops::{NormBackend, SourceWriteBackend};

/// A backend that computes the routing operator's read. Every Burn backend can implement it with
/// the defaults, the composition of [`naive`]; Flex and the cube backends override the whole
/// read, the autodiff backend the operations with their own backward passes.
pub trait RoutingBackend: SourceWriteBackend + NormBackend {
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
        naive::scores_forward(slots, folded_query, epsilon).scores
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

    /// A whole read: the scores with the folded query `q ⊙ w`, the bias `b` on the slots that take
    /// it (or none), the softmax over slots and the mixture, and the RMSNorm the mixture goes
    /// through next where there is one, as one operation, differentiable in `q`, `w`,
    /// `b` and the norm's gain themselves. Returns the output (`RMSNorm(h̃)` with a norm, `h̃`
    /// without) and the weights; by default [`routing_read_forward`](Self::routing_read_forward)'s,
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
        naive::compose(slots, query, bias, epsilon, norm)
    }

    /// The backward pass of [`routing_read`](Self::routing_read), each slot's gradient added to
    /// `into` (what its source has accumulated), for the slots (and mean squares) wanted.
    fn routing_read_backward(
        read: ReadBackward<Self>,
        into: Vec<Option<Tensor<Self, 2>>>,
        wanted: &[bool],
        mean_squares_wanted: &[bool],
    ) -> ReadGradients<Self> {
        naive::compose_backward(read, into, wanted, mean_squares_wanted)
    }
}

uses_the_reference!(RoutingBackend on ndarray, fusion);
