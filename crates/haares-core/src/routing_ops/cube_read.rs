//! A whole read (`read.rs`) as one CubeCL kernel each way on the cube backends: the scores, the
//! bias, the softmax over slots and the mixture of eq:routingweights forward, all their
//! gradients backward, one cube per token.
//!
//! The composition launches about 35 kernels for a read of a few slots: the two kernels of
//! `cube.rs`, and around them the `[S, tokens]` arithmetic (every slot's scale and mean square
//! gathered into one tensor, twice; the coefficients; the bias; Burn's softmax in five passes).
//! Here a cube reduces a token's dot products in shared memory, one thread turns them into
//! scores and weights, and the cube then mixes the token's row: one launch, and each slot row is
//! read twice while it is in cache. The backward pass (about 65 launches composed) is one launch
//! too, plus two sums across tokens for the query's and the bias's gradients: a token's cube
//! forms both shares of each slot row's gradient in one update. [`compose`](super::read::compose)
//! and [`compose_backward`](super::read::compose_backward) stay the reference
//! (`tests/cube/kernels.rs` checks one against the other).

use burn::tensor::Tensor;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::cube::{MAX_SLOTS_PER_LAUNCH, ROW_THREADS, cube_tensor, sequence};
use burn_cubecl::tensor::CubeTensor;

use super::{ReadBackward, ReadForward, ReadGradients, SlotRows, from_primitive, slot_column};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// Bindings the kernels need besides their per-slot sequences (three forward, four backward):
/// at most five other inputs, four outputs and metadata.
const OTHER_BINDINGS: usize = 10;

/// Whether a read of `count` slots fits one launch of the kernel with `per_slot` sequences.
fn fits<R: CubeRuntime>(like: &CubeTensor<R>, count: usize, per_slot: usize) -> bool {
    let bindings = like.client.properties().hardware.max_bindings as usize;
    count <= MAX_SLOTS_PER_LAUNCH && per_slot * count + OTHER_BINDINGS <= bindings
}

/// The bits of the slots for which `has` holds, bit `s` for slot `s`.
fn mask<T>(items: &[T], has: impl Fn(&T) -> bool) -> u32 {
    items
        .iter()
        .enumerate()
        .filter(|(_, item)| has(item))
        .fold(0, |mask, (slot, _)| mask | (1 << slot))
}

/// The slots' tensors on the device: raws, scales (the mean square standing in where a slot has
/// none: its bit in the mask is clear and the kernels read no scale), mean squares, and the scale
/// mask.
type DeviceSlots<R> = (
    Vec<CubeTensor<R>>,
    Vec<CubeTensor<R>>,
    Vec<CubeTensor<R>>,
    u32,
);

fn device_slots<R, F, I, BT>(slots: &[SlotRows<Cube<R, F, I, BT>>]) -> DeviceSlots<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let raws = slots.iter().map(|s| cube_tensor(s.raw.clone())).collect();
    let mean_squares: Vec<_> = slots
        .iter()
        .map(|s| cube_tensor(s.mean_square.clone()))
        .collect();
    let scales = slots
        .iter()
        .zip(&mean_squares)
        .map(|(s, stand_in)| {
            s.scale
                .clone()
                .map_or_else(|| stand_in.clone(), cube_tensor)
        })
        .collect();
    (
        raws,
        scales,
        mean_squares,
        mask(slots, |s| s.scale.is_some()),
    )
}

fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: [usize; 2]) -> CubeTensor<R> {
    empty_device_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        like.dtype,
    )
}

/// One cube of [`ROW_THREADS`] per token.
fn per_token<R: CubeRuntime>(like: &CubeTensor<R>, tokens: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&like.client, tokens * ROW_THREADS, cube_dim);
    (cube_count, cube_dim)
}

/// The forward pass of a read in one launch, or `None` where its slots do not fit one (more than
/// [`MAX_SLOTS_PER_LAUNCH`], or more bindings than the device has); the caller then composes it.
pub(super) fn read_forward<R, F, I, BT>(
    slots: &[SlotRows<Cube<R, F, I, BT>>],
    folded_query: Tensor<Cube<R, F, I, BT>, 1>,
    bias: Option<Tensor<Cube<R, F, I, BT>, 2>>,
    epsilon: f64,
) -> Option<ReadForward<Cube<R, F, I, BT>>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let d_model = folded_query.dims()[0];
    let query = cube_tensor(folded_query.reshape([1, d_model]));
    if !fits(&query, slots.len(), 3) {
        return None;
    }
    let [tokens, _] = slots[0].raw.dims();
    let (raws, scales, mean_squares, scaled) = device_slots(slots);
    let biased = bias.is_some();
    let bias = bias.map_or_else(|| query.clone(), cube_tensor);
    let (mixture, weights, scores) = (
        empty(&query, [tokens, d_model]),
        empty(&query, [slots.len(), tokens]),
        empty(&query, [slots.len(), tokens]),
    );
    let (cube_count, cube_dim) = per_token(&query, tokens);
    let (client, dtype) = (query.client.clone(), query.dtype);
    kernels::read_forward_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        sequence(&raws),
        sequence(&scales),
        sequence(&mean_squares),
        query.into_tensor_arg(),
        bias.into_tensor_arg(),
        mixture.clone().into_tensor_arg(),
        weights.clone().into_tensor_arg(),
        scores.clone().into_tensor_arg(),
        scaled,
        epsilon as f32,
        biased,
        ROW_THREADS,
        dtype.into(),
    );
    Some(ReadForward {
        mixture: from_primitive(mixture),
        weights: from_primitive(weights),
        scores: from_primitive(scores),
    })
}

