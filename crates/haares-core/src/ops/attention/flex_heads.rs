//! A head of a `[batch, seq, heads, d_h]` tensor as Flex's fused attention (`flex_fused.rs`)
//! works on it: copied into rows padded with zeros to whole vectors ([`PAD`]), or transposed, and
//! written back into a shared output, one task per sequence and head.

use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_flex::FlexTensor;

use super::flex_tiles::ROWS;
use crate::simd::strided_f32;

/// Head widths and positions are padded to a multiple of this: AVX-512's f32 lanes, a multiple
/// of every instruction set's, and of [`ROWS`].
pub(super) const PAD: usize = 16;

/// A `[batch, seq, heads, width]` f32 tensor read through its strides.
pub(super) struct Heads {
    buffer: FlexTensor,
    start: usize,
    strides: [usize; 4],
    dims: [usize; 4],
}

impl Heads {
    /// The tensor's elements, when [`strided_f32`] can read them.
    pub(super) fn new(tensor: &Tensor<Flex, 4>) -> Option<Self> {
        let (buffer, start, strides) = strided_f32(tensor)?;
        let dims = tensor.dims();
        Some(Self {
            buffer,
            start,
            strides,
            dims,
        })
    }

    pub(super) fn dims(&self) -> [usize; 4] {
        self.dims
    }

    pub(super) fn element(&self, b: usize, t: usize, h: usize, e: usize) -> f32 {
        self.buffer.storage::<f32>()[self.at(b, t, h) + e * self.strides[3]]
    }

    /// Head `h` of sequence `b` as `[padded positions, padded width]` rows, zero past the
    /// tensor's width and positions.
    pub(super) fn gather(&self, b: usize, h: usize, sizes: Sizes, out: &mut [f32]) {
        let [_, seq, _, width] = self.dims;
        let values = self.buffer.storage::<f32>();
        for (t, row) in out.chunks_exact_mut(sizes.padded_width).enumerate() {
            let (head, padding) = row.split_at_mut(width);
            padding.fill(0.0);
            match (t < seq, self.strides[3]) {
                (false, _) => head.fill(0.0),
                (true, 1) => copy_row(head, &values[self.at(b, t, h)..][..width]),
                (true, _) => {
                    (head.iter_mut().enumerate()).for_each(|(e, x)| *x = self.element(b, t, h, e))
                }
            }
        }
    }

    fn at(&self, b: usize, t: usize, h: usize) -> usize {
        let [s0, s1, s2, _] = self.strides;
        self.start + b * s0 + t * s1 + h * s2
    }
}

/// `out = row` in copies of [`PAD`] elements: a row of a head is too short for `memcpy`'s call,
/// which the compiler would otherwise make of the loop.
fn copy_row(out: &mut [f32], row: &[f32]) {
    let ((out_chunks, out_rest), (chunks, rest)) =
        (out.as_chunks_mut::<PAD>(), row.as_chunks::<PAD>());
    for (out, chunk) in out_chunks.iter_mut().zip(chunks) {
        *out = *chunk;
    }
    for (x, &y) in out_rest.iter_mut().zip(rest) {
        *x = y;
    }
}

/// `rows` (`[padded positions, padded width]`) transposed into `out`: `[width, padded positions]`.
pub(super) fn transpose(rows: &[f32], sizes: Sizes, out: &mut [f32]) {
    for (e, column) in out
        .chunks_exact_mut(sizes.padded_seq)
        .take(sizes.width)
        .enumerate()
    {
        for (x, row) in column.iter_mut().zip(rows.chunks_exact(sizes.padded_width)) {
            *x = row[e];
        }
    }
}

/// Sizes of one task's buffers.
#[derive(Clone, Copy)]
pub(super) struct Sizes {
    pub(super) seq: usize,
    pub(super) heads: usize,
    pub(super) width: usize,
    /// Positions padded to [`PAD`].
    pub(super) padded_seq: usize,
    /// The head width padded to [`PAD`].
    pub(super) padded_width: usize,
}

impl Sizes {
    pub(super) fn of([_, seq, heads, width]: [usize; 4]) -> Self {
        let (padded_seq, padded_width) = (seq.next_multiple_of(PAD), width.next_multiple_of(PAD));
        Self {
            seq,
            heads,
            width,
            padded_seq,
            padded_width,
        }
    }

    /// The keys a block of queries starting at `first` reads: up to its last query's padded
    /// width.
    pub(super) fn keys_of_block(&self, first: usize) -> usize {
        (first + ROWS).next_multiple_of(PAD).min(self.padded_seq)
    }

    /// Where row `(b, t, h)` starts in a `[batch, seq, heads, width]` output.
    pub(super) fn row(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.seq + t) * self.heads + h) * self.width
    }

    pub(super) fn rows(&self) -> usize {
        self.padded_seq * self.padded_width
    }
}
