//! RoPE on Burn's Flex backend as a loop over its f32 buffers, whole `heads · d_h` rows (one
//! position each) to a task on Rayon's pool; other float types, non-contiguous operands and the
//! packed projection (which Flex does not use) take the plain operations ([`naive`]).
//!
//! The plain form turns the pairs with a `[d_h, d_h]` matrix product and then makes three
//! elementwise passes, each into a fresh tensor; this loop reads each pair once and writes its
//! rotation, with the same arithmetic per element (`x P` is exactly `(−x₁, x₀, …)` for finite
//! `x`), so its results are the plain form's.

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::Tensor;
use macerator::Simd;
use rayon::prelude::*;

use super::{RotaryBackend, naive};
use crate::simd::{TASK_ELEMENTS, f32_buffers, flex_tensor, slice};

impl RotaryBackend for Flex {
    fn rotary(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        turn_pairs(&x, [&cos, &sin], scale, false)
            .unwrap_or_else(|| naive::rotary(x, cos, sin, quarter_turn, scale))
    }

    fn rotary_backward(
        grad: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        turn_pairs(&grad, [&cos, &sin], scale, true)
            .unwrap_or_else(|| naive::rotary_backward(grad, cos, sin, quarter_turn, scale))
    }
}

/// `s (x ⊙ cos ± (x P) ⊙ sin)` by [`turn_pairs_loop`], or `None` when an operand is not a
/// contiguous f32 buffer of the shapes [`RotaryBackend::rotary`] names (or `d_h` is odd).
fn turn_pairs(
    x: &Tensor<Flex, 4>,
    tables: [&Tensor<Flex, 2>; 2],
    scale: f64,
    back: bool,
) -> Option<Tensor<Flex, 4>> {
    let dims = x.dims();
    let [_, seq, heads, head_dim] = dims;
    let row = heads * head_dim;
    let [cos_dims, sin_dims] = tables.map(|table| table.dims());
    let fits = cos_dims == sin_dims && cos_dims[1] == row && seq <= cos_dims[0];
    let (Some([x_buffer]), Some([cos_buffer, sin_buffer])) =
        (f32_buffers([x]), f32_buffers(tables))
    else {
        return None;
    };
    if !fits || !head_dim.is_multiple_of(2) {
        return None;
    }
    let values = slice(&x_buffer);
    // The tables' first `seq` rows: position `p`'s angles are row `p`.
    let [cos, sin] = [&cos_buffer, &sin_buffer].map(|table| &slice(table)[..seq * row]);
    let rows_per_task = (TASK_ELEMENTS / row).max(1);
    let mut output = Vec::with_capacity(values.len());
    output.spare_capacity_mut()[..values.len()]
        .par_chunks_mut(rows_per_task * row)
        .zip(values.par_chunks(rows_per_task * row))
        .enumerate()
        .for_each(|(task, (output, values))| {
            let first_row = task * rows_per_task;
            let rows = output.chunks_exact_mut(row).zip(values.chunks_exact(row));
            for (at, (output, values)) in rows.enumerate() {
                let position = (first_row + at) % seq;
                let angles = position * row..(position + 1) * row;
                let tables = [&cos[angles.clone()], &sin[angles]];
                turn_pairs_loop(values, tables, scale as f32, back, output);
            }
        });
    // SAFETY: every task wrote each element of its rows.
    unsafe { output.set_len(values.len()) };
    Some(flex_tensor(output, dims))
}

/// One position's row: pair `(x₀, x₁)` becomes `s (x₀ cos₀ + (−x₁) sin₀, x₁ cos₁ + x₀ sin₁)`,
/// or with `back` `s (x₀ cos₀ − (−x₁) sin₀, x₁ cos₁ − x₀ sin₁)`: the plain form's operations in
/// its order. (`S`, unused in the body, picks the instruction set it is compiled for.)
#[allow(clippy::extra_unused_type_parameters)]
#[macerator::with_simd]
fn turn_pairs_loop<S: Simd>(
    x: &[f32],
    tables: [&[f32]; 2],
    scale: f32,
    back: bool,
    output: &mut [MaybeUninit<f32>],
) {
    let [cos, sin] = tables;
    let sign = if back { -1.0 } else { 1.0 };
    let pairs = output.chunks_exact_mut(2).zip(x.chunks_exact(2));
    for ((y, x), (cos, sin)) in pairs.zip(cos.chunks_exact(2).zip(sin.chunks_exact(2))) {
        let (x0, x1) = (x[0], x[1]);
        y[0].write((x0 * cos[0] + sign * (-x1 * sin[0])) * scale);
        y[1].write((x1 * cos[1] + sign * (x0 * sin[1])) * scale);
    }
}
