//! The slot sums on Burn's Flex backend as SIMD loops over its host buffers.
//!
//! The plain primitives ([`naive`](super::naive)) run one Flex operation per slot and step, each
//! a pass over a `[tokens, d]` tensor with an allocation of its own, and their row dot products
//! form and reduce a whole `[tokens, d]` product. Here each primitive reads every slot row once
//! and writes each output once: a dot product per row for
//! [`row_dots`](SlotSumsBackend::row_dots), a scaled add of every slot's row into the output row
//! for [`weighted_sum`](SlotSumsBackend::weighted_sum) and
//! [`weighted_total`](SlotSumsBackend::weighted_total), and for
//! [`add_scaled_rows`](SlotSumsBackend::add_scaled_rows) a scaled add into the gradient already
//! accumulated, in place when Flex holds it unshared.
//!
//! The loops run on `macerator`'s SIMD vectors, chosen at run time (AVX-512, AVX2, SSE, NEON or
//! scalar), with four accumulators per dot product: a scalar loop cannot be vectorised without
//! reordering its additions, and was slower than Flex's own operations
//! (docs/notebook/cpu-speed.md). Each loop splits its tokens into tasks of a fixed size on Rayon's
//! pool, the threads Flex's matrix products use, so that the other cores no longer wait through the
//! routing operator. (Called from a thread outside the pool, each loop is handed to the pool and
//! waited for; the runners start CPU jobs on a pool thread, `haares_train::cpu::on_cpu_pool`.) f32
//! and f64 tensors whose elements lie contiguously take these loops; anything else takes the plain
//! primitives. `tests/core/slot_sums.rs` checks them against the plain primitives.

use std::slice;

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use burn_flex::FlexTensor;
use macerator::Simd;
use rayon::prelude::*;

use super::flex_add::{Added, host_add_scaled_rows};
use super::{SlotSumsBackend, naive};
use crate::ops::routing::flex_rows::{Rows, buffers, slices, tokens_per_task};
use crate::simd::{HostFloat, dot_product, flex_tensor, scaled_add};

impl SlotSumsBackend for Flex {
    fn row_dots(slots: &[Tensor<Self, 2>], rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        by_dtype(
            &rows,
            || host_row_dots::<f32>(slots, &rows),
            || host_row_dots::<f64>(slots, &rows),
        )
        .unwrap_or_else(|| naive::row_dots(slots, rows))
    }

    fn weighted_sum(slots: &[Tensor<Self, 2>], weights: Tensor<Self, 2>) -> Tensor<Self, 2> {
        by_dtype(
            &weights,
            || host_weighted_sum::<f32>(slots, &weights),
            || host_weighted_sum::<f64>(slots, &weights),
        )
        .unwrap_or_else(|| naive::weighted_sum(slots, weights))
    }

    fn weighted_total(slots: &[Tensor<Self, 2>], weights: Tensor<Self, 2>) -> Tensor<Self, 1> {
        by_dtype(
            &weights,
            || host_weighted_total::<f32>(slots, &weights),
            || host_weighted_total::<f64>(slots, &weights),
        )
        .unwrap_or_else(|| naive::weighted_total(slots, weights))
    }

    fn add_scaled_rows(
        into: Vec<Option<Tensor<Self, 2>>>,
        columns: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
        wanted: &[bool],
    ) -> Vec<Option<Tensor<Self, 2>>> {
        let added = match rows.dtype() {
            DType::F32 => host_add_scaled_rows::<f32>(into, &columns, &rows, wanted),
            DType::F64 => host_add_scaled_rows::<f64>(into, &columns, &rows, wanted),
            _ => into.into_iter().map(Added::Plain).collect(),
        };
        added
            .into_iter()
            .zip(wanted)
            .enumerate()
            .map(|(slot, (added, &wanted))| match added {
                _ if !wanted => None,
                Added::Done(sum) => Some(sum),
                Added::Plain(into) => {
                    let column = columns.clone().narrow(0, slot, 1);
                    let product = naive::scaled_rows(column, rows.clone(), &[true]);
                    naive::add_scaled_rows(product, vec![into]).pop().flatten()
                }
            })
            .collect()
    }
}

