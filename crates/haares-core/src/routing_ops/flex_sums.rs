//! The Flex loops that add into a sum: every slot's gradient added to the one its source has
//! accumulated ([`RoutingBackend::add_scaled_rows`](super::RoutingBackend::add_scaled_rows)), in
//! place where Flex holds that buffer unshared, and the block accumulator's signed sum
//! ([`RoutingBackend::signed_sum`](super::RoutingBackend::signed_sum)). Like the loops of
//! `flex.rs`, in tasks of a fixed size on Rayon's pool.

use std::mem::MaybeUninit;
use std::slice;

use burn::backend::Flex;
use burn::tensor::{ElementConversion, Tensor, TensorPrimitive};
use burn_flex::FlexTensor;
use macerator::{Simd, vload_unaligned, vstore_unaligned};
use rayon::prelude::*;

use super::flex_rows::{Rows, buffers, slices, tokens_per_task};
use crate::simd::{HostFloat, TASK_ELEMENTS, flex_tensor, scaled_add};

/// A slot's gradient from [`host_add_scaled_rows`].
pub(super) enum Added {
    /// `into + column ⊗ rows`, formed by the loop.
    Done(Tensor<Flex, 2>),
    /// `into`, handed back untouched: the loop cannot read an operand, the plain primitive runs.
    Plain(Option<Tensor<Flex, 2>>),
}

/// Where the loop writes one slot's `into + column ⊗ rows`.
pub(super) enum Target<F> {
    /// Not wanted.
    Unwanted,
    /// Into `into`'s own buffer: Flex holds it unshared, its elements in `range`.
    InPlace(FlexTensor, std::ops::Range<usize>),
    /// Into a new buffer: zero, or a copy of a shared `into`.
    Fresh(Vec<F>),
    /// Nowhere: `into` has a shape or type the loop does not take.
    Plain(Option<Tensor<Flex, 2>>),
}

impl<F: HostFloat> Target<F> {
    pub(super) fn new(into: Option<Tensor<Flex, 2>>, wanted: bool, shape: [usize; 2]) -> Self {
        match into {
            _ if !wanted => Self::Unwanted,
            None => Self::Fresh(vec![F::default(); shape[0] * shape[1]]),
            Some(sum) if sum.dims() == shape && sum.dtype() == F::dtype() => {
                let mut buffer = sum.into_primitive().tensor();
                match buffer.layout().contiguous_offsets() {
                    Some((start, end)) if buffer.try_storage_mut::<F>().is_some() => {
                        Self::InPlace(buffer, start..end)
                    }
                    _ => Self::Fresh(buffer.to_contiguous().storage::<F>().to_vec()),
                }
            }
            other => Self::Plain(other),
        }
    }

    pub(super) fn values(&mut self) -> Option<&mut [F]> {
        match self {
            Self::InPlace(buffer, range) => {
                Some(&mut buffer.try_storage_mut::<F>()?[range.clone()])
            }
            Self::Fresh(values) => Some(values),
            Self::Unwanted | Self::Plain(_) => None,
        }
    }

    pub(super) fn finish(self, shape: [usize; 2]) -> Added {
        match self {
            Self::InPlace(buffer, _) => {
                Added::Done(Tensor::from_primitive(TensorPrimitive::Float(buffer)))
            }
            Self::Fresh(values) => Added::Done(flex_tensor(values, shape)),
            Self::Unwanted => Added::Plain(None),
            Self::Plain(into) => Added::Plain(into),
        }
    }
}

