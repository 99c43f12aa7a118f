//! The whole read (`read.rs`) on Flex, token by token: a token's slot rows are scored, normalised
//! and mixed while they are in cache, and in the backward pass each slot row's gradient, the
//! mixture's share and the scores' together, is added to the slot's accumulated gradient in one
//! update (in place when Flex holds that buffer unshared). Per slot and read this moves a slot
//! once forward and once (plus its gradient once) backward, where the two operations move it
//! twice and twice.
//!
//! Like the loops of `flex.rs`, the tokens are split into tasks of a fixed size on Rayon's pool;
//! the sums over tokens (the query's and the bias's gradients) are summed per task and then over
//! tasks in order, so results do not depend on the thread count. f32 reads whose operands all lie
//! contiguously take these loops; others take the composition ([`compose`],
//! [`compose_backward`]).

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use burn_flex::FlexTensor;
use macerator::Simd;
use rayon::prelude::*;

use super::SlotRows;
use super::flex::tokens_per_task;
use super::flex_sums::{Added, Target};
use super::read::{ReadBackward, ReadForward, ReadGradients, compose, compose_backward};
use crate::simd::{dot_product, exp, flex_tensor, scaled_add, two_scaled_adds};

/// Flex's buffer behind a tensor of `shape`, when it is f32 and contiguous.
fn f32_buffer<const D: usize>(tensor: &Tensor<Flex, D>, shape: [usize; D]) -> Option<FlexTensor> {
    let buffer = tensor.clone().into_primitive().tensor();
    let readable = tensor.dims() == shape && buffer.as_slice::<f32>().is_some();
    readable.then_some(buffer)
}

fn slice(buffer: &FlexTensor) -> &[f32] {
    buffer.as_slice::<f32>().expect("checked by f32_buffer")
}

/// A read's slots as f32 buffers: rows, optional scales, mean squares.
struct SlotBuffers {
    raws: Vec<FlexTensor>,
    scales: Vec<Option<FlexTensor>>,
    mean_squares: Vec<FlexTensor>,
    tokens: usize,
    d_model: usize,
}

impl SlotBuffers {
    fn new(slots: &[SlotRows<Flex>]) -> Option<Self> {
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

    fn views(&self) -> SlotViews<'_> {
        SlotViews {
            raws: self.raws.iter().map(slice).collect(),
            scales: self.scales.iter().map(|s| s.as_ref().map(slice)).collect(),
            mean_squares: self.mean_squares.iter().map(slice).collect(),
            d_model: self.d_model,
        }
    }
}

struct SlotViews<'a> {
    raws: Vec<&'a [f32]>,
    scales: Vec<Option<&'a [f32]>>,
    mean_squares: Vec<&'a [f32]>,
    d_model: usize,
}

impl SlotViews<'_> {
    fn row(&self, slot: usize, token: usize) -> &[f32] {
        &self.raws[slot][token * self.d_model..][..self.d_model]
    }

    fn scale(&self, slot: usize, token: usize) -> f32 {
        self.scales[slot].map_or(1.0, |scale| scale[token])
    }

    /// `c_s / √(m_s + ε)` and `m_s + ε`: the key norm folded into the score.
    fn coefficient(&self, slot: usize, token: usize, epsilon: f32) -> (f32, f32) {
        let shifted = self.mean_squares[slot][token] + epsilon;
        (self.scale(slot, token) / shifted.sqrt(), shifted)
    }
}

/// Each task's pieces of some per-slot outputs: `columns[s]` (absent where not wanted) cut into
/// pieces of `piece` elements, regrouped by task, `[task][slot]`.
fn pieces_per_task(
    columns: Vec<Option<&mut [f32]>>,
    piece: usize,
    tasks: usize,
) -> Vec<Vec<Option<&mut [f32]>>> {
    let mut per_task: Vec<Vec<_>> = (0..tasks).map(|_| Vec::new()).collect();
    for column in columns {
        match column {
            Some(column) => {
                for (task, part) in per_task.iter_mut().zip(column.chunks_mut(piece)) {
                    task.push(Some(part));
                }
            }
            None => per_task.iter_mut().for_each(|task| task.push(None)),
        }
    }
    per_task
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
    folded_query: Tensor<Flex, 1>,
    bias: Option<Tensor<Flex, 2>>,
    epsilon: f64,
) -> ReadForward<Flex> {
    let host = || {
        let buffers = SlotBuffers::new(slots)?;
        let (count, tokens, d_model) = (slots.len(), buffers.tokens, buffers.d_model);
        let query = f32_buffer(&folded_query, [d_model])?;
        let bias = match &bias {
            Some(bias) => Some(f32_buffer(bias, [count, 1])?),
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
            weights: flex_tensor(slot_major(&weights, count), [count, tokens]),
            scores: flex_tensor(slot_major(&scores, count), [count, tokens]),
        })
    };
    host().unwrap_or_else(|| compose(slots, folded_query, bias, epsilon))
}

