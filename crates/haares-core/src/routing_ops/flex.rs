//! The routing primitives on Burn's Flex backend as SIMD loops over its host buffers.
//!
//! The plain primitives ([`naive`](super::naive)) run one Flex operation per slot and step, each
//! a pass over a `[tokens, d]` tensor with an allocation of its own, and their row dot products
//! form and reduce a whole `[tokens, d]` product. Here each primitive reads every slot row once
//! and writes each output once: a dot product per row for
//! [`row_dots`](RoutingBackend::row_dots), a scaled add of every slot's row into the output row
//! for [`weighted_sum`](RoutingBackend::weighted_sum) and
//! [`weighted_total`](RoutingBackend::weighted_total), and for
//! [`add_scaled_rows`](RoutingBackend::add_scaled_rows) a scaled add into the gradient already
//! accumulated, in place when Flex holds it unshared.
//!
//! The loops run on `macerator`'s SIMD vectors, chosen at run time (AVX-512, AVX2, SSE, NEON or
//! scalar), with four accumulators per dot product: a scalar loop cannot be vectorised without
//! reordering its additions, and was slower than Flex's own operations (docs/benchmarks.md). f32
//! and f64 tensors whose elements lie contiguously take these loops; anything else takes the
//! plain primitives. `tests/core/primitives.rs` checks them against the plain primitives.

use std::slice;

use burn::backend::Flex;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;
use macerator::Simd;

use super::{ReadBackward, ReadForward, ReadGradients, RoutingBackend, SlotRows, naive};
use crate::simd::{HostFloat, dot_product, scaled_add};

impl RoutingBackend for Flex {
    fn routing_read_forward(
        slots: &[SlotRows<Self>],
        folded_query: Tensor<Self, 1>,
        bias: Option<Tensor<Self, 2>>,
        epsilon: f64,
    ) -> ReadForward<Self> {
        super::flex_read::read_forward(slots, folded_query, bias, epsilon)
    }

