//! The routing operator (eq:routingweights) over sources that are never stacked: a read site's
//! softmax mixture over its slots, and the writes that form the sources it reads (eq:update,
//! eq:rmsmatch). Three operations, each a folder:
//!
//! - [`sums`]: the five slot sums that touch `S · tokens · d` numbers ([`SlotSumsBackend`]);
//! - [`write`](mod@write): a source's write, its mean square and RMS matching's multiplier
//!   ([`SourceWriteBackend`]);
//! - [`read`]: a whole read, scores, bias, softmax, mixture and the next RMSNorm
//!   ([`RoutingBackend`]).
//!
//! A slot is stored as token rows ([`SlotRows`]); the helpers here turn a read's slots into the
//! `[S, tokens]` columns the operations take.
//!
//! [`SlotSumsBackend`]: crate::ops::SlotSumsBackend
//! [`SourceWriteBackend`]: crate::ops::SourceWriteBackend
//! [`RoutingBackend`]: crate::ops::RoutingBackend

mod autodiff_slots;
#[cfg(feature = "cube")]
mod cube_shared;
#[cfg(feature = "flex")]
mod flex_rows;
pub mod read;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(super) mod sources;
pub mod sums;
pub mod write;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

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
    /// [folds mean squares](crate::ops::RoutingBackend::folds_mean_squares), the autodiff backend's read takes
    /// its gradient through `raw` by that formula, whatever graph formed it.
    pub mean_square: Tensor<B, 2>,
}

/// Row `slot` of an `[S, tokens]` tensor as a `[tokens, 1]` column (contiguous, no copy).
pub(crate) fn slot_column<B: Backend>(
    slot_major: &Tensor<B, 2>,
    slot: usize,
    tokens: usize,
) -> Tensor<B, 2> {
    slot_major.clone().narrow(0, slot, 1).reshape([tokens, 1])
}

/// Every slot's rows.
pub(crate) fn raws<B: Backend>(slots: &[SlotRows<B>]) -> Vec<Tensor<B, 2>> {
    slots.iter().map(|slot| slot.raw.clone()).collect()
}

/// Per-slot rows of `[tokens, 1]` columns, `[S, tokens]`.
fn slot_major<B: Backend>(columns: impl Iterator<Item = Tensor<B, 2>>) -> Tensor<B, 2> {
    let rows: Vec<_> = columns
        .map(|column| {
            let tokens = column.dims()[0];
            column.reshape([1, tokens])
        })
        .collect();
    Tensor::cat(rows, 0)
}

/// Every slot's scale (1 where it has none), `[S, tokens]`.
pub(crate) fn scales<B: Backend>(slots: &[SlotRows<B>]) -> Tensor<B, 2> {
    slot_major(slots.iter().map(|slot| match &slot.scale {
        Some(scale) => scale.clone(),
        None => slot.mean_square.ones_like(),
    }))
}

/// Every slot's mean square, `[S, tokens]`.
pub(crate) fn mean_squares<B: Backend>(slots: &[SlotRows<B>]) -> Tensor<B, 2> {
    slot_major(slots.iter().map(|slot| slot.mean_square.clone()))
}
