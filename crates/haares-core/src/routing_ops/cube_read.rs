//! A whole read's forward pass (`read.rs`) as one CubeCL kernel on the cube backends: the
//! scores, the bias, the softmax over slots and the mixture of eq:routingweights, one cube per
//! token.
//!
//! The composition launches about 35 kernels for a read of a few slots: the two kernels of
//! `cube.rs`, and around them the `[S, tokens]` arithmetic (every slot's scale and mean square
//! gathered into one tensor, twice; the coefficients; the bias; Burn's softmax in five passes).
//! Here a cube reduces a token's dot products in shared memory, one thread turns them into
//! scores and weights, and the cube then mixes the token's row: one launch, and each slot row is
//! read twice while it is in cache. [`compose`](super::read::compose) stays the reference
//! (`tests/cube/kernels.rs` checks one against the other).

use burn::tensor::Tensor;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::cube::{MAX_SLOTS_PER_LAUNCH, ROW_THREADS, cube_tensor, sequence};
use super::{ReadForward, SlotRows, from_primitive};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// Bindings the kernel needs besides its three per-slot sequences: query, bias, three outputs
/// and metadata.
const OTHER_BINDINGS: usize = 6;

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
    let bindings = query.client.properties().hardware.max_bindings as usize;
    if slots.len() > MAX_SLOTS_PER_LAUNCH || 3 * slots.len() + OTHER_BINDINGS > bindings {
        return None;
    }
    let [tokens, _] = slots[0].raw.dims();
    let raws: Vec<_> = slots.iter().map(|s| cube_tensor(s.raw.clone())).collect();
    let mean_squares: Vec<_> = slots
        .iter()
        .map(|s| cube_tensor(s.mean_square.clone()))
        .collect();
    // A slot without a scale has a scale of 1: its entry in `scaled` is clear, and the kernel
    // never reads the stand-in it is given (its mean square) as a scale.
    let scaled = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.scale.is_some())
        .fold(0u32, |mask, (slot, _)| mask | (1 << slot));
    let scales: Vec<_> = slots
        .iter()
        .zip(&mean_squares)
        .map(|(s, stand_in)| match &s.scale {
            Some(scale) => cube_tensor(scale.clone()),
            None => stand_in.clone(),
        })
        .collect();
    let biased = bias.is_some();
    let bias = bias.map_or_else(|| query.clone(), cube_tensor);
    let (client, device, dtype) = (query.client.clone(), query.device.clone(), query.dtype);
    let empty = |shape: [usize; 2]| {
        empty_device_dtype::<R>(client.clone(), device.clone(), shape.into(), dtype)
    };
    let (mixture, weights, scores) = (
        empty([tokens, d_model]),
        empty([slots.len(), tokens]),
        empty([slots.len(), tokens]),
    );
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&client, tokens * ROW_THREADS, cube_dim);
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
}
