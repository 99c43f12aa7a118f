//! [`MatmulBackend::matmul`] on Flex: the `gemm` crate's
//! f32 kernel (the one Flex's own `matmul` calls) writing straight into a buffer of this
//! crate's, which it fills without reading it first.
//!
//! Flex 0.21 allocates every product's output with `FlexTensor::empty`: a zeroed byte vector, which
//! `Bytes::from_bytes_vec` then copies into a 16-byte-aligned allocation of its own, since a byte
//! vector's alignment is 1. On the `cpu` preset the zeroing and the copy took ≈ 10% of a training
//! step (docs/notebook/cpu-speed.md). An f32 buffer is aligned for its elements, which is all
//! Flex's slices need. Operands are read through their strides, so transposed views (the backward
//! pass's `Aᵀ` and `Bᵀ`, attention's `Kᵀ`) are not copied first. A large product is split over
//! the threads in bands of its output ([`bands`]); a weight gradient's depth may be taken in
//! chunks ([`depth_chunk`]).

use std::mem::MaybeUninit;
use std::ops::Range;

use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_flex::FlexTensor;
use gemm::Parallelism;
use rayon::prelude::*;

use super::{MatmulBackend, naive};
use crate::simd::{SharedOutput, flex_tensor, strided_f32};

impl MatmulBackend for Flex {
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        matmul(&lhs, &rhs).unwrap_or_else(|| naive::matmul(lhs, rhs))
    }

    fn product_kernels() -> String {
        "gemm 0.19 (f32, called directly)".into()
    }
}

/// Products of at least this many multiply-adds split one matrix over Rayon's threads, a band
/// of its output per thread ([`bands`]); below it a matrix is one task.
const PARALLEL_MATRIX: usize = 192 * 192 * 192;

/// A band's width is a multiple of this many rows or columns: four of `gemm`'s 16-lane AVX-512
/// registers, the height of its widest f32 kernel, so that no band but the last ends in a
/// narrower kernel.
const BAND_ALIGN: usize = 64;

/// A batch of smaller products is spread over Rayon's threads, a matrix per task, from this
/// many multiply-adds in all.
const PARALLEL_BATCH: usize = 128 * 128 * 128;

/// The depth of a chunk where a product is taken in chunks ([`depth_chunk`]). On 2 threads of an
/// AVX-512 host the `cpu` preset's down projection weight gradient (`1024 × 1024 · 1024 × 128`,
/// the left operand read transposed) ran at 269 instead of 209 GFLOP/s in chunks of 256 with its
/// operands hot, and took 1.28 instead of 1.97 ms inside a training step; `gemm` 0.19 takes at
/// least 512 of the depth at a time, whatever its caches (docs/notebook/cpu-speed.md).
const DEPTH_CHUNK: usize = 256;

/// One operand: its elements, the offset of its first, and its strides (in elements).
struct Operand {
    buffer: FlexTensor,
    start: usize,
    batch_strides: Vec<usize>,
    row_stride: isize,
    column_stride: isize,
}

impl Operand {
    /// The operand behind `tensor`, when [`strided_f32`] can read it.
    fn new<const D: usize>(tensor: &Tensor<Flex, D>) -> Option<Self> {
        let (buffer, start, strides) = strided_f32(tensor)?;
        Some(Self {
            start,
            batch_strides: strides[..D - 2].to_vec(),
            row_stride: strides[D - 2] as isize,
            column_stride: strides[D - 1] as isize,
            buffer,
        })
    }

    /// The offset of matrix `index` of the batch (row-major over the batch dimensions `batch`).
    fn matrix_offset(&self, mut index: usize, batch: &[usize]) -> usize {
        let mut offset = self.start;
        for (&size, &stride) in batch.iter().zip(&self.batch_strides).rev() {
            offset += (index % size) * stride;
            index /= size;
        }
        offset
    }

    fn elements(&self) -> &[f32] {
        self.buffer.storage::<f32>()
    }
}