/// Runs the loop for the tensor's float type; `None` (take the plain primitive) for other types
/// and wherever a loop finds an operand it cannot read as one contiguous slice.
fn by_dtype<T>(
    like: &Tensor<Flex, 2>,
    f32_loop: impl FnOnce() -> Option<T>,
    f64_loop: impl FnOnce() -> Option<T>,
) -> Option<T> {
    match like.dtype() {
        DType::F32 => f32_loop(),
        DType::F64 => f64_loop(),
        _ => None,
    }
}

/// The slots' common `[tokens, d]`, or `None` when they differ (the plain primitive then reports
/// Burn's shape error) or are empty (the loops step through whole rows).
fn common_shape(slots: &[Tensor<Flex, 2>]) -> Option<[usize; 2]> {
    let shape = slots.first()?.dims();
    let empty = shape.contains(&0);
    (!empty && slots.iter().all(|slot| slot.dims() == shape)).then_some(shape)
}

fn host_row_dots<F: HostFloat>(
    slots: &[Tensor<Flex, 2>],
    rows: &Tensor<Flex, 2>,
) -> Option<Tensor<Flex, 2>> {
    let [tokens, d_model] = common_shape(slots)?;
    let (slot_buffers, row_buffer) = (buffers(slots), buffers(slice::from_ref(rows)));
    let (slot_values, row_values) = (slices::<F>(&slot_buffers)?, slices::<F>(&row_buffer)?);
    let rows = Rows::new(rows, row_values[0], tokens).filter(|rows| rows.d_model == d_model)?;
    let mut dots = vec![F::default(); slots.len() * tokens];
    row_dots_loop(&slot_values, rows, &mut dots);
    Some(flex_tensor(dots, [slots.len(), tokens]))
}

/// The slots and weights of a weighted sum, when the loops can read them.
struct Weighted<'a, F> {
    slots: Vec<&'a [F]>,
    weights: &'a [F],
    tokens: usize,
    d_model: usize,
}

fn host_weighted_sum<F: HostFloat>(
    slots: &[Tensor<Flex, 2>],
    weights: &Tensor<Flex, 2>,
) -> Option<Tensor<Flex, 2>> {
    let (slot_buffers, weight_buffer) = (buffers(slots), buffers(slice::from_ref(weights)));
    let weighted = weighted::<F>(slots, weights, &slot_buffers, &weight_buffer)?;
    let (tokens, d_model) = (weighted.tokens, weighted.d_model);
    let mut sum = vec![F::default(); tokens * d_model];
    weighted_sum_loop(&weighted, &mut sum);
    Some(flex_tensor(sum, [tokens, d_model]))
}

fn host_weighted_total<F: HostFloat>(
    slots: &[Tensor<Flex, 2>],
    weights: &Tensor<Flex, 2>,
) -> Option<Tensor<Flex, 1>> {
    let (slot_buffers, weight_buffer) = (buffers(slots), buffers(slice::from_ref(weights)));
    let weighted = weighted::<F>(slots, weights, &slot_buffers, &weight_buffer)?;
    let mut total = vec![F::default(); weighted.d_model];
    weighted_total_loop(&weighted, &mut total);
    Some(flex_tensor(total, [weighted.d_model]))
}

fn weighted<'a, F: HostFloat>(
    slots: &[Tensor<Flex, 2>],
    weights: &Tensor<Flex, 2>,
    slot_buffers: &'a [FlexTensor],
    weight_buffer: &'a [FlexTensor],
) -> Option<Weighted<'a, F>> {
    let [tokens, d_model] = common_shape(slots)?;
    if weights.dims() != [slots.len(), tokens] {
        return None;
    }
    Some(Weighted {
        slots: slices::<F>(slot_buffers)?,
        weights: slices::<F>(weight_buffer)?[0],
        tokens,
        d_model,
    })
}

