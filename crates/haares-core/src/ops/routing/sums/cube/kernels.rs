//! The CubeCL kernels of `../cube.rs` (the slot sums: row dots, weighted sums, scaled rows), in a
//! file of their own because CubeCL's `Tensor` is not Burn's; [`partial_dots`] and
//! [`total_slots`] are shared with the read kernels (`read/cube/kernels.rs`).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// Each thread's share of every slot's dot product with one row of `vector` (the one at
/// `vector_offset`) at `token`: `partials[s · threads + lane] = Σ_{k ≡ lane} slots[s][token, k]
/// · v[k]`, the threads striding over the width. `v` is the row itself, or with `weighted` its
/// product with the `[1, d]` row `weight` (the folded query `q ⊙ w`, formed as the tensor product
/// forms it). The caller syncs the cube and sums ([`slot_total`], [`total_slots`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(in crate::ops) fn partial_dots<F: Float>(
    slots: &Sequence<Tensor<F>>,
    vector: &Tensor<F>,
    vector_offset: usize,
    weight: &Tensor<F>,
    token: usize,
    partials: &mut SharedMemory<F>,
    lane: usize,
    #[comptime] weighted: bool,
    #[comptime] threads: usize,
) {
    let count = comptime![slots.len()];
    let d_model = vector.shape(1);
    #[unroll]
    for slot in 0..count {
        let source = slots.index(slot);
        let mut sum = F::new(0.0);
        let mut k = lane;
        while k < d_model {
            let mut v = vector[vector_offset + k * vector.stride(1)];
            if weighted {
                v *= weight[k * weight.stride(1)];
            }
            sum += source[token * source.stride(0) + k * source.stride(1)] * v;
            k += threads;
        }
        partials[slot * threads + lane] = sum;
    }
}

/// `out[s, n] = Σ_k slots[s][n, k] · rows[n, k] / divisor`, where `rows` advances by
/// `row_stride` per token (0 for one row shared by all tokens); the divisor is 1 for the dots
/// and `d` for a mean square (a division, as the tensor operations take it). One
/// cube per token row: its threads stride over `k`, and shared memory reduces their partial sums.
#[cube(launch)]
pub(in crate::ops) fn row_dots_kernel<F: Float>(
    slots: &Sequence<Tensor<F>>,
    rows: &Tensor<F>,
    output: &mut Tensor<F>,
    row_stride: u32,
    divisor: f32,
    #[comptime] threads: usize,
    #[define(F)] _dtype: StorageType,
) {
    let count = comptime![slots.len()];
    let token = CUBE_POS;
    if token >= output.shape(1) {
        terminate!();
    }
    let lane = UNIT_POS_X as usize;
    let row_offset = token * (row_stride as usize);
    let mut partials = SharedMemory::<F>::new(count * threads);
    partial_dots::<F>(
        slots,
        rows,
        row_offset,
        rows,
        token,
        &mut partials,
        lane,
        false,
        threads,
    );
    sync_cube();
    if lane < count {
        let total = slot_total::<F>(&partials, lane, threads);
        output[lane * output.stride(0) + token * output.stride(1)] = total / F::cast_from(divisor);
    }
}

/// Slot `slot`'s dot product: the sum of its threads' partials from [`partial_dots`], in the
/// threads' order.
#[cube]
fn slot_total<F: Float>(partials: &SharedMemory<F>, slot: usize, #[comptime] threads: usize) -> F {
    let mut total = F::new(0.0);
    for thread in 0..threads {
        total += partials[slot * threads + thread];
    }
    total
}

/// Every slot's dot product into the slot's first partial, `partials[s · threads]`, for one
/// thread to read after the cube's barrier that ends this function. Each slot is summed by a
/// thread of its own ([`slot_total`]), so a read over `S` slots waits for one slot's sum, not
/// for `S` of them in a row; the order within a slot, and so every bit, is one thread's.
#[cube]
pub(in crate::ops) fn total_slots<F: Float>(
    partials: &mut SharedMemory<F>,
    lane: usize,
    #[comptime] count: usize,
    #[comptime] threads: usize,
) {
    let mut slot = lane;
    while slot < count {
        partials[slot * threads] = slot_total::<F>(partials, slot, threads);
        slot += threads;
    }
    sync_cube();
}

/// `out[n, k] = Σ_s weights[s, n] · slots[s][n, k]`: one thread per output element, reading each
/// source once. The output is written through its strides like every input is read: CUDA
/// pads its rows to an aligned pitch.
#[cube(launch)]
pub(in crate::ops) fn weighted_sum_kernel<F: Float>(
    slots: &Sequence<Tensor<F>>,
    weights: &Tensor<F>,
    output: &mut Tensor<F>,
    #[define(F)] _dtype: StorageType,
) {
    let count = comptime![slots.len()];
    let d_model = output.shape(1);
    if ABSOLUTE_POS >= output.shape(0) * d_model {
        terminate!();
    }
    let token = ABSOLUTE_POS / d_model;
    let k = ABSOLUTE_POS % d_model;
    let mut sum = F::new(0.0);
    #[unroll]
    for slot in 0..count {
        let source = slots.index(slot);
        sum += weights[slot * weights.stride(0) + token * weights.stride(1)]
            * source[token * source.stride(0) + k * source.stride(1)];
    }
    output[token * output.stride(0) + k * output.stride(1)] = sum;
}

/// One element of `output = into + (factor · columns[slot, n]) · rows[n·row_stride, k]` per
/// thread; without `accumulated`, `into` is a stand-in that is never read.
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub(in crate::ops) fn add_scaled_rows_kernel<F: Float>(
    into: &Tensor<F>,
    columns: &Tensor<F>,
    rows: &Tensor<F>,
    output: &mut Tensor<F>,
    slot: u32,
    row_stride: u32,
    factor: f32,
    #[comptime] accumulated: bool,
    #[define(F)] _dtype: StorageType,
) {
    let d_model = output.shape(1);
    if ABSOLUTE_POS >= output.shape(0) * d_model {
        terminate!();
    }
    let token = ABSOLUTE_POS / d_model;
    let k = ABSOLUTE_POS % d_model;
    let column = columns[(slot as usize) * columns.stride(0) + token * columns.stride(1)]
        * F::cast_from(factor);
    let row = rows[token * (row_stride as usize) + k * rows.stride(1)];
    let mut value = column * row;
    if comptime![accumulated] {
        value = into[token * into.stride(0) + k * into.stride(1)] + value;
    }
    output[token * output.stride(0) + k * output.stride(1)] = value;
}
