//! Causal attention as a flash-style CubeCL kernel pair (`cube.rs` has the other activations and
//! the shared pieces): one launch forward, two backward, where the plain operations launch two
//! matrix products, the softmax and four copies of moved heads forward (7), and four products,
//! the softmax's backward and six copies backward (11; issue 34: a CUDA step costs its launch
//! count).
//!
//! Queries, keys and values are read in the projections' own `[batch, seq, heads, d_h]` layout,
//! through their strides, so the heads are never moved. Each cube takes 32 (or 16, [`tile_for`]) consecutive
//! positions of one head of one batch row, one thread per position; the cube's threads load the
//! rows the other side needs into shared memory one tile at a time, and each thread walks the
//! tile's rows its position may see.
//!
//! - **Forward**: each query keeps its running maximum `m`, its sum `l = Σ e^{s − m}` and its
//!   output `o = Σ e^{s − m} v`, rescaled when `m` grows (the online softmax), and writes `o / l`
//!   and its log-sum-exp `m + ln l`. No `[seq, seq]` tensor is written.
//! - **∂Q**: each query recomputes `p = e^{s − lse}` from its log-sum-exp, with
//!   `Δ = Σ_e ∂o_e o_e`, `∂s = p (∂o · v − Δ)` and `∂q = Σ_keys ∂s k`; it writes `Δ` for the next.
//! - **∂K, ∂V**: each key walks the queries that see it: `∂v = Σ p ∂o`, `∂k = Σ ∂s q`.
//!
//! Every thread keeps its own row and its accumulators in registers (`d_h` values each), so the
//! head width is a compile-time constant; [`MAX_HEAD_DIM`] bounds the shared memory a cube takes.
//! `tests/core/attention_checks.rs` checks the kernels against f64 on wgpu and CUDA.

use burn::tensor::{Shape, Tensor};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::cube::{empty_like, primitive};
use crate::autodiff_node::from_primitive;

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// The widest head the kernels take.
pub(super) const MAX_HEAD_DIM: usize = 128;

/// Positions per cube, and rows per shared-memory tile, for heads `head_dim` wide: 32, or 16 for
/// heads wider than 64, so that the key–value kernel's two tiles of `tile × d_h` values and two
/// of `tile` (`tile · (2 d_h + 2)` f32 values) stay within 32 KiB of shared memory, the limit of
/// Mesa's software Vulkan and of many devices (CUDA's is 48 KiB). At `d_h = 128` and a tile of 32
/// they took 33,024 bytes, and lavapipe returned wrong key gradients without an error.
fn tile_for(head_dim: usize) -> usize {
    match head_dim {
        0..=64 => 32,
        _ => 16,
    }
}

/// [`ActivationBackend::causal_attention_forward`](super::ActivationBackend::causal_attention_forward) in one
/// launch: the output `[batch, seq, heads, d_h]` and each query's log-sum-exp `[batch, seq, heads]`.
pub(super) fn causal_attention_forward<R, F, I, BT>(
    query: Tensor<Cube<R, F, I, BT>, 4>,
    key: Tensor<Cube<R, F, I, BT>, 4>,
    value: Tensor<Cube<R, F, I, BT>, 4>,
) -> (Tensor<Cube<R, F, I, BT>, 4>, Tensor<Cube<R, F, I, BT>, 3>)
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let head_dim = query.dims()[3];
    let (query, key, value) = (primitive(query), primitive(key), primitive(value));
    let output = empty_like(&query);
    let logsumexp = per_query(&query);
    let tile = tile_for(head_dim);
    let (cube_count, cube_dim) = per_tile(&query, tile);
    kernels::attention_forward_kernel::launch::<R>(
        &query.client.clone(),
        cube_count,
        cube_dim,
        query.clone().into_tensor_arg(),
        key.into_tensor_arg(),
        value.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        logsumexp.clone().into_tensor_arg(),
        head_dim,
        tile,
        query.dtype.into(),
    );
    (from_primitive(output), from_primitive(logsumexp))
}