/// `dots[s·tokens + n] = slots[s][n, ·] · rows[n or 0, ·]`, one task per slot and token range.
fn row_dots_loop<F: HostFloat>(slots: &[&[F]], rows: Rows<'_, F>, dots: &mut [F]) {
    let tokens = dots.len() / slots.len();
    let (d_model, chunk) = (rows.d_model, tokens_per_task(rows.d_model));
    dots.par_chunks_exact_mut(tokens)
        .zip(slots)
        .for_each(|(dots, slot)| {
            dots.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(task, dots)| {
                    let first = task * chunk;
                    let slot_rows = &slot[first * d_model..][..dots.len() * d_model];
                    row_dots_task(slot_rows, rows, first, dots);
                });
        });
}

#[macerator::with_simd]
fn row_dots_task<'a, S: Simd, F: HostFloat>(
    slot_rows: &[F],
    rows: Rows<'a, F>,
    first: usize,
    dots: &mut [F],
) {
    let slot_rows = slot_rows.chunks_exact(rows.d_model);
    for (token, (dot, slot_row)) in (first..).zip(dots.iter_mut().zip(slot_rows)) {
        *dot = dot_product::<S, F>(slot_row, rows.row(token));
    }
}

/// `sum[n, ·] = Σ_s weights[s, n] · slots[s][n, ·]`, row by row, so that each output row is
/// formed in cache from one row of every slot; one task per token range.
fn weighted_sum_loop<F: HostFloat>(weighted: &Weighted<'_, F>, sum: &mut [F]) {
    let chunk = tokens_per_task(weighted.d_model);
    sum.par_chunks_mut(chunk * weighted.d_model)
        .enumerate()
        .for_each(|(task, sum)| weighted_sum_task(weighted, task * chunk, sum));
}

#[macerator::with_simd]
fn weighted_sum_task<'a, S: Simd, F: HostFloat>(
    weighted: &Weighted<'a, F>,
    first: usize,
    sum: &mut [F],
) {
    let (tokens, d_model) = (weighted.tokens, weighted.d_model);
    for (token, out) in (first..).zip(sum.chunks_exact_mut(d_model)) {
        for (slot, rows) in weighted.slots.iter().enumerate() {
            let weight = weighted.weights[slot * tokens + token];
            scaled_add::<S, F>(out, weight, &rows[token * d_model..][..d_model]);
        }
    }
}

/// `total = Σ_s Σ_n weights[s, n] · slots[s][n, ·]`: each task sums its token range into a `[d]`
/// row that stays in cache, and the tasks' rows are added in order.
fn weighted_total_loop<F: HostFloat>(weighted: &Weighted<'_, F>, total: &mut [F]) {
    let chunk = tokens_per_task(weighted.d_model);
    let partials: Vec<Vec<F>> = (0..weighted.tokens)
        .into_par_iter()
        .step_by(chunk)
        .map(|first| {
            let mut partial = vec![F::default(); weighted.d_model];
            let range = first..(first + chunk).min(weighted.tokens);
            weighted_total_task(weighted, range, &mut partial);
            partial
        })
        .collect();
    for partial in partials {
        for (total, part) in total.iter_mut().zip(partial) {
            *total = *total + part;
        }
    }
}

#[macerator::with_simd]
fn weighted_total_task<'a, S: Simd, F: HostFloat>(
    weighted: &Weighted<'a, F>,
    range: std::ops::Range<usize>,
    total: &mut [F],
) {
    let (tokens, d_model) = (weighted.tokens, weighted.d_model);
    for (slot, rows) in weighted.slots.iter().enumerate() {
        for token in range.clone() {
            let weight = weighted.weights[slot * tokens + token];
            scaled_add::<S, F>(total, weight, &rows[token * d_model..][..d_model]);
        }
    }
}
