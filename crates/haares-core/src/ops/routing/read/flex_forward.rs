//! The whole read on Flex, token by token: a token's slot rows are scored, normalised
//! and mixed while they are in cache, and in the backward pass each slot row's gradient, the
//! mixture's share and the scores' together, is added to the slot's accumulated gradient in one
//! update (in place when Flex holds that buffer unshared). Per slot and read this moves a slot
//! once forward and once (plus its gradient once) backward, where the two operations move it
//! twice and twice.
//!
//! Slots that read the same rows (HAARES's early-half detail is its cumulative sum's rows, with a
//! scale and mean square of its own) read, mix and take the gradient of those rows once.
//!
//! Like the loops of `flex.rs`, the tokens are split into tasks of a fixed size on Rayon's pool;
//! the sums over tokens (the query's and the bias's gradients) are summed per task and then over
//! tasks in order, so results do not depend on the thread count. f32 reads whose operands all lie
//! contiguously take these loops; others take the composition ([`compose`] and its backward
//! pass). This file holds the forward pass, `flex_backward.rs` the backward pass.

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use burn_flex::FlexTensor;
use macerator::Simd;
use rayon::prelude::*;

use super::naive::compose;
use super::{ReadBias, ReadForward, ReadQuery};
use crate::ops::routing::SlotRows;
use crate::ops::routing::flex_rows::tokens_per_task;
use crate::simd::{dot_product, exp, flex_tensor, scaled_add, slice};

/// Flex's buffer behind a tensor of `shape`, when it is f32 and contiguous.
pub(super) fn f32_buffer<const D: usize>(
    tensor: &Tensor<Flex, D>,
    shape: [usize; D],
) -> Option<FlexTensor> {
    let buffer = tensor.clone().into_primitive().tensor();
    let readable = tensor.dims() == shape && buffer.as_slice::<f32>().is_some();
    readable.then_some(buffer)
}

/// A read's slots as f32 buffers: rows, optional scales, mean squares.
pub(super) struct SlotBuffers {
    raws: Vec<FlexTensor>,
    scales: Vec<Option<FlexTensor>>,
    mean_squares: Vec<FlexTensor>,
    pub(super) tokens: usize,
    pub(super) d_model: usize,
}

impl SlotBuffers {
    pub(super) fn new(slots: &[SlotRows<Flex>]) -> Option<Self> {
        let [tokens, d_model] = slots.first()?.raw.dims();
        if tokens == 0 || d_model == 0 || slots[0].raw.dtype() != DType::F32 {
            return None;
        }
        let column = [tokens, 1];
        let mut buffers = Self {
            raws: vec![],
            scales: vec![],
            mean_squares: vec![],
            tokens,
            d_model,
        };
        for slot in slots {
            buffers.raws.push(f32_buffer(&slot.raw, [tokens, d_model])?);
            let mean_square = f32_buffer(&slot.mean_square, column)?;
            buffers.mean_squares.push(mean_square);
            let scale = match &slot.scale {
                Some(scale) => Some(f32_buffer(scale, column)?),
                None => None,
            };
            buffers.scales.push(scale);
        }
        Some(buffers)
    }

    /// The slots' views, with rows shared where two slots read the same buffer.
    pub(super) fn views(&self) -> SlotViews<'_> {
        let raws: Vec<&[f32]> = self.raws.iter().map(slice).collect();
        let same_buffer = |slot: usize, earlier: usize| std::ptr::eq(raws[slot], raws[earlier]);
        let same_rows = (0..raws.len())
            .map(|slot| {
                (0..slot)
                    .find(|&earlier| same_buffer(slot, earlier))
                    .unwrap_or(slot)
            })
            .collect();
        SlotViews {
            same_rows,
            raws,
            scales: self.scales.iter().map(|s| s.as_ref().map(slice)).collect(),
            mean_squares: self.mean_squares.iter().map(slice).collect(),
            d_model: self.d_model,
        }
    }
}

pub(super) struct SlotViews<'a> {
    /// For each slot, the first slot that reads the same rows (itself where none earlier does):
    /// such rows are read, mixed and given their gradient once.
    pub(super) same_rows: Vec<usize>,
    pub(super) raws: Vec<&'a [f32]>,
    scales: Vec<Option<&'a [f32]>>,
    pub(super) mean_squares: Vec<&'a [f32]>,
    pub(super) d_model: usize,
}

impl SlotViews<'_> {
    pub(super) fn row(&self, slot: usize, token: usize) -> &[f32] {
        &self.raws[slot][token * self.d_model..][..self.d_model]
    }

    /// Whether the slot is the first to read its rows.
    pub(super) fn reads_rows(&self, slot: usize) -> bool {
        self.same_rows[slot] == slot
    }

    pub(super) fn scale(&self, slot: usize, token: usize) -> f32 {
        self.scales[slot].map_or(1.0, |scale| scale[token])
    }

    /// `c_s / √(m_s + ε)` and `m_s + ε`: the key norm folded into the score.
    pub(super) fn coefficient(&self, slot: usize, token: usize, epsilon: f32) -> (f32, f32) {
        let shifted = self.mean_squares[slot][token] + epsilon;
        (self.scale(slot, token) / shifted.sqrt(), shifted)
    }
}