/// [`ActivationBackend::causal_attention_backward`](super::ActivationBackend::causal_attention_backward) in
/// two launches: `∂Q` (and each query's `Δ`), then `∂K` and `∂V`.
pub(super) fn causal_attention_backward<R, F, I, BT>(
    query: Tensor<Cube<R, F, I, BT>, 4>,
    key: Tensor<Cube<R, F, I, BT>, 4>,
    value: Tensor<Cube<R, F, I, BT>, 4>,
    output: Tensor<Cube<R, F, I, BT>, 4>,
    logsumexp: Tensor<Cube<R, F, I, BT>, 3>,
    grad: Tensor<Cube<R, F, I, BT>, 4>,
) -> [Tensor<Cube<R, F, I, BT>, 4>; 3]
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let head_dim = query.dims()[3];
    let (query, key, value) = (primitive(query), primitive(key), primitive(value));
    let (output, logsumexp, grad) = (primitive(output), primitive(logsumexp), primitive(grad));
    let (query_grad, key_grad, value_grad) =
        (empty_like(&query), empty_like(&query), empty_like(&query));
    let delta = per_query(&query);
    let client = query.client.clone();
    let tile = tile_for(head_dim);
    let (cube_count, cube_dim) = per_tile(&query, tile);
    kernels::attention_query_grad_kernel::launch::<R>(
        &client,
        cube_count.clone(),
        cube_dim,
        query.clone().into_tensor_arg(),
        key.clone().into_tensor_arg(),
        value.clone().into_tensor_arg(),
        output.into_tensor_arg(),
        logsumexp.clone().into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        query_grad.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        head_dim,
        tile,
        query.dtype.into(),
    );
    kernels::attention_key_value_grad_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        query.clone().into_tensor_arg(),
        key.into_tensor_arg(),
        value.into_tensor_arg(),
        logsumexp.into_tensor_arg(),
        delta.into_tensor_arg(),
        grad.into_tensor_arg(),
        key_grad.clone().into_tensor_arg(),
        value_grad.clone().into_tensor_arg(),
        head_dim,
        tile,
        query.dtype.into(),
    );
    [query_grad, key_grad, value_grad].map(from_primitive)
}

/// A contiguous `[batch, seq, heads]` tensor: one value per query of `like`.
fn per_query<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    let shape = like.meta.shape();
    empty_device_contiguous_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        Shape::new([shape[0], shape[1], shape[2]]),
        like.dtype,
    )
}

/// One cube of `tile` threads per tile of positions of every head of every batch row.
fn per_tile<R: CubeRuntime>(like: &CubeTensor<R>, tile: usize) -> (CubeCount, CubeDim) {
    let shape = like.meta.shape();
    let cubes = shape[0] * shape[2] * shape[1].div_ceil(tile);
    let cube_dim = CubeDim::new_1d(tile as u32);
    (
        calculate_cube_count_elemwise(&like.client, cubes * tile, cube_dim),
        cube_dim,
    )
}

mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    /// Where element `e` of head `head` at position `t` of batch row `b` lies in a
    /// `[batch, seq, heads, d_h]` tensor.
    #[cube]
    fn at<F: Float>(x: &Tensor<F>, b: usize, t: usize, head: usize, e: usize) -> usize {
        b * x.stride(0) + t * x.stride(1) + head * x.stride(2) + e * x.stride(3)
    }

    /// The tiles of `tile` positions that cover `seq`.
    #[cube]
    fn tiles_of(seq: usize, #[comptime] tile: usize) -> usize {
        (seq + tile - 1) / tile
    }

    /// The first position of this cube's tile; the cubes run over the tiles of a head, then the
    /// heads, then the batch rows ([`head_of_cube`], [`batch_of_cube`]).
    #[cube]
    fn first_of_cube(seq: usize, #[comptime] tile: usize) -> usize {
        (CUBE_POS % tiles_of(seq, tile)) * tile
    }

    #[cube]
    fn head_of_cube(seq: usize, heads: usize, #[comptime] tile: usize) -> usize {
        (CUBE_POS / tiles_of(seq, tile)) % heads
    }

    #[cube]
    fn batch_of_cube(seq: usize, heads: usize, #[comptime] tile: usize) -> usize {
        CUBE_POS / (tiles_of(seq, tile) * heads)
    }

    /// Row `t` of head `head` of `x` into `row`, or zeros past the sequence.
    #[cube]
    fn load_row<F: Float>(
        x: &Tensor<F>,
        row: &mut Array<F>,
        b: usize,
        t: usize,
        head: usize,
        #[comptime] head_dim: usize,
    ) {
        let inside = t < x.shape(1);
        for e in 0..head_dim {
            row[e] = F::new(0.0);
            if inside {
                row[e] = x[at(x, b, t, head, e)];
            }
        }
    }

    /// Rows `start + lane` of head `head` of `x` into row `lane` of the shared `tile`, for every
    /// lane below `end − start`.
    #[cube]
    fn load_tile<F: Float>(
        x: &Tensor<F>,
        tile: &mut SharedMemory<F>,
        b: usize,
        start: usize,
        end: usize,
        head: usize,
        lane: usize,
        #[comptime] head_dim: usize,
    ) {
        let t = start + lane;
        if t < end {
            for e in 0..head_dim {
                tile[lane * head_dim + e] = x[at(x, b, t, head, e)];
            }
        }
    }

    /// `Σ_e row_e · tile[at + e]`.
    #[cube]
    fn dot<F: Float>(
        row: &Array<F>,
        tile: &SharedMemory<F>,
        at: usize,
        #[comptime] head_dim: usize,
    ) -> F {
        let mut sum = F::new(0.0);
        for e in 0..head_dim {
            sum += row[e] * tile[at + e];
        }
        sum
    }

    /// `accumulator += weight · tile[at..at + d_h]`.
    #[cube]
    fn add_scaled<F: Float>(
        accumulator: &mut Array<F>,
        weight: F,
        tile: &SharedMemory<F>,
        at: usize,
        #[comptime] head_dim: usize,
    ) {
        for e in 0..head_dim {
            accumulator[e] += weight * tile[at + e];
        }
    }

    /// The online softmax over the keys each query sees; writes `o / l` and `m + ln l`.
    #[cube(launch)]
    pub(super) fn attention_forward_kernel<F: Float>(
        query: &Tensor<F>,
        key: &Tensor<F>,
        value: &Tensor<F>,
        output: &mut Tensor<F>,
        logsumexp: &mut Tensor<F>,
        #[comptime] head_dim: usize,
        #[comptime] tile: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let (seq, heads) = (output.shape(1), output.shape(2));
        if CUBE_POS >= output.shape(0) * heads * tiles_of(seq, tile) {
            terminate!();
        }
        let (first, head) = (first_of_cube(seq, tile), head_of_cube(seq, heads, tile));
        let b = batch_of_cube(seq, heads, tile);
        let lane = UNIT_POS_X as usize;
        let i = first + lane;
        let mut q = Array::<F>::new(head_dim);
        let mut o = Array::<F>::new(head_dim);
        load_row(query, &mut q, b, i, head, head_dim);
        for e in 0..head_dim {
            o[e] = F::new(0.0);
        }
        let mut keys = SharedMemory::<F>::new(tile * head_dim);
        let mut values = SharedMemory::<F>::new(tile * head_dim);
        // A finite start, so that the first key's rescaling is `e^{−huge} = 0`, not `e^{NaN}`.
        let mut most = F::new(-1.0e30);
        let mut total = F::new(0.0);
        let end = min(first + tile, seq);
        let mut start = 0;
        while start < end {
            load_tile(key, &mut keys, b, start, end, head, lane, head_dim);
            load_tile(value, &mut values, b, start, end, head, lane, head_dim);
            sync_cube();
            let stop = min(start + tile, i + 1);
            let mut j = start;
            while j < stop {
                let row = (j - start) * head_dim;
                let score = dot(&q, &keys, row, head_dim);
                let mut weight = F::new(1.0);
                if score > most {
                    let shrink = (most - score).exp();
                    total *= shrink;
                    for e in 0..head_dim {
                        o[e] *= shrink;
                    }
                    most = score;
                } else {
                    weight = (score - most).exp();
                }
                total += weight;
                add_scaled(&mut o, weight, &values, row, head_dim);
                j += 1;
            }
            sync_cube();
            start += tile;
        }
        if i < seq {
            let row = (b * seq + i) * heads + head;
            for e in 0..head_dim {
                output[row * head_dim + e] = o[e] / total;
            }
            logsumexp[row] = most + total.ln();
        }
    }

    /// `∂q = Σ_keys p (∂o · v − Δ) k` per query, with `p = e^{q·k − lse}` and `Δ = ∂o · o`,
    /// which it writes for the key–value kernel.
    #[cube(launch)]
    pub(super) fn attention_query_grad_kernel<F: Float>(
        query: &Tensor<F>,
        key: &Tensor<F>,
        value: &Tensor<F>,
        output: &Tensor<F>,
        logsumexp: &Tensor<F>,
        grad: &Tensor<F>,
        query_grad: &mut Tensor<F>,
        delta: &mut Tensor<F>,
        #[comptime] head_dim: usize,
        #[comptime] tile: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let (seq, heads) = (query_grad.shape(1), query_grad.shape(2));
        if CUBE_POS >= query_grad.shape(0) * heads * tiles_of(seq, tile) {
            terminate!();
        }
        let (first, head) = (first_of_cube(seq, tile), head_of_cube(seq, heads, tile));
        let b = batch_of_cube(seq, heads, tile);
        let lane = UNIT_POS_X as usize;
        let i = first + lane;
        let row_of_i = (b * seq + i) * heads + head;
        let mut q = Array::<F>::new(head_dim);
        let mut d_out = Array::<F>::new(head_dim);
        let mut d_q = Array::<F>::new(head_dim);
        load_row(query, &mut q, b, i, head, head_dim);
        load_row(grad, &mut d_out, b, i, head, head_dim);
        let mut along = F::new(0.0);
        let mut lse = F::new(0.0);
        if i < seq {
            for e in 0..head_dim {
                along += d_out[e] * output[at(output, b, i, head, e)];
            }
            lse = logsumexp[row_of_i];
            delta[row_of_i] = along;
        }
        for e in 0..head_dim {
            d_q[e] = F::new(0.0);
        }
        let mut keys = SharedMemory::<F>::new(tile * head_dim);
        let mut values = SharedMemory::<F>::new(tile * head_dim);
        let end = min(first + tile, seq);
        let mut start = 0;
        while start < end {
            load_tile(key, &mut keys, b, start, end, head, lane, head_dim);
            load_tile(value, &mut values, b, start, end, head, lane, head_dim);
            sync_cube();
            let stop = min(start + tile, i + 1);
            let mut j = start;
            while j < stop {
                let row = (j - start) * head_dim;
                let p = (dot(&q, &keys, row, head_dim) - lse).exp();
                let d_score = p * (dot(&d_out, &values, row, head_dim) - along);
                add_scaled(&mut d_q, d_score, &keys, row, head_dim);
                j += 1;
            }
            sync_cube();
            start += tile;
        }
        if i < seq {
            for e in 0..head_dim {
                query_grad[row_of_i * head_dim + e] = d_q[e];
            }
        }
    }

    /// `∂v = Σ_queries p ∂o` and `∂k = Σ_queries p (∂o · v − Δ) q` per key, over the queries
    /// at or after it.
    #[cube(launch)]
    pub(super) fn attention_key_value_grad_kernel<F: Float>(
        query: &Tensor<F>,
        key: &Tensor<F>,
        value: &Tensor<F>,
        logsumexp: &Tensor<F>,
        delta: &Tensor<F>,
        grad: &Tensor<F>,
        key_grad: &mut Tensor<F>,
        value_grad: &mut Tensor<F>,
        #[comptime] head_dim: usize,
        #[comptime] tile: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let (seq, heads) = (key_grad.shape(1), key_grad.shape(2));
        if CUBE_POS >= key_grad.shape(0) * heads * tiles_of(seq, tile) {
            terminate!();
        }
        let (first, head) = (first_of_cube(seq, tile), head_of_cube(seq, heads, tile));
        let b = batch_of_cube(seq, heads, tile);
        let lane = UNIT_POS_X as usize;
        let j = first + lane;
        let mut k = Array::<F>::new(head_dim);
        let mut v = Array::<F>::new(head_dim);
        let mut d_k = Array::<F>::new(head_dim);
        let mut d_v = Array::<F>::new(head_dim);
        load_row(key, &mut k, b, j, head, head_dim);
        load_row(value, &mut v, b, j, head, head_dim);
        for e in 0..head_dim {
            d_k[e] = F::new(0.0);
            d_v[e] = F::new(0.0);
        }
        let mut queries = SharedMemory::<F>::new(tile * head_dim);
        let mut grads = SharedMemory::<F>::new(tile * head_dim);
        let mut sums = SharedMemory::<F>::new(tile);
        let mut deltas = SharedMemory::<F>::new(tile);
        let mut start = first;
        while start < seq {
            load_tile(query, &mut queries, b, start, seq, head, lane, head_dim);
            load_tile(grad, &mut grads, b, start, seq, head, lane, head_dim);
            if start + lane < seq {
                let row = (b * seq + start + lane) * heads + head;
                sums[lane] = logsumexp[row];
                deltas[lane] = delta[row];
            }
            sync_cube();
            let stop = min(start + tile, seq);
            let mut i = max(start, j);
            while i < stop {
                let at_i = i - start;
                let row = at_i * head_dim;
                let p = (dot(&k, &queries, row, head_dim) - sums[at_i]).exp();
                let d_score = p * (dot(&v, &grads, row, head_dim) - deltas[at_i]);
                add_scaled(&mut d_v, p, &grads, row, head_dim);
                add_scaled(&mut d_k, d_score, &queries, row, head_dim);
                i += 1;
            }
            sync_cube();
            start += tile;
        }
        if j < seq {
            let row = (b * seq + j) * heads + head;
            for e in 0..head_dim {
                key_grad[row * head_dim + e] = d_k[e];
                value_grad[row * head_dim + e] = d_v[e];
            }
        }
    }
}
