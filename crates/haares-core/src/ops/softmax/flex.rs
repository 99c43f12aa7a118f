//! The causal softmax on Burn's Flex backend as SIMD loops over its f32 buffers, with the
//! vectorised exponential of [`crate::simd::exp`], whole `[seq, seq]` matrices to a task on
//! Rayon's pool; other float types and non-contiguous scores take the plain operations.
//!
//! A row's visible keys are processed in whole vectors ([`whole_vectors`]): the masked entries up
//! to the next multiple of the vector width are computed along and then set to zero, instead of
//! a scalar tail of up to 15 elements per pass. At the cost protocol's cpu preset (rows of 1 to 128
//! keys) the scalar tails were most of the loops' time (docs/notebook/cpu-speed.md).

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::Tensor;
use macerator::Simd;
use rayon::prelude::*;

use super::{SoftmaxBackend, naive};
use crate::simd::{TASK_ELEMENTS, dot_product, exp, f32_buffers, flex_tensor, max, slice, sum};

/// Elements of a vector on the widest instruction set Flex's loops run on (AVX-512's f32 lanes),
/// the multiple a row's processed width is rounded to.
const WIDEST_LANES: usize = 16;

impl SoftmaxBackend for Flex {
    fn causal_softmax<const D: usize>(scores: Tensor<Self, D>) -> Tensor<Self, D> {
        let dims = scores.dims();
        match f32_buffers([&scores]).filter(|_| square(&dims)) {
            Some([buffer]) => {
                let scores = slice(&buffer);
                let mut probabilities = Vec::with_capacity(scores.len());
                let (seq, task) = (dims[D - 1], matrices_per_task(dims[D - 1]));
                probabilities.spare_capacity_mut()[..scores.len()]
                    .par_chunks_mut(task)
                    .zip(scores.par_chunks(task))
                    .for_each(|(probabilities, scores)| {
                        causal_softmax_loop(scores, seq, probabilities)
                    });
                // SAFETY: the loop wrote every element of every row.
                unsafe { probabilities.set_len(scores.len()) };
                flex_tensor(probabilities, dims)
            }
            None => naive::causal_softmax(scores),
        }
    }

    fn causal_softmax_backward<const D: usize>(
        probabilities: Tensor<Self, D>,
        grad: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        let dims = probabilities.dims();
        match f32_buffers([&probabilities, &grad]).filter(|_| square(&dims)) {
            Some([probabilities_buffer, grad_buffer]) => {
                let (probabilities, grad) = (slice(&probabilities_buffer), slice(&grad_buffer));
                let len = probabilities.len();
                let mut scores_grad = Vec::with_capacity(len);
                let (seq, task) = (dims[D - 1], matrices_per_task(dims[D - 1]));
                scores_grad.spare_capacity_mut()[..len]
                    .par_chunks_mut(task)
                    .zip(probabilities.par_chunks(task).zip(grad.par_chunks(task)))
                    .for_each(|(scores_grad, (probabilities, grad))| {
                        causal_softmax_backward_loop(probabilities, grad, seq, scores_grad)
                    });
                // SAFETY: the loop wrote every element of every row.
                unsafe { scores_grad.set_len(len) };
                flex_tensor(scores_grad, dims)
            }
            None => naive::causal_softmax_backward(probabilities, grad),
        }
    }
}

/// Elements per task of the softmax loops: whole `[seq, seq]` matrices, about [`TASK_ELEMENTS`]
/// elements.
fn matrices_per_task(seq: usize) -> usize {
    (TASK_ELEMENTS / (seq * seq)).max(1) * seq * seq
}

/// Whether the last two dimensions are equal (queries and keys of one sequence).
fn square<const D: usize>(dims: &[usize; D]) -> bool {
    D >= 2 && dims[D - 1] == dims[D - 2]
}

/// The width a row with `visible` keys of `seq` is processed to: `visible` rounded up to whole
/// vectors of the widest instruction set, at most `seq`.
fn whole_vectors(visible: usize, seq: usize) -> usize {
    visible.next_multiple_of(WIDEST_LANES).min(seq)
}

/// Row by row: query `i` of every `[seq, seq]` matrix sees keys `0..=i`; `e^{x − max}` over them,
/// normalised by its sum, and zero after them. The exponential runs over the row's whole vectors
/// ([`whole_vectors`]); the entries it computes past the diagonal are set to zero before the sum.
#[macerator::with_simd]
fn causal_softmax_loop<S: Simd>(
    scores: &[f32],
    seq: usize,
    probabilities: &mut [MaybeUninit<f32>],
) {
    let rows = scores
        .chunks_exact(seq)
        .zip(probabilities.chunks_exact_mut(seq));
    for (row, (scores, probabilities)) in rows.enumerate() {
        let visible = row % seq + 1;
        let width = whole_vectors(visible, seq);
        let largest = max::<S>(&scores[..visible]);
        for (p, &x) in probabilities[..width].iter_mut().zip(&scores[..width]) {
            p.write(exp(x - largest));
        }
        for p in &mut probabilities[visible..] {
            p.write(0.0);
        }
        // SAFETY: every element of the row was written just above, and `MaybeUninit<f32>` has
        // `f32`'s layout.
        let probabilities =
            unsafe { &mut *(probabilities as *mut [MaybeUninit<f32>] as *mut [f32]) };
        let normaliser = 1.0 / sum::<S>(&probabilities[..width]);
        for p in &mut probabilities[..width] {
            *p *= normaliser;
        }
    }
}

/// Row by row: `∂x_j = y_j (∂y_j − Σ_k y_k ∂y_k)` over the visible keys, and zero after them.
/// The products run over the row's whole vectors ([`whole_vectors`]) and the entries computed
/// past the diagonal are set to zero; the dot product takes the visible keys only, since `∂y`
/// past them may be anything, even infinite, where `y` is zero.
#[macerator::with_simd]
fn causal_softmax_backward_loop<S: Simd>(
    probabilities: &[f32],
    grad: &[f32],
    seq: usize,
    scores_grad: &mut [MaybeUninit<f32>],
) {
    let inputs = probabilities.chunks_exact(seq).zip(grad.chunks_exact(seq));
    for (row, ((y, dy), dx)) in inputs.zip(scores_grad.chunks_exact_mut(seq)).enumerate() {
        let visible = row % seq + 1;
        let width = whole_vectors(visible, seq);
        let along_row = dot_product::<S, f32>(&y[..visible], &dy[..visible]);
        let (y, dy) = (&y[..width], &dy[..width]);
        for ((dx, &y), &dy) in dx.iter_mut().zip(y).zip(dy) {
            dx.write(y * (dy - along_row));
        }
        for dx in &mut dx[visible..] {
            dx.write(0.0);
        }
    }
}
