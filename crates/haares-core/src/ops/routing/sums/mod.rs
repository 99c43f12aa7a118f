//! The five slot sums that every read and every backward pass goes through: all the work of the
//! routing operator (eq:routingweights) that touches `S · tokens · d` numbers.
//!
//! ```text
//! row_dots:        out[s, n] = Σ_k slots[s][n, k] · rows[n, k]
//! weighted_sum:    out[n, k] = Σ_s w[s, n] · slots[s][n, k]
//! scaled_rows:     out_s[n, k] = columns[s, n] · rows[n, k]
//! add_scaled_rows: out_s = into_s + columns[s, ·] ⊗ rows
//! weighted_total:  out[k] = Σ_s Σ_n w[s, n] · slots[s][n, k]
//! ```
//!
//! - [`naive`]: the reference, in Burn's tensor operations.
//! - `flex.rs` (with `flex_add.rs`): SIMD loops over Flex's buffers.
//! - `ndarray.rs`: loops over NdArray's host arrays.
//! - `cube.rs` with `cube/`: CubeCL kernels that read every source of a chunk in one pass.
//!
//! The autodiff backend keeps the defaults: the read's and the writes' nodes call the inner
//! backend's sums in their backward passes. `tests/core/slot_sums_checks.rs` checks every
//! backend's sums against f64 (NdArray, Flex, wgpu and CUDA, from `tests/portability.rs`);
//! `tests/core/slot_sums.rs` checks the CPU loops against the reference in f64 and f32.

#[cfg(feature = "cube")]
pub(in crate::ops) mod cube;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
pub(in crate::ops) mod flex_add;
pub mod naive;
#[cfg(feature = "ndarray")]
pub(in crate::ops) mod ndarray;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A backend that computes the routing operator's slot sums. Every Burn backend can implement it
/// with the defaults, the plain operations of [`naive`].
pub trait SlotSumsBackend: Backend {
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
}

impl<B: SlotSumsBackend, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>
    SlotSumsBackend for burn::backend::Autodiff<B, C>
{
}

uses_the_reference!(SlotSumsBackend on fusion);
