//! The backward pass of the whole read on Flex (`flex_forward.rs` has the forward pass): per token,
//! every slot row's gradient, the mixture's share and the scores' together, added to the slot's
//! accumulated gradient in one update, in fixed-size token tasks on Rayon's pool.

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use burn_flex::FlexTensor;
use macerator::Simd;
use rayon::prelude::*;

use super::flex_forward::{SlotBuffers, SlotViews, f32_buffer};
use super::naive::compose_backward;
use super::{ReadBackward, ReadGradients, bias_gradient};
use crate::ops::routing::flex_rows::tokens_per_task;
use crate::ops::routing::sums::flex_add::{Added, Target};
use crate::simd::{dot_product, flex_tensor, scaled_add, slice, two_scaled_adds};

/// [`RoutingBackend::routing_read_backward`](super::RoutingBackend::routing_read_backward) on
/// Flex.
pub(super) fn read_backward(
    read: ReadBackward<Flex>,
    into: Vec<Option<Tensor<Flex, 2>>>,
    wanted: &[bool],
    mean_squares_wanted: &[bool],
) -> ReadGradients<Flex> {
    // Flex does not fold mean squares (`folds_mean_squares`); a caller that asks gets the
    // composition's fold.
    let buffers = (!read.fold_mean_squares).then(|| SlotBuffers::new(&read.slots));
    let Some(Some(buffers)) = buffers else {
        return compose_backward(read, into, wanted, mean_squares_wanted);
    };
    let (count, tokens, d_model) = (read.slots.len(), buffers.tokens, buffers.d_model);
    let shape = [tokens, d_model];
    let Some(operands) = Operands::of(&read, &into, count, shape) else {
        return compose_backward(read, into, wanted, mean_squares_wanted);
    };
    let mut views = buffers.views();
    views.same_rows = shared_gradient_rows(&views, &read.same_rows, &into, wanted);
    let mut targets: Vec<Target<f32>> = (into.into_iter().zip(wanted).enumerate())
        .map(|(slot, (into, &wanted))| Target::new(into, wanted && views.reads_rows(slot), shape))
        .collect();
    let mut mean_square_grads: Vec<Option<Vec<f32>>> = (0..count)
        .map(|slot| mean_squares_wanted[slot].then(|| vec![0.0; tokens]))
        .collect();
    let inputs = BackwardInputs {
        slots: views,
        query: slice(&operands.query),
        scores: slice(&operands.scores),
        weights: slice(&operands.weights),
        mixture_grad: slice(&operands.mixture_grad),
        weights_grad: operands.weights_grad.as_ref().map(slice),
        epsilon: read.epsilon as f32,
        tokens,
    };
    let (folded_query, bias) = run_tasks(&inputs, &mut targets, &mut mean_square_grads);
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
        query: read.query.gradients(flex_tensor(folded_query, [d_model])),
        bias: read.bias_wanted.then(|| {
            let column = flex_tensor(bias.into_iter().map(|sum| sum as f32).collect(), [count, 1]);
            bias_gradient(column, &read.biased_slots)
        }),
        gain: None,
    }
}

/// A read's operands beside its slots, as f32 buffers.
struct Operands {
    query: FlexTensor,
    scores: FlexTensor,
    weights: FlexTensor,
    mixture_grad: FlexTensor,
    weights_grad: Option<FlexTensor>,
}

impl Operands {
    /// The operands of `read` with `count` slots of `[tokens, d]` rows, when every one (and every
    /// accumulated gradient in `into`) is a contiguous f32 buffer of its shape; `None` otherwise
    /// (the composition then serves).
    fn of(
        read: &ReadBackward<Flex>,
        into: &[Option<Tensor<Flex, 2>>],
        count: usize,
        shape: [usize; 2],
    ) -> Option<Self> {
        let slot_major = [count, shape[0]];
        let intos_fit = into.iter().all(|into| {
            into.as_ref()
                .is_none_or(|into| into.dims() == shape && into.dtype() == DType::F32)
        });
        let weights_grad = match &read.weights_grad {
            Some(grad) => Some(f32_buffer(grad, slot_major)?),
            None => None,
        };
        intos_fit.then_some(())?;
        Some(Self {
            query: f32_buffer(&read.query.folded(), [shape[1]])?,
            scores: f32_buffer(&read.scores, slot_major)?,
            weights: f32_buffer(&read.weights, slot_major)?,
            mixture_grad: f32_buffer(&read.mixture_grad, shape)?,
            weights_grad,
        })
    }
}