/// A read's backward pass handed back, with the gradients to add to, for the composition.
pub(super) type UnfusedBackward<B> = (ReadBackward<B>, Vec<Option<Tensor<B, 2>>>);

/// The backward pass of a read in one launch and two sums over tokens, or its inputs back where
/// its slots do not fit one launch. Each wanted slot's gradient is its `into` plus both shares
/// (mixture and scores), formed in one update; shared rows (`same_rows`) get each slot's own.
pub(super) fn read_backward<R, F, I, BT>(
    read: ReadBackward<Cube<R, F, I, BT>>,
    into: Vec<Option<Tensor<Cube<R, F, I, BT>, 2>>>,
    wanted: &[bool],
    mean_squares_wanted: &[bool],
) -> Result<ReadGradients<Cube<R, F, I, BT>>, UnfusedBackward<Cube<R, F, I, BT>>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let count = read.slots.len();
    let d_model = read.folded_query.dims()[0];
    let grad = cube_tensor(read.mixture_grad.clone());
    if !fits(&grad, count, 4) {
        return Err((read, into));
    }
    let [tokens, _] = read.slots[0].raw.dims();
    let (raws, scales, mean_squares, scaled) = device_slots(&read.slots);
    let accumulated = mask(&into, Option::is_some);
    let into: Vec<_> = into
        .into_iter()
        .map(|sum| sum.map_or_else(|| grad.clone(), cube_tensor))
        .collect();
    let query = cube_tensor(read.folded_query.reshape([1, d_model]));
    let weights_grad = read.weights_grad.map(cube_tensor);
    let extra = weights_grad.is_some();
    let weights_grad = weights_grad.unwrap_or_else(|| grad.clone());
    let (raw_grads, query_rows) = (
        empty(&grad, [count * tokens, d_model]),
        empty(&grad, [tokens, d_model]),
    );
    let (mean_square_grads, logits_grad) =
        (empty(&grad, [count, tokens]), empty(&grad, [count, tokens]));
    let (cube_count, cube_dim) = per_token(&grad, tokens);
    let (client, dtype) = (grad.client.clone(), grad.dtype);
    kernels::read_backward_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        sequence(&raws),
        sequence(&scales),
        sequence(&mean_squares),
        sequence(&into),
        query.into_tensor_arg(),
        cube_tensor(read.weights).into_tensor_arg(),
        cube_tensor(read.scores).into_tensor_arg(),
        grad.into_tensor_arg(),
        weights_grad.into_tensor_arg(),
        raw_grads.clone().into_tensor_arg(),
        mean_square_grads.clone().into_tensor_arg(),
        logits_grad.clone().into_tensor_arg(),
        query_rows.clone().into_tensor_arg(),
        scaled,
        accumulated,
        mask(wanted, |w| *w),
        read.epsilon as f32,
        extra,
        ROW_THREADS,
        dtype.into(),
    );
    let raw_grads: Tensor<Cube<R, F, I, BT>, 2> = from_primitive(raw_grads);
    let mean_square_grads: Tensor<Cube<R, F, I, BT>, 2> = from_primitive(mean_square_grads);
    let logits_grad: Tensor<Cube<R, F, I, BT>, 2> = from_primitive(logits_grad);
    let query_rows: Tensor<Cube<R, F, I, BT>, 2> = from_primitive(query_rows);
    Ok(ReadGradients {
        raws: (0..count)
            .map(|slot| wanted[slot].then(|| raw_grads.clone().narrow(0, slot * tokens, tokens)))
            .collect(),
        mean_squares: (0..count)
            .map(|slot| {
                mean_squares_wanted[slot].then(|| slot_column(&mean_square_grads, slot, tokens))
            })
            .collect(),
        folded_query: query_rows.sum_dim(0).reshape([d_model]),
        bias: logits_grad.sum_dim(1),
    })
}

mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    /// One cube per token `n`: `dot_s = u · raw_s[n]` reduced in shared memory, then (one
    /// thread) `z'_s = dot_s · c_s / √(m_s + ε)`, `α = softmax_s(z' + b)`, then every thread
    /// `h̃[n, k] = Σ_s α_s c_s raw_s[n, k]` for its `k`. Slot `s` has a scale where bit `s` of
    /// `scaled` is set (`c_s = 1` otherwise); `bias` is read only when `biased`.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_forward_kernel<F: Float>(
        slots: &Sequence<Tensor<F>>,
        scales: &Sequence<Tensor<F>>,
        mean_squares: &Sequence<Tensor<F>>,
        query: &Tensor<F>,
        bias: &Tensor<F>,
        mixture: &mut Tensor<F>,
        weights: &mut Tensor<F>,
        scores: &mut Tensor<F>,
        scaled: u32,
        epsilon: f32,
        #[comptime] biased: bool,
        #[comptime] threads: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let count = comptime![slots.len()];
        let token = CUBE_POS;
        if token >= mixture.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let d_model = mixture.shape(1);
        let mut partials = SharedMemory::<F>::new(count * threads);
        // Per slot: its logit, then e^{logit − max}; and `α_s c_s`, the mixture's factor.
        let mut logits = SharedMemory::<F>::new(count);
        let mut factors = SharedMemory::<F>::new(count);
        #[unroll]
        for slot in 0..count {
            let source = slots.index(slot);
            let mut sum = F::new(0.0);
            let mut k = lane;
            while k < d_model {
                sum += source[token * source.stride(0) + k * source.stride(1)]
                    * query[k * query.stride(1)];
                k += threads;
            }
            partials[slot * threads + lane] = sum;
        }
        sync_cube();
        if lane == 0 {
            #[unroll]
            for slot in 0..count {
                let mut dot = F::new(0.0);
                for thread in 0..threads {
                    dot += partials[slot * threads + thread];
                }
                let mean_square = mean_squares.index(slot);
                let m = mean_square[token * mean_square.stride(0)];
                let mut scale = F::new(1.0);
                if (scaled >> u32::cast_from(slot)) & 1 == 1 {
                    let scales_of_slot = scales.index(slot);
                    scale = scales_of_slot[token * scales_of_slot.stride(0)];
                }
                // A division, as the composition's coefficient is formed.
                let score = dot * (scale / (m + F::cast_from(epsilon)).sqrt());
                scores[slot * scores.stride(0) + token * scores.stride(1)] = score;
                let mut logit = score;
                if biased {
                    logit += bias[slot * bias.stride(0)];
                }
                logits[slot] = logit;
                factors[slot] = scale;
            }
            let mut largest = logits[0];
            for slot in 1..count {
                largest = F::max(largest, logits[slot]);
            }
            let mut total = F::new(0.0);
            for slot in 0..count {
                let exponential = (logits[slot] - largest).exp();
                logits[slot] = exponential;
                total += exponential;
            }
            for slot in 0..count {
                let weight = logits[slot] / total;
                weights[slot * weights.stride(0) + token * weights.stride(1)] = weight;
                factors[slot] = weight * factors[slot];
            }
        }
        sync_cube();
        let mut k = lane;
        while k < d_model {
            let mut sum = F::new(0.0);
            #[unroll]
            for slot in 0..count {
                let source = slots.index(slot);
                sum += factors[slot] * source[token * source.stride(0) + k * source.stride(1)];
            }
            mixture[token * mixture.stride(0) + k * mixture.stride(1)] = sum;
            k += threads;
        }
    }

    /// Slot `slot`'s scale at `token`: 1 where its bit in `scaled` is clear.
    #[cube]
    fn scale_at<F: Float>(
        scales: &Sequence<Tensor<F>>,
        scaled: u32,
        token: usize,
        #[comptime] slot: usize,
    ) -> F {
        let mut scale = F::new(1.0);
        if (scaled >> u32::cast_from(slot)) & 1 == 1 {
            let of_slot = scales.index(slot);
            scale = of_slot[token * of_slot.stride(0)];
        }
        scale
    }

    /// One cube per token `n`, with `g = ∂L/∂h̃[n]`: `a_s = c_s (g · raw_s[n])` reduced in shared
    /// memory; then (one thread) `∂α_s = a_s (+ ∂L/∂α_s)`, `∂ℓ_s = α_s (∂α_s − Σ_r α_r ∂α_r)`
    /// (the logits' gradient, written for the bias's sum), `w_s = ∂ℓ_s c_s / √(m_s + ε)` and
    /// `∂m_s = −½ ∂ℓ_s z'_s / (m_s + ε)`; then every thread, for its `k`,
    /// `∂raw_s[n, k] = into_s[n, k] + α_s c_s g[k] + w_s u[k]` for the wanted slots (rows
    /// `s·tokens + n` of `raw_grads`) and `Σ_s w_s raw_s[n, k]`, the token's share of `∂u`.
    /// Bit `s` of `scaled`, `accumulated` and `wanted` says whether slot `s` has a scale, a
    /// gradient `into_s` to add to, and a gradient wanted.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_backward_kernel<F: Float>(
        slots: &Sequence<Tensor<F>>,
        scales: &Sequence<Tensor<F>>,
        mean_squares: &Sequence<Tensor<F>>,
        into: &Sequence<Tensor<F>>,
        query: &Tensor<F>,
        weights: &Tensor<F>,
        scores: &Tensor<F>,
        grad: &Tensor<F>,
        weights_grad: &Tensor<F>,
        raw_grads: &mut Tensor<F>,
        mean_square_grads: &mut Tensor<F>,
        logits_grad: &mut Tensor<F>,
        query_rows: &mut Tensor<F>,
        scaled: u32,
        accumulated: u32,
        wanted: u32,
        epsilon: f32,
        #[comptime] extra: bool,
        #[comptime] threads: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let count = comptime![slots.len()];
        let tokens = query_rows.shape(0);
        let token = CUBE_POS;
        if token >= tokens {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let d_model = query_rows.shape(1);
        let grad_row = token * grad.stride(0);
        let mut partials = SharedMemory::<F>::new(count * threads);
        // Per slot: `α_s c_s`, then `w_s`.
        let mut mixture_factors = SharedMemory::<F>::new(count);
        let mut score_factors = SharedMemory::<F>::new(count);
        #[unroll]
        for slot in 0..count {
            let source = slots.index(slot);
            let mut sum = F::new(0.0);
            let mut k = lane;
            while k < d_model {
                sum += source[token * source.stride(0) + k * source.stride(1)]
                    * grad[grad_row + k * grad.stride(1)];
                k += threads;
            }
            partials[slot * threads + lane] = sum;
        }
        sync_cube();
        if lane == 0 {
            let mut along = F::new(0.0);
            #[unroll]
            for slot in 0..count {
                let mut dot = F::new(0.0);
                for thread in 0..threads {
                    dot += partials[slot * threads + thread];
                }
                let scale = scale_at::<F>(scales, scaled, token, slot);
                let at = slot * weights.stride(0) + token * weights.stride(1);
                let mut weight_grad = dot * scale;
                if extra {
                    weight_grad += weights_grad
                        [slot * weights_grad.stride(0) + token * weights_grad.stride(1)];
                }
                // Kept in the score factors until the sum along the slots is known.
                score_factors[slot] = weight_grad;
                along += weights[at] * weight_grad;
            }
            #[unroll]
            for slot in 0..count {
                let scale = scale_at::<F>(scales, scaled, token, slot);
                let mean_square = mean_squares.index(slot);
                let shifted = mean_square[token * mean_square.stride(0)] + F::cast_from(epsilon);
                let weight = weights[slot * weights.stride(0) + token * weights.stride(1)];
                let logit_grad = weight * (score_factors[slot] - along);
                logits_grad[slot * logits_grad.stride(0) + token * logits_grad.stride(1)] =
                    logit_grad;
                let score = scores[slot * scores.stride(0) + token * scores.stride(1)];
                mean_square_grads
                    [slot * mean_square_grads.stride(0) + token * mean_square_grads.stride(1)] =
                    (logit_grad * score / shifted) * F::new(-0.5);
                mixture_factors[slot] = weight * scale;
                // A division, as the composition's coefficient is formed.
                score_factors[slot] = logit_grad * (scale / shifted.sqrt());
            }
        }
        sync_cube();
        let mut k = lane;
        while k < d_model {
            let g = grad[grad_row + k * grad.stride(1)];
            let u = query[k * query.stride(1)];
            let mut query_sum = F::new(0.0);
            #[unroll]
            for slot in 0..count {
                let source = slots.index(slot);
                query_sum +=
                    score_factors[slot] * source[token * source.stride(0) + k * source.stride(1)];
                if (wanted >> u32::cast_from(slot)) & 1 == 1 {
                    let mut sum = g * mixture_factors[slot];
                    if (accumulated >> u32::cast_from(slot)) & 1 == 1 {
                        let earlier = into.index(slot);
                        sum = earlier[token * earlier.stride(0) + k * earlier.stride(1)] + sum;
                    }
                    let row = slot * tokens + token;
                    raw_grads[row * raw_grads.stride(0) + k * raw_grads.stride(1)] =
                        sum + score_factors[slot] * u;
                }
            }
            query_rows[token * query_rows.stride(0) + k * query_rows.stride(1)] = query_sum;
            k += threads;
        }
    }
}
