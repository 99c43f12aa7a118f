//! The Flex loop that adds into a sum: every slot's gradient added to the one its source has
//! accumulated ([`SlotSumsBackend::add_scaled_rows`](super::SlotSumsBackend::add_scaled_rows)),
//! in place where Flex holds that buffer unshared. Like the loops of `flex.rs`, in tasks of a
//! fixed size on Rayon's pool; the read's backward loops (`read/flex_backward.rs`) write through
//! the same [`Target`].

use std::slice;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_flex::FlexTensor;
use macerator::Simd;
use rayon::prelude::*;

use crate::ops::routing::flex_rows::{Rows, buffers, slices, tokens_per_task};
use crate::simd::{HostFloat, flex_tensor, scaled_add};

/// A slot's gradient from [`host_add_scaled_rows`].
pub(in crate::ops) enum Added {
    /// `into + column ⊗ rows`, formed by the loop.
    Done(Tensor<Flex, 2>),
    /// `into`, handed back untouched: the loop cannot read an operand, the plain primitive runs.
    Plain(Option<Tensor<Flex, 2>>),
}

/// Where the loop writes one slot's `into + column ⊗ rows`.
pub(in crate::ops) enum Target<F> {
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
    pub(in crate::ops) fn new(
        into: Option<Tensor<Flex, 2>>,
        wanted: bool,
        shape: [usize; 2],
    ) -> Self {
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

    pub(in crate::ops) fn values(&mut self) -> Option<&mut [F]> {
        match self {
            Self::InPlace(buffer, range) => {
                Some(&mut buffer.try_storage_mut::<F>()?[range.clone()])
            }
            Self::Fresh(values) => Some(values),
            Self::Unwanted | Self::Plain(_) => None,
        }
    }

    pub(in crate::ops) fn finish(self, shape: [usize; 2]) -> Added {
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
pub(in crate::ops) fn host_add_scaled_rows<F: HostFloat>(
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