/// `lhs · rhs` over the last two dimensions with equal batch dimensions, or `None` when an
/// operand is not f32, has a negative stride, or the batch dimensions differ.
fn matmul<const D: usize>(lhs: &Tensor<Flex, D>, rhs: &Tensor<Flex, D>) -> Option<Tensor<Flex, D>> {
    let (lhs_dims, rhs_dims) = (lhs.dims(), rhs.dims());
    if D < 2 || lhs_dims[..D - 2] != rhs_dims[..D - 2] || lhs_dims[D - 1] != rhs_dims[D - 2] {
        return None;
    }
    let (m, k, n) = (lhs_dims[D - 2], lhs_dims[D - 1], rhs_dims[D - 1]);
    let mut output_dims = lhs_dims;
    output_dims[D - 1] = n;
    let batch = &lhs_dims[..D - 2];
    let matrices: usize = batch.iter().product();
    let len = matrices * m * n;
    if k == 0 || len == 0 {
        // Nothing to multiply: the product is zero (and `gemm` would not write it).
        return Some(flex_tensor(vec![0.0f32; len], output_dims));
    }
    let (lhs, rhs) = (Operand::new(lhs)?, Operand::new(rhs)?);
    // Rows `rows` and columns `columns` of matrix `matrix`'s product, written at `out`, the
    // start of its `m × n` row-major output.
    let depth_chunk = depth_chunk(m, k, n, &lhs);
    let product = |matrix: usize, out: SharedOutput, rows: Range<usize>, columns: Range<usize>| {
        let lhs_at = lhs.matrix_offset(matrix, batch) + rows.start * lhs.row_stride as usize;
        let rhs_at = rhs.matrix_offset(matrix, batch) + columns.start * rhs.column_stride as usize;
        for depth in (0..k).step_by(depth_chunk) {
            let lhs_at = lhs_at + depth * lhs.column_stride as usize;
            let rhs_at = rhs_at + depth * rhs.row_stride as usize;
            let first = depth == 0;
            // SAFETY: `out` points at an `m × n` row-major output and the band lies inside it,
            // written by no other task ([`bands`] are disjoint);
            // the operands' offsets and strides come from their own layouts, so every element
            // `gemm` reads lies in their buffers (the band's first row or column and the chunk's
            // first depth are the operand's). A chunk after the first adds to what the earlier
            // ones wrote (`read_dst` with a factor of 1).
            unsafe {
                gemm::gemm(
                    rows.len(),
                    columns.len(),
                    depth_chunk.min(k - depth),
                    out.at(rows.start * n + columns.start),
                    1,
                    n as isize,
                    !first,
                    lhs.elements()[lhs_at..].as_ptr(),
                    lhs.column_stride,
                    lhs.row_stride,
                    rhs.elements()[rhs_at..].as_ptr(),
                    rhs.column_stride,
                    rhs.row_stride,
                    if first { 0.0 } else { 1.0 },
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                )
            }
        }
    };
    let whole =
        |matrix, out: &mut [MaybeUninit<f32>]| product(matrix, SharedOutput::of(out), 0..m, 0..n);
    let per_matrix = m * n * k;
    let mut output = Vec::with_capacity(len);
    // `with_capacity` may reserve more than asked: only the first `len` are written.
    let out = &mut output.spare_capacity_mut()[..len];
    if per_matrix >= PARALLEL_MATRIX {
        for (matrix, out) in out.chunks_mut(m * n).enumerate() {
            let out = SharedOutput::of(out);
            match m >= n {
                true => bands(m).for_each(|rows| product(matrix, out, rows, 0..n)),
                false => bands(n).for_each(|columns| product(matrix, out, 0..m, columns)),
            }
        }
    } else if matrices > 1 && matrices * per_matrix >= PARALLEL_BATCH {
        (out.par_chunks_mut(m * n).enumerate()).for_each(|(matrix, out)| whole(matrix, out));
    } else {
        (out.chunks_mut(m * n).enumerate()).for_each(|(matrix, out)| whole(matrix, out));
    }
    // SAFETY: with `k > 0`, the first chunk's `gemm` call (`read_dst` false) wrote every element
    // of every matrix.
    unsafe { output.set_len(len) };
    Some(flex_tensor(output, output_dims))
}

/// The depth (`k`) a product is taken in, in chunks added one after another: [`DEPTH_CHUNK`] for
/// a left operand read transposed (a weight gradient, `Aᵀ ∂C`) whose output is at least as tall
/// as it is wide, the whole depth otherwise.
fn depth_chunk(m: usize, k: usize, n: usize, lhs: &Operand) -> usize {
    match lhs.row_stride == 1 && lhs.column_stride != 1 && m >= n && k > DEPTH_CHUNK {
        true => DEPTH_CHUNK,
        false => k,
    }
}

/// `0..size` in one band per Rayon thread, each a multiple of [`BAND_ALIGN`] wide but the last,
/// as a parallel iterator.
///
/// A matrix is split along its longer side and each band is one single-threaded `gemm` call.
/// Against `gemm`'s own splitting (`Parallelism::Rayon`), on 2 threads of an AVX-512 host this ran
/// the step's `1024 × 128 · 128 × 1024` product at 206 instead of 181 GFLOP/s, and its gradients'
/// shapes 5–18% faster, with the `1024³` product unchanged (docs/notebook/cpu-speed.md).
fn bands(size: usize) -> impl ParallelIterator<Item = Range<usize>> {
    let aligned = size.div_ceil(BAND_ALIGN);
    let count = rayon::current_num_threads().clamp(1, aligned);
    let width = aligned.div_ceil(count) * BAND_ALIGN;
    (0..size.div_ceil(width))
        .into_par_iter()
        .map(move |band| band * width..size.min((band + 1) * width))
}
