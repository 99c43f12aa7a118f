//! The kernels of causal attention's fused pair (`cube_attention.rs` launches them), in a
//! module of their own because CubeCL's `Tensor` is not Burn's.

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
    seq.div_ceil(tile)
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