/// One task's outputs, from token `first` on: the mixture's rows, and the weights and scores
/// token-major (`[task tokens, S]`).
struct ForwardTask<'t> {
    first: usize,
    mixture: &'t mut [f32],
    weights: &'t mut [f32],
    scores: &'t mut [f32],
}

/// Per token: `z'_s = c_s (u · raw_s) / √(m_s + ε)`, `α = softmax_s(z' + b)`, `h̃ = Σ_s α_s c_s raw_s`.
#[macerator::with_simd]
fn read_forward_task<'a, 't, S: Simd>(
    slots: &SlotViews<'a>,
    query: &'a [f32],
    bias: Option<&'a [f32]>,
    epsilon: f32,
    out: ForwardTask<'t>,
) {
    let count = slots.raws.len();
    let mut logits = vec![0.0f32; count];
    let rows = out.mixture.chunks_exact_mut(slots.d_model);
    for (at, mixed) in rows.enumerate() {
        let token = out.first + at;
        for (slot, logit) in logits.iter_mut().enumerate() {
            let (coefficient, _) = slots.coefficient(slot, token, epsilon);
            let score = dot_product::<S, f32>(slots.row(slot, token), query) * coefficient;
            out.scores[at * count + slot] = score;
            *logit = score + bias.map_or(0.0, |bias| bias[slot]);
        }
        let largest = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut total = 0.0;
        for logit in logits.iter_mut() {
            *logit = exp(*logit - largest);
            total += *logit;
        }
        for (slot, &unnormalised) in logits.iter().enumerate() {
            let weight = unnormalised / total;
            out.weights[at * count + slot] = weight;
            let factor = weight * slots.scale(slot, token);
            scaled_add::<S, f32>(mixed, factor, slots.row(slot, token));
        }
    }
}

/// [`RoutingBackend::routing_read_backward`](super::RoutingBackend::routing_read_backward) on
/// Flex.
pub(super) fn read_backward(
    read: ReadBackward<Flex>,
    into: Vec<Option<Tensor<Flex, 2>>>,
    wanted: &[bool],
    mean_squares_wanted: &[bool],
) -> ReadGradients<Flex> {
    let Some(buffers) = SlotBuffers::new(&read.slots) else {
        return compose_backward(read, into, wanted, mean_squares_wanted);
    };
    let (count, tokens, d_model) = (read.slots.len(), buffers.tokens, buffers.d_model);
    let (slot_major, shape) = ([count, tokens], [tokens, d_model]);
    let operands = (
        f32_buffer(&read.folded_query, [d_model]),
        f32_buffer(&read.scores, slot_major),
        f32_buffer(&read.weights, slot_major),
        f32_buffer(&read.mixture_grad, shape),
        read.weights_grad
            .as_ref()
            .map(|grad| f32_buffer(grad, slot_major)),
    );
    let intos_fit = into.iter().all(|into| {
        into.as_ref()
            .is_none_or(|into| into.dims() == shape && into.dtype() == DType::F32)
    });
    let (Some(query), Some(scores), Some(weights), Some(mixture_grad), weights_grad) = operands
    else {
        return compose_backward(read, into, wanted, mean_squares_wanted);
    };
    if !intos_fit || weights_grad.as_ref().is_some_and(Option::is_none) {
        return compose_backward(read, into, wanted, mean_squares_wanted);
    }
    let weights_grad = weights_grad.flatten();

    let mut targets: Vec<Target<f32>> = into
        .into_iter()
        .zip(wanted)
        .map(|(into, &wanted)| Target::new(into, wanted, shape))
        .collect();
    let mut mean_square_grads: Vec<Option<Vec<f32>>> = (0..count)
        .map(|slot| mean_squares_wanted[slot].then(|| vec![0.0; tokens]))
        .collect();
    let inputs = BackwardInputs {
        slots: buffers.views(),
        query: slice(&query),
        scores: slice(&scores),
        weights: slice(&weights),
        mixture_grad: slice(&mixture_grad),
        weights_grad: weights_grad.as_ref().map(slice),
        epsilon: read.epsilon as f32,
        tokens,
    };
    let chunk = tokens_per_task(d_model);
    let tasks = tokens.div_ceil(chunk);
    let raw_pieces = pieces_per_task(
        targets.iter_mut().map(Target::values).collect(),
        chunk * d_model,
        tasks,
    );
    let mean_square_pieces = pieces_per_task(
        mean_square_grads
            .iter_mut()
            .map(Option::as_deref_mut)
            .collect(),
        chunk,
        tasks,
    );
    let partials: Vec<(Vec<f32>, Vec<f64>)> = raw_pieces
        .into_par_iter()
        .zip(mean_square_pieces)
        .enumerate()
        .map(|(task, (mut raws, mut mean_squares))| {
            let first = task * chunk;
            let out = BackwardTask {
                tokens: first..tokens.min(first + chunk),
                raws: &mut raws,
                mean_squares: &mut mean_squares,
                folded_query: vec![0.0; d_model],
                bias: vec![0.0; count],
            };
            read_backward_task(&inputs, out)
        })
        .collect();
    let (mut folded_query, mut bias) = (vec![0.0f32; d_model], vec![0.0f64; count]);
    for (query_part, bias_part) in partials {
        folded_query
            .iter_mut()
            .zip(query_part)
            .for_each(|(sum, x)| *sum += x);
        bias.iter_mut()
            .zip(bias_part)
            .for_each(|(sum, x)| *sum += x);
    }
    ReadGradients {
        raws: targets
            .into_iter()
            .map(|target| match target.finish(shape) {
                Added::Done(grad) => Some(grad),
                Added::Plain(grad) => grad,
            })
            .collect(),
        mean_squares: mean_square_grads
            .into_iter()
            .map(|grad| grad.map(|grad| flex_tensor(grad, [tokens, 1])))
            .collect(),
        folded_query: flex_tensor(folded_query, [d_model]),
        bias: flex_tensor(bias.into_iter().map(|sum| sum as f32).collect(), [count, 1]),
    }
}