/// A token-major `[tokens, S]` buffer as slot-major `[S, tokens]`.
fn slot_major(token_major: &[f32], count: usize) -> Vec<f32> {
    let tokens = token_major.len() / count;
    (0..count * tokens)
        .map(|at| token_major[(at % tokens) * count + at / tokens])
        .collect()
}

/// [`RoutingBackend::routing_read_forward`](super::RoutingBackend::routing_read_forward) on Flex.
pub(super) fn read_forward(
    slots: &[SlotRows<Flex>],
    query: &ReadQuery<Flex>,
    bias: Option<&ReadBias<Flex>>,
    epsilon: f64,
) -> ReadForward<Flex> {
    let host = || {
        let buffers = SlotBuffers::new(slots)?;
        let (count, tokens, d_model) = (slots.len(), buffers.tokens, buffers.d_model);
        let query = f32_buffer(&query.folded(), [d_model])?;
        let bias = match bias {
            Some(bias) => Some(f32_buffer(&bias.column(), [count, 1])?),
            None => None,
        };
        let (views, query, bias) = (buffers.views(), slice(&query), bias.as_ref().map(slice));
        let mut mixture = vec![0.0; tokens * d_model];
        // Token-major within the loop, so that each task writes one contiguous piece.
        let mut weights = vec![0.0; tokens * count];
        let mut scores = vec![0.0; tokens * count];
        let chunk = tokens_per_task(d_model);
        mixture
            .par_chunks_mut(chunk * d_model)
            .zip(weights.par_chunks_mut(chunk * count))
            .zip(scores.par_chunks_mut(chunk * count))
            .enumerate()
            .for_each(|(task, ((mixture, weights), scores))| {
                let out = ForwardTask {
                    first: task * chunk,
                    mixture,
                    weights,
                    scores,
                };
                read_forward_task(&views, query, bias, epsilon as f32, out);
            });
        Some(ReadForward {
            mixture: flex_tensor(mixture, [tokens, d_model]),
            normed: None,
            weights: flex_tensor(slot_major(&weights, count), [count, tokens]),
            scores: flex_tensor(slot_major(&scores, count), [count, tokens]),
        })
    };
    host().unwrap_or_else(|| compose(slots, query, bias, epsilon, None))
}

/// One task's outputs, from token `first` on: the mixture's rows, and the weights and scores
/// token-major (`[task tokens, S]`).
struct ForwardTask<'t> {
    first: usize,
    mixture: &'t mut [f32],
    weights: &'t mut [f32],
    scores: &'t mut [f32],
}

/// Per token: `z'_s = c_s (u · raw_s) / √(m_s + ε)`, `α = softmax_s(z' + b)`,
/// `h̃ = Σ_s α_s c_s raw_s`.
#[macerator::with_simd]
fn read_forward_task<'a, 't, S: Simd>(
    slots: &SlotViews<'a>,
    query: &'a [f32],
    bias: Option<&'a [f32]>,
    epsilon: f32,
    out: ForwardTask<'t>,
) {
    let count = slots.raws.len();
    let (mut dots, mut logits) = (vec![0.0f32; count], vec![0.0; count]);
    // Later slots' factors for the rows an earlier slot reads, gathered as the slots are
    // visited last to first: a slot's rows are read by the first slot with them.
    let mut later_factors = vec![0.0f32; count];
    let rows = out.mixture.chunks_exact_mut(slots.d_model);
    for (at, mixed) in rows.enumerate() {
        let token = out.first + at;
        for (slot, logit) in logits.iter_mut().enumerate() {
            let reader = slots.same_rows[slot];
            if reader == slot {
                dots[slot] = dot_product::<S, f32>(slots.row(slot, token), query);
            }
            let (coefficient, _) = slots.coefficient(slot, token, epsilon);
            let score = dots[reader] * coefficient;
            out.scores[at * count + slot] = score;
            *logit = score + bias.map_or(0.0, |bias| bias[slot]);
        }
        let largest = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut total = 0.0;
        for logit in logits.iter_mut() {
            *logit = exp(*logit - largest);
            total += *logit;
        }
        for (slot, &unnormalised) in logits.iter().enumerate().rev() {
            let weight = unnormalised / total;
            out.weights[at * count + slot] = weight;
            let factor = weight * slots.scale(slot, token) + later_factors[slot];
            match slots.same_rows[slot] {
                reader if reader == slot => {
                    scaled_add::<S, f32>(mixed, factor, slots.row(slot, token));
                    later_factors[slot] = 0.0;
                }
                reader => later_factors[reader] += factor,
            }
        }
    }
}
