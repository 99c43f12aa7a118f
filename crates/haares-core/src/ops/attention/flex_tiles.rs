//! The matrix products inside Flex's fused attention (`flex_fused.rs`), on one sequence and
//! head: a block of [`ROWS`] rows of `A B`, each element of `A` broadcast and multiplied into
//! whole vectors of a row of `B`, the block's sums kept in registers.
//!
//! At a head width of 16 (the `cpu` preset) every product of attention is too small for `gemm`
//! to pay for its packing: a `128 × 16 · 16 × 128` product took 5.9 µs a call on an AVX-512 core
//! (89 GFLOP/s) with its operands hot (docs/notebook/cpu-speed.md). A block here
//! needs no packing: `B` is read in place (the keys and values transposed once per head where
//! their positions must lie along the vectors).

use std::array;
use std::ops::Range;

use macerator::{Scalar, Simd, Vector, vload_unaligned, vstore_unaligned};

/// Rows of a block: a divisor of the padding of positions (`flex_fused.rs`'s `PAD`), so that a
/// block never straddles two of the causal mask's padded widths.
pub(super) const ROWS: usize = 8;

/// A matrix read through strides: element `(r, p)` at `values[r · row + p · column]`, so that
/// `Aᵀ` is `A` with its strides swapped.
#[derive(Clone, Copy)]
pub(super) struct Strided<'a> {
    pub(super) values: &'a [f32],
    pub(super) row: usize,
    pub(super) column: usize,
}

impl<'a> Strided<'a> {
    /// Rows `first..` of a row-major matrix with rows of `row` elements.
    pub(super) fn rows(values: &'a [f32], first: usize, row: usize) -> Self {
        let values = &values[first * row..];
        Self {
            values,
            row,
            column: 1,
        }
    }

    /// Columns `first..` of a row-major matrix with rows of `row` elements, as the rows of its
    /// transpose.
    pub(super) fn columns(values: &'a [f32], first: usize, row: usize) -> Self {
        let values = &values[first..];
        Self {
            values,
            row: 1,
            column: row,
        }
    }
}

/// `out[r, c] = Σ_{p ∈ depth} a(r, p) · b[p, c]` for the block's [`ROWS`] rows and the first
/// `columns` columns of `b` (a multiple of the vector width), `b` at row stride `b_row` and `out`
/// at row stride `out_row`. Tiles of 4 rows by 2 vectors, and of 8 rows by one vector for a last
/// single vector, keep 8 independent sums: as many multiply-adds as two FMA units keep in flight
/// at a latency of 4 cycles.
///
/// # Panics
/// If an element the block reads or writes lies outside its slice.
#[inline(always)]
pub(super) fn block_product<S: Simd>(
    a: Strided,
    depth: Range<usize>,
    (b, b_row): (&[f32], usize),
    columns: usize,
    (out, out_row): (&mut [f32], usize),
) {
    let lanes = f32::lanes::<S>();
    assert!(columns.is_multiple_of(lanes) && (ROWS - 1) * out_row + columns <= out.len());
    if !depth.is_empty() {
        let last = depth.end - 1;
        assert!((ROWS - 1) * a.row + last * a.column < a.values.len());
        assert!(columns == 0 || last * b_row + columns <= b.len());
    }
    let mut column = 0;
    while column + 2 * lanes <= columns {
        for first in [0, ROWS / 2] {
            // SAFETY: the asserts above bound every element the tile reads and writes.
            unsafe {
                let sums = tile::<S, { ROWS / 2 }, 2>(a, first, depth.clone(), b, b_row, column);
                store(sums, out, out_row, first, column);
            }
        }
        column += 2 * lanes;
    }
    if column < columns {
        // SAFETY: as above.
        unsafe {
            let sums = tile::<S, ROWS, 1>(a, 0, depth, b, b_row, column);
            store(sums, out, out_row, 0, column);
        }
    }
}

/// The sums of rows `first..first + R` of `a` times `V` vectors of `b` from `column` on.
///
/// # Safety
/// Every `a(first + r, p)` and `b[p, column..column + V·lanes]` for `p` in `depth` lies inside its
/// slice.
#[inline(always)]
unsafe fn tile<S: Simd, const R: usize, const V: usize>(
    a: Strided,
    first: usize,
    depth: Range<usize>,
    b: &[f32],
    b_row: usize,
    column: usize,
) -> [[Vector<S, f32>; V]; R] {
    let lanes = f32::lanes::<S>();
    let mut sums = [[0f32.splat::<S>(); V]; R];
    let (a_values, b_values) = (a.values.as_ptr(), b.as_ptr());
    for p in depth {
        // SAFETY: in bounds by the caller's guarantee.
        let b_vectors: [Vector<S, f32>; V] = array::from_fn(|v| unsafe {
            vload_unaligned::<S, f32>(b_values.add(p * b_row + column + v * lanes))
        });
        for (r, row_sums) in sums.iter_mut().enumerate() {
            // SAFETY: in bounds by the caller's guarantee.
            let x = unsafe { *a_values.add((first + r) * a.row + p * a.column) }.splat::<S>();
            for (sum, &b_vector) in row_sums.iter_mut().zip(&b_vectors) {
                *sum = x.mul_add(b_vector, *sum);
            }
        }
    }
    sums
}

/// Writes a tile's sums to rows `first..first + R` of `out` from `column` on.
///
/// # Safety
/// The tile lies inside `out`.
#[inline(always)]
unsafe fn store<S: Simd, const R: usize, const V: usize>(
    sums: [[Vector<S, f32>; V]; R],
    out: &mut [f32],
    out_row: usize,
    first: usize,
    column: usize,
) {
    let lanes = f32::lanes::<S>();
    for (r, row_sums) in sums.into_iter().enumerate() {
        for (v, sum) in row_sums.into_iter().enumerate() {
            let at = (first + r) * out_row + column + v * lanes;
            // SAFETY: inside `out` by the caller's guarantee.
            unsafe { vstore_unaligned::<S, f32>(out.as_mut_ptr().add(at), sum) };
        }
    }
}