    fn routing_read_backward(
        read: ReadBackward<Self>,
        into: Vec<Option<Tensor<Self, 2>>>,
        wanted: &[bool],
        mean_squares_wanted: &[bool],
    ) -> ReadGradients<Self> {
        super::flex_read::read_backward(read, into, wanted, mean_squares_wanted)
    }

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
        into.into_iter()
            .enumerate()
            .map(|(slot, into)| {
                if !wanted[slot] {
                    return None;
                }
                let column = columns.clone().narrow(0, slot, 1);
                let mut into = into;
                let added = match rows.dtype() {
                    DType::F32 => host_add_scaled_rows::<f32>(&mut into, &column, &rows),
                    DType::F64 => host_add_scaled_rows::<f64>(&mut into, &column, &rows),
                    _ => None,
                };
                added.or_else(|| {
                    let product = naive::scaled_rows(column, rows.clone(), &[true]);
                    naive::add_scaled_rows(product, vec![into]).pop().flatten()
                })
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

/// Flex's buffers behind some tensors.
fn buffers(tensors: &[Tensor<Flex, 2>]) -> Vec<FlexTensor> {
    tensors
        .iter()
        .map(|tensor| tensor.clone().into_primitive().tensor())
        .collect()
}

/// Every buffer's elements as one contiguous slice, or `None`.
fn slices<F: HostFloat>(buffers: &[FlexTensor]) -> Option<Vec<&[F]>> {
    buffers.iter().map(FlexTensor::as_slice::<F>).collect()
}

fn tensor<F: HostFloat, const D: usize>(values: Vec<F>, shape: [usize; D]) -> Tensor<Flex, D> {
    let buffer = FlexTensor::from_data(TensorData::new(values, shape));
    Tensor::from_primitive(TensorPrimitive::Float(buffer))
}

/// The slots' common `[tokens, d]`, or `None` when they differ (the plain primitive then reports
/// Burn's shape error) or are empty (the loops step through whole rows).
fn common_shape(slots: &[Tensor<Flex, 2>]) -> Option<[usize; 2]> {
    let shape = slots.first()?.dims();
    let empty = shape.contains(&0);
    (!empty && slots.iter().all(|slot| slot.dims() == shape)).then_some(shape)
}

/// A `[tokens, d]` buffer, or one `[d]` row shared by all tokens.
#[derive(Clone, Copy)]
struct Rows<'a, F> {
    values: &'a [F],
    per_token: bool,
    d_model: usize,
}

impl<'a, F> Rows<'a, F> {
    /// `rows` as the loops read them, for `tokens` tokens; `None` for any other shape and for
    /// empty rows.
    fn new(rows: &Tensor<Flex, 2>, values: &'a [F], tokens: usize) -> Option<Self> {
        let [count, d_model] = rows.dims();
        let per_token = match count {
            _ if d_model == 0 || tokens == 0 => return None,
            1 => false,
            count if count == tokens => true,
            _ => return None,
        };
        Some(Self {
            values,
            per_token,
            d_model,
        })
    }

    fn row(&self, token: usize) -> &'a [F] {
        match self.per_token {
            true => &self.values[token * self.d_model..][..self.d_model],
            false => self.values,
        }
    }
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
    Some(tensor(dots, [slots.len(), tokens]))
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
    Some(tensor(sum, [tokens, d_model]))
}

fn host_weighted_total<F: HostFloat>(
    slots: &[Tensor<Flex, 2>],
    weights: &Tensor<Flex, 2>,
) -> Option<Tensor<Flex, 1>> {
    let (slot_buffers, weight_buffer) = (buffers(slots), buffers(slice::from_ref(weights)));
    let weighted = weighted::<F>(slots, weights, &slot_buffers, &weight_buffer)?;
    let mut total = vec![F::default(); weighted.d_model];
    weighted_total_loop(&weighted, &mut total);
    Some(tensor(total, [weighted.d_model]))
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

/// One slot's `into + column ⊗ rows`: written into `into`'s buffer when Flex holds it unshared
/// and contiguous, into a new one otherwise. Leaves `into` in place and answers `None` when the
/// loop cannot read an operand (then the plain primitive runs).
fn host_add_scaled_rows<F: HostFloat>(
    into: &mut Option<Tensor<Flex, 2>>,
    column: &Tensor<Flex, 2>,
    rows: &Tensor<Flex, 2>,
) -> Option<Tensor<Flex, 2>> {
    let tokens = column.dims()[1];
    let d_model = rows.dims()[1];
    let (column_buffer, row_buffer) = (
        buffers(slice::from_ref(column)),
        buffers(slice::from_ref(rows)),
    );
    let (column_values, row_values) = (slices::<F>(&column_buffer)?, slices::<F>(&row_buffer)?);
    let rows = Rows::new(rows, row_values[0], tokens)?;
    let add = |out: &mut [F]| add_scaled_rows_loop(column_values[0], rows, out);
    let mut sum = match into.take() {
        None => vec![F::default(); tokens * d_model],
        Some(sum) if sum.dims() == [tokens, d_model] && sum.dtype() == F::dtype() => {
            let mut buffer = sum.into_primitive().tensor();
            if let Some((start, end)) = buffer.layout().contiguous_offsets()
                && let Some(storage) = buffer.try_storage_mut::<F>()
            {
                add(&mut storage[start..end]);
                return Some(Tensor::from_primitive(TensorPrimitive::Float(buffer)));
            }
            buffer.to_contiguous().storage::<F>().to_vec()
        }
        other => {
            *into = other;
            return None;
        }
    };
    add(&mut sum);
    Some(tensor(sum, [tokens, d_model]))
}

/// `dots[s·tokens + n] = slots[s][n, ·] · rows[n or 0, ·]`.
#[macerator::with_simd]
fn row_dots_loop<'a, S: Simd, F: HostFloat>(slots: &[&'a [F]], rows: Rows<'a, F>, dots: &mut [F]) {
    let tokens = dots.len() / slots.len();
    for (slot, dots) in slots.iter().zip(dots.chunks_exact_mut(tokens)) {
        let slot_rows = slot.chunks_exact(rows.d_model);
        for (token, (dot, slot_row)) in dots.iter_mut().zip(slot_rows).enumerate() {
            *dot = dot_product::<S, F>(slot_row, rows.row(token));
        }
    }
}

/// `sum[n, ·] = Σ_s weights[s, n] · slots[s][n, ·]`, row by row, so that each output row is
/// formed in cache from one row of every slot.
#[macerator::with_simd]
fn weighted_sum_loop<'a, S: Simd, F: HostFloat>(weighted: &Weighted<'a, F>, sum: &mut [F]) {
    let (tokens, d_model) = (weighted.tokens, weighted.d_model);
    for (token, out) in sum.chunks_exact_mut(d_model).enumerate() {
        for (slot, rows) in weighted.slots.iter().enumerate() {
            let weight = weighted.weights[slot * tokens + token];
            scaled_add::<S, F>(out, weight, &rows[token * d_model..][..d_model]);
        }
    }
}

/// `total = Σ_s Σ_n weights[s, n] · slots[s][n, ·]`, into a `[d]` row that stays in cache.
#[macerator::with_simd]
fn weighted_total_loop<'a, S: Simd, F: HostFloat>(weighted: &Weighted<'a, F>, total: &mut [F]) {
    let tokens = weighted.tokens;
    for (slot, rows) in weighted.slots.iter().enumerate() {
        let slot_rows = rows.chunks_exact(weighted.d_model);
        for (&weight, row) in weighted.weights[slot * tokens..][..tokens]
            .iter()
            .zip(slot_rows)
        {
            scaled_add::<S, F>(total, weight, row);
        }
    }
}

/// `out[n, ·] += column[n] · rows[n or 0, ·]`.
#[macerator::with_simd]
fn add_scaled_rows_loop<'a, S: Simd, F: HostFloat>(column: &[F], rows: Rows<'a, F>, out: &mut [F]) {
    let out_rows = out.chunks_exact_mut(rows.d_model);
    for (token, (out, &factor)) in out_rows.zip(column).enumerate() {
        scaled_add::<S, F>(out, factor, rows.row(token));
    }
}
