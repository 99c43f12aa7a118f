//! The whole read (`read.rs`) on Flex, token by token: a token's slot rows are scored, normalised
//! and mixed while they are in cache, and in the backward pass each slot row's gradient, the
//! mixture's share and the scores' together, is added to the slot's accumulated gradient in one
//! update (in place when Flex holds that buffer unshared). Per slot and read this moves a slot
//! once forward and once (plus its gradient once) backward, where the two operations move it
//! twice and twice. f32 reads whose operands all lie contiguously take these loops; others take
//! the composition ([`compose`], [`compose_backward`]).

use burn::backend::Flex;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;
use macerator::Simd;

use super::SlotRows;
use super::read::{ReadBackward, ReadForward, ReadGradients, compose, compose_backward};
use crate::simd::{dot_product, exp, scaled_add, two_scaled_adds};

/// Flex's buffer behind a tensor of `shape`, when it is f32 and contiguous.
fn f32_buffer<const D: usize>(tensor: &Tensor<Flex, D>, shape: [usize; D]) -> Option<FlexTensor> {
    let buffer = tensor.clone().into_primitive().tensor();
    let readable = tensor.dims() == shape && buffer.as_slice::<f32>().is_some();
    readable.then_some(buffer)
}

fn slice(buffer: &FlexTensor) -> &[f32] {
    buffer.as_slice::<f32>().expect("checked by f32_buffer")
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<Flex, D> {
    let buffer = FlexTensor::from_data(TensorData::new(values, shape));
    Tensor::from_primitive(TensorPrimitive::Float(buffer))
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
            buffers
                .mean_squares
                .push(f32_buffer(&slot.mean_square, column)?);
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
            tokens: self.tokens,
            d_model: self.d_model,
        }
    }
}

struct SlotViews<'a> {
    raws: Vec<&'a [f32]>,
    scales: Vec<Option<&'a [f32]>>,
    mean_squares: Vec<&'a [f32]>,
    tokens: usize,
    d_model: usize,
}

impl SlotViews<'_> {
    fn row(&self, slot: usize, token: usize) -> &[f32] {
        &self.raws[slot][token * self.d_model..][..self.d_model]
    }

    fn scale(&self, slot: usize, token: usize) -> f32 {
        self.scales[slot].map_or(1.0, |scale| scale[token])
    }
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
        let mut out = ForwardOut {
            mixture: vec![0.0; tokens * d_model],
            weights: vec![0.0; count * tokens],
            scores: vec![0.0; count * tokens],
        };
        let inputs = (buffers.views(), slice(&query), bias.as_ref().map(slice));
        read_forward_loop(&inputs.0, inputs.1, inputs.2, epsilon as f32, &mut out);
        Some(ReadForward {
            mixture: tensor(out.mixture, [tokens, d_model]),
            weights: tensor(out.weights, [count, tokens]),
            scores: tensor(out.scores, [count, tokens]),
        })
    };
    host().unwrap_or_else(|| compose(slots, folded_query, bias, epsilon))
}

struct ForwardOut {
    mixture: Vec<f32>,
    weights: Vec<f32>,
    scores: Vec<f32>,
}

/// Per token: `z'_s = c_s (u · raw_s) / √(m_s + ε)`, `α = softmax_s(z' + b)`, `h̃ = Σ_s α_s c_s raw_s`.
#[macerator::with_simd]
fn read_forward_loop<'a, S: Simd>(
    slots: &SlotViews<'a>,
    query: &'a [f32],
    bias: Option<&'a [f32]>,
    epsilon: f32,
    out: &mut ForwardOut,
) {
    let (count, tokens, d_model) = (slots.raws.len(), slots.tokens, slots.d_model);
    let mut weights = vec![0.0f32; count];
    for (token, mixed) in out.mixture.chunks_exact_mut(d_model).enumerate() {
        for (slot, logit) in weights.iter_mut().enumerate() {
            let coefficient =
                slots.scale(slot, token) / (slots.mean_squares[slot][token] + epsilon).sqrt();
            let score = dot_product::<S, f32>(slots.row(slot, token), query) * coefficient;
            out.scores[slot * tokens + token] = score;
            *logit = score + bias.map_or(0.0, |bias| bias[slot]);
        }
        let largest = weights.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut total = 0.0;
        for weight in weights.iter_mut() {
            *weight = exp(*weight - largest);
            total += *weight;
        }
        for (slot, weight) in weights.iter_mut().enumerate() {
            *weight /= total;
            out.weights[slot * tokens + token] = *weight;
            let factor = *weight * slots.scale(slot, token);
            scaled_add::<S, f32>(mixed, factor, slots.row(slot, token));
        }
    }
}

/// Where a slot's gradient is formed: in the accumulated gradient's own buffer, or in a new one.
enum Target {
    InPlace(FlexTensor, usize, usize),
    New(Vec<f32>),
}

impl Target {
    /// The accumulated gradient `into` (`[tokens, d]` f32, or none yet) as a target.
    fn new(into: Option<Tensor<Flex, 2>>, len: usize) -> Self {
        let Some(into) = into else {
            return Self::New(vec![0.0; len]);
        };
        let mut buffer = into.into_primitive().tensor();
        if let Some((start, end)) = buffer.layout().contiguous_offsets()
            && buffer.try_storage_mut::<f32>().is_some()
        {
            return Self::InPlace(buffer, start, end);
        }
        Self::New(buffer.to_contiguous().storage::<f32>().to_vec())
    }

    fn values(&mut self) -> &mut [f32] {
        match self {
            Self::InPlace(buffer, start, end) => {
                let storage = buffer.try_storage_mut::<f32>();
                &mut storage.expect("checked unshared by Target::new")[*start..*end]
            }
            Self::New(values) => values,
        }
    }