struct BackwardInputs<'a> {
    slots: SlotViews<'a>,
    query: &'a [f32],
    scores: &'a [f32],
    weights: &'a [f32],
    mixture_grad: &'a [f32],
    weights_grad: Option<&'a [f32]>,
    epsilon: f32,
    tokens: usize,
}

/// One task's outputs: each wanted slot's piece of the raw and mean-square gradients, and the
/// task's own sums of the query's and the bias's gradients.
struct BackwardTask<'t, 'o> {
    tokens: std::ops::Range<usize>,
    raws: &'t mut [Option<&'o mut [f32]>],
    mean_squares: &'t mut [Option<&'o mut [f32]>],
    folded_query: Vec<f32>,
    /// Summed over tokens in f64: a sum of `tokens` terms per slot.
    bias: Vec<f64>,
}

/// Per token, with `g = ∂h̃`: `∂α_s = c_s (raw_s · g) + ∂α_s(weights)`; the softmax's
/// `∂z_s = α_s (∂α_s − Σ_k α_k ∂α_k)`; with `w_s = ∂z_s c_s / √(m_s + ε)`: `∂raw_s += α_s c_s g
/// + w_s u` (one update), `∂m_s = −½ ∂z_s z'_s / (m_s + ε)`, `∂u += w_s raw_s`, `∂b_s += ∂z_s`.
/// Returns the task's sums for `∂u` and `∂b`.
#[macerator::with_simd]
fn read_backward_task<'a, 't, 'o, S: Simd>(
    inputs: &BackwardInputs<'a>,
    mut out: BackwardTask<'t, 'o>,
) -> (Vec<f32>, Vec<f64>) {
    let (slots, tokens, d_model) = (&inputs.slots, inputs.tokens, inputs.slots.d_model);
    let mut weights_grads = vec![0.0f32; slots.raws.len()];
    let first = out.tokens.start;
    for token in out.tokens.clone() {
        let at_task = token - first;
        let grad = &inputs.mixture_grad[token * d_model..][..d_model];
        for (slot, weight_grad) in weights_grads.iter_mut().enumerate() {
            let dot = dot_product::<S, f32>(slots.row(slot, token), grad);
            let given = inputs
                .weights_grad
                .map_or(0.0, |grads| grads[slot * tokens + token]);
            *weight_grad = dot * slots.scale(slot, token) + given;
        }
        let along_slots: f32 = (weights_grads.iter().enumerate())
            .map(|(slot, grad)| inputs.weights[slot * tokens + token] * grad)
            .sum();
        for (slot, &weight_grad) in weights_grads.iter().enumerate() {
            let at = slot * tokens + token;
            let weight = inputs.weights[at];
            let logit_grad = weight * (weight_grad - along_slots);
            out.bias[slot] += f64::from(logit_grad);
            let (coefficient, shifted) = slots.coefficient(slot, token, inputs.epsilon);
            let dot_grad = logit_grad * coefficient;
            if let Some(grads) = &mut out.mean_squares[slot] {
                grads[at_task] = (logit_grad * inputs.scores[at] / shifted) * -0.5;
            }
            if let Some(raw_grad) = &mut out.raws[slot] {
                let raw_grad = &mut raw_grad[at_task * d_model..][..d_model];
                let mixture_share = weight * slots.scale(slot, token);
                two_scaled_adds::<S>(raw_grad, mixture_share, grad, dot_grad, inputs.query);
            }
            scaled_add::<S, f32>(&mut out.folded_query, dot_grad, slots.row(slot, token));
        }
    }
    (out.folded_query, out.bias)
}