/// Runs the backward pass in fixed-size token tasks on Rayon's pool, each writing its tokens'
/// rows of `targets` and `mean_square_grads`; returns the folded query's gradient and the
/// per-slot bias gradients (in f64), summed over the tasks in task order.
fn run_tasks(
    inputs: &BackwardInputs<'_>,
    targets: &mut [Target<f32>],
    mean_square_grads: &mut [Option<Vec<f32>>],
) -> (Vec<f32>, Vec<f64>) {
    let (tokens, d_model, count) = (inputs.tokens, inputs.query.len(), targets.len());
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
            read_backward_task(inputs, out)
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
    (folded_query, bias)
}

/// Which slots' rows take their gradient in an earlier slot's entry: where the graph says they are
/// one tensor (`same_rows`), the buffers are one, both or neither want a gradient, and the later
/// slot has no accumulated gradient of its own to add to.
fn shared_gradient_rows(
    views: &SlotViews<'_>,
    same_rows: &[usize],
    into: &[Option<Tensor<Flex, 2>>],
    wanted: &[bool],
) -> Vec<usize> {
    (0..views.raws.len())
        .map(|slot| {
            let first = same_rows.get(slot).copied().unwrap_or(slot);
            let shared = first < slot
                && views.same_rows[slot] == views.same_rows[first]
                && wanted[first] == wanted[slot]
                && into[slot].is_none();
            if shared { first } else { slot }
        })
        .collect()
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
    let count = slots.raws.len();
    let (mut dots, mut weights_grads) = (vec![0.0f32; count], vec![0.0f32; count]);
    // Later slots' shares of the gradient of rows an earlier slot reads, gathered as the slots
    // are visited last to first (as in the forward pass): `(mixture share, dot gradient)`.
    let mut later_shares = vec![(0.0f32, 0.0f32); count];
    let first = out.tokens.start;
    for token in out.tokens.clone() {
        let at_task = token - first;
        let grad = &inputs.mixture_grad[token * d_model..][..d_model];
        for (slot, weight_grad) in weights_grads.iter_mut().enumerate() {
            let reader = slots.same_rows[slot];
            if reader == slot {
                dots[slot] = dot_product::<S, f32>(slots.row(slot, token), grad);
            }
            let given = inputs
                .weights_grad
                .map_or(0.0, |grads| grads[slot * tokens + token]);
            *weight_grad = dots[reader] * slots.scale(slot, token) + given;
        }
        let along_slots: f32 = (weights_grads.iter().enumerate())
            .map(|(slot, grad)| inputs.weights[slot * tokens + token] * grad)
            .sum();
        for (slot, &weight_grad) in weights_grads.iter().enumerate().rev() {
            let at = slot * tokens + token;
            let weight = inputs.weights[at];
            let logit_grad = weight * (weight_grad - along_slots);
            out.bias[slot] += f64::from(logit_grad);
            let (coefficient, shifted) = slots.coefficient(slot, token, inputs.epsilon);
            if let Some(grads) = &mut out.mean_squares[slot] {
                grads[at_task] = (logit_grad * inputs.scores[at] / shifted) * -0.5;
            }
            let (later_mixture, later_dot) = later_shares[slot];
            let mixture_share = weight * slots.scale(slot, token) + later_mixture;
            let dot_grad = logit_grad * coefficient + later_dot;
            match slots.same_rows[slot] {
                reader if reader == slot => {
                    if let Some(raw_grad) = &mut out.raws[slot] {
                        let raw_grad = &mut raw_grad[at_task * d_model..][..d_model];
                        two_scaled_adds::<S>(raw_grad, mixture_share, grad, dot_grad, inputs.query);
                    }
                    scaled_add::<S, f32>(&mut out.folded_query, dot_grad, slots.row(slot, token));
                    later_shares[slot] = (0.0, 0.0);
                }
                reader => {
                    later_shares[reader].0 += mixture_share;
                    later_shares[reader].1 += dot_grad;
                }
            }
        }
    }
    (out.folded_query, out.bias)
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