    fn into_tensor(self, shape: [usize; 2]) -> Tensor<Flex, 2> {
        match self {
            Self::InPlace(buffer, ..) => Tensor::from_primitive(TensorPrimitive::Float(buffer)),
            Self::New(values) => tensor(values, shape),
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
    let slot_major = [count, tokens];
    let operands = (
        f32_buffer(&read.folded_query, [d_model]),
        f32_buffer(&read.scores, slot_major),
        f32_buffer(&read.weights, slot_major),
        f32_buffer(&read.mixture_grad, [tokens, d_model]),
        read.weights_grad
            .as_ref()
            .map(|grad| f32_buffer(grad, slot_major)),
    );
    let intos_fit = into.iter().all(|into| {
        into.as_ref()
            .is_none_or(|into| into.dims() == [tokens, d_model] && into.dtype() == DType::F32)
    });
    let (Some(query), Some(scores), Some(weights), Some(mixture_grad), weights_grad) = operands
    else {
        return compose_backward(read, into, wanted, mean_squares_wanted);
    };
    if !intos_fit || weights_grad.as_ref().is_some_and(Option::is_none) {
        return compose_backward(read, into, wanted, mean_squares_wanted);
    }
    let weights_grad = weights_grad.flatten();

    let mut targets: Vec<Option<Target>> = into
        .into_iter()
        .zip(wanted)
        .map(|(into, &wanted)| wanted.then(|| Target::new(into, tokens * d_model)))
        .collect();
    let mut out = BackwardOut {
        raws: targets
            .iter_mut()
            .map(|t| t.as_mut().map(Target::values))
            .collect(),
        mean_squares: (0..count)
            .map(|slot| mean_squares_wanted[slot].then(|| vec![0.0; tokens]))
            .collect(),
        folded_query: vec![0.0; d_model],
        bias: vec![0.0; count],
    };
    let inputs = BackwardInputs {
        slots: buffers.views(),
        query: slice(&query),
        scores: slice(&scores),
        weights: slice(&weights),
        mixture_grad: slice(&mixture_grad),
        weights_grad: weights_grad.as_ref().map(slice),
        epsilon: read.epsilon as f32,
    };
    read_backward_loop(&inputs, &mut out);
    let BackwardOut {
        mean_squares,
        folded_query,
        bias,
        ..
    } = out;
    ReadGradients {
        raws: targets
            .into_iter()
            .map(|target| target.map(|target| target.into_tensor([tokens, d_model])))
            .collect(),
        mean_squares: mean_squares
            .into_iter()
            .map(|grad| grad.map(|grad| tensor(grad, [tokens, 1])))
            .collect(),
        folded_query: tensor(folded_query, [d_model]),
        bias: tensor(bias.into_iter().map(|sum| sum as f32).collect(), [count, 1]),
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
}

struct BackwardOut<'a> {
    raws: Vec<Option<&'a mut [f32]>>,
    mean_squares: Vec<Option<Vec<f32>>>,
    folded_query: Vec<f32>,
    /// Summed over tokens in f64: a sum of `tokens` terms per slot.
    bias: Vec<f64>,
}

/// Per token, with `g = ∂h̃`: `∂α_s = c_s (raw_s · g) + ∂α_s(weights)`; the softmax's
/// `∂z_s = α_s (∂α_s − Σ_k α_k ∂α_k)`; with `w_s = ∂z_s c_s / √(m_s + ε)`: `∂raw_s += α_s c_s g
/// + w_s u` (one update), `∂m_s = −½ ∂z_s z'_s / (m_s + ε)`, `∂u += w_s raw_s`, `∂b_s += ∂z_s`.
#[macerator::with_simd]
fn read_backward_loop<'a, 'b, S: Simd>(inputs: &BackwardInputs<'a>, out: &mut BackwardOut<'b>) {
    let slots = &inputs.slots;
    let (count, tokens, d_model) = (slots.raws.len(), slots.tokens, slots.d_model);
    let mut weights_grads = vec![0.0f32; count];
    for token in 0..tokens {
        let grad = &inputs.mixture_grad[token * d_model..][..d_model];
        for (slot, weight_grad) in weights_grads.iter_mut().enumerate() {
            let at = slot * tokens + token;
            let dot = dot_product::<S, f32>(slots.row(slot, token), grad);
            *weight_grad =
                dot * slots.scale(slot, token) + inputs.weights_grad.map_or(0.0, |grads| grads[at]);
        }
        let along_slots: f32 = (0..count)
            .map(|slot| inputs.weights[slot * tokens + token] * weights_grads[slot])
            .sum();
        for (slot, &weight_grad) in weights_grads.iter().enumerate() {
            let at = slot * tokens + token;
            let (weight, scale) = (inputs.weights[at], slots.scale(slot, token));
            let logit_grad = weight * (weight_grad - along_slots);
            out.bias[slot] += f64::from(logit_grad);
            let shifted = slots.mean_squares[slot][token] + inputs.epsilon;
            let dot_grad = logit_grad * (scale / shifted.sqrt());
            if let Some(grads) = &mut out.mean_squares[slot] {
                grads[token] = (logit_grad * inputs.scores[at] / shifted) * -0.5;
            }
            if let Some(raw_grad) = &mut out.raws[slot] {
                let raw_grad = &mut raw_grad[token * d_model..][..d_model];
                two_scaled_adds::<S>(raw_grad, weight * scale, grad, dot_grad, inputs.query);
            }
            scaled_add::<S, f32>(&mut out.folded_query, dot_grad, slots.row(slot, token));
        }
    }
}