/// Every wanted slot's `into_s + columns[s, ·] ⊗ rows`, in one parallel pass over all slots:
/// written into `into_s`'s buffer when Flex holds it unshared and contiguous, into a new one
/// otherwise. Hands every `into` back untouched when the loop cannot read the columns or rows.
pub(super) fn host_add_scaled_rows<F: HostFloat>(
    into: Vec<Option<Tensor<Flex, 2>>>,
    columns: &Tensor<Flex, 2>,
    rows: &Tensor<Flex, 2>,
    wanted: &[bool],
) -> Vec<Added> {
    let [_, tokens] = columns.dims();
    let shape = [tokens, rows.dims()[1]];
    let (column_buffer, row_buffer) = (
        buffers(slice::from_ref(columns)),
        buffers(slice::from_ref(rows)),
    );
    let readable = slices::<F>(&column_buffer).zip(slices::<F>(&row_buffer));
    let Some((columns, rows)) = readable.and_then(|(columns, row_values)| {
        Some((columns[0], Rows::new(rows, row_values[0], tokens)?))
    }) else {
        return into.into_iter().map(Added::Plain).collect();
    };
    let mut targets: Vec<Target<F>> = into
        .into_iter()
        .zip(wanted)
        .map(|(into, &wanted)| Target::new(into, wanted, shape))
        .collect();
    let chunk = tokens_per_task(rows.d_model);
    let mut tasks = Vec::new();
    for (slot, target) in targets.iter_mut().enumerate() {
        if let Some(values) = target.values() {
            let column = &columns[slot * tokens..][..tokens];
            let outs = values.chunks_mut(chunk * rows.d_model);
            for (task, (out, column)) in outs.zip(column.chunks(chunk)).enumerate() {
                tasks.push((task * chunk, column, out));
            }
        }
    }
    tasks
        .into_par_iter()
        .for_each(|(first, column, out)| add_scaled_rows_task(column, rows, first, out));
    targets
        .into_iter()
        .map(|target| target.finish(shape))
        .collect()
}

/// `out[n, ·] += column[n] · rows[n or 0, ·]` for the tokens from `first` on.
#[macerator::with_simd]
fn add_scaled_rows_task<'a, S: Simd, F: HostFloat>(
    column: &[F],
    rows: Rows<'a, F>,
    first: usize,
    out: &mut [F],
) {
    let out_rows = out.chunks_exact_mut(rows.d_model);
    for (token, (out, &factor)) in (first..).zip(out_rows.zip(column)) {
        scaled_add::<S, F>(out, factor, rows.row(token));
    }
}

/// `sum + sign · term` into a new buffer, when both are contiguous, of the loop's type, of one
/// shape and not empty; `None` otherwise (the plain operation runs).
pub(super) fn host_signed_sum<F: HostFloat, const D: usize>(
    sum: &Tensor<Flex, D>,
    term: &Tensor<Flex, D>,
    sign: f64,
) -> Option<Tensor<Flex, D>> {
    let dims = sum.dims();
    if term.dims() != dims || dims.contains(&0) {
        return None;
    }
    let [sum_buffer, term_buffer]: [FlexTensor; 2] =
        [sum, term].map(|tensor| tensor.clone().into_primitive().tensor());
    let (sums, terms) = (sum_buffer.as_slice::<F>()?, term_buffer.as_slice::<F>()?);
    let sign: F = sign.elem();
    let mut out: Vec<F> = Vec::with_capacity(sums.len());
    // `with_capacity` may reserve more than asked: only the first `sums.len()` are written.
    out.spare_capacity_mut()[..sums.len()]
        .par_chunks_mut(TASK_ELEMENTS)
        .zip(sums.par_chunks(TASK_ELEMENTS))
        .zip(terms.par_chunks(TASK_ELEMENTS))
        .for_each(|((out, sums), terms)| signed_sum_task(sums, sign, terms, out));
    // SAFETY: the tasks above wrote every element of the `sums.len()` reserved.
    unsafe { out.set_len(sums.len()) };
    Some(flex_tensor(out, dims))
}

/// `out = sums + sign · terms`, a fused multiply–add per vector (exact for `sign = ±1`),
/// written into memory not yet initialised (a zero fill first would be one more pass).
#[macerator::with_simd]
fn signed_sum_task<'a, S: Simd, F: HostFloat>(
    sums: &'a [F],
    sign: F,
    terms: &'a [F],
    out: &mut [MaybeUninit<F>],
) {
    assert!(sums.len() == out.len() && terms.len() == out.len());
    let lanes = F::lanes::<S>();
    let signs = sign.splat::<S>();
    let out_ptr = out.as_mut_ptr().cast::<F>();
    let mut at = 0;
    while at + lanes <= out.len() {
        // SAFETY: `at + lanes ≤ len` for all three slices; `MaybeUninit<F>` has `F`'s layout.
        unsafe {
            let x = vload_unaligned::<S, F>(sums.as_ptr().add(at));
            let y = vload_unaligned::<S, F>(terms.as_ptr().add(at));
            vstore_unaligned::<S, F>(out_ptr.add(at), y.mul_add(signs, x));
        }
        at += lanes;
    }
    for ((out, &x), &y) in out[at..].iter_mut().zip(&sums[at..]).zip(&terms[at..]) {
        out.write(x + sign * y);
    }
}
