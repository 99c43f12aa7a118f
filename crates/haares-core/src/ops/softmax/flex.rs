//! The causal softmax on Burn's Flex backend as SIMD loops over its f32 buffers, with the
//! vectorised exponential of [`crate::simd::exp`], whole `[seq, seq]` matrices to a task on
//! Rayon's pool; other float types and non-contiguous scores take the plain operations.

use burn::backend::Flex;
use burn::tensor::Tensor;
use macerator::Simd;
use rayon::prelude::*;

use super::{SoftmaxBackend, naive};
use crate::simd::{TASK_ELEMENTS, dot_product, exp, f32_buffers, flex_tensor, max, slice, sum};

impl SoftmaxBackend for Flex {
    fn causal_softmax<const D: usize>(scores: Tensor<Self, D>) -> Tensor<Self, D> {
        let dims = scores.dims();
        match f32_buffers([&scores]).filter(|_| square(&dims)) {
            Some([buffer]) => {
                let scores = slice(&buffer);
                // Zero-initialised: the entries above the diagonal are never written.
                let mut probabilities = vec![0.0; scores.len()];
                let (seq, task) = (dims[D - 1], matrices_per_task(dims[D - 1]));
                probabilities
                    .par_chunks_mut(task)
                    .zip(scores.par_chunks(task))
                    .for_each(|(probabilities, scores)| {
                        causal_softmax_loop(scores, seq, probabilities)
                    });
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
                let mut scores_grad = vec![0.0; probabilities.len()];
                let (seq, task) = (dims[D - 1], matrices_per_task(dims[D - 1]));
                scores_grad
                    .par_chunks_mut(task)
                    .zip(probabilities.par_chunks(task).zip(grad.par_chunks(task)))
                    .for_each(|(scores_grad, (probabilities, grad))| {
                        causal_softmax_backward_loop(probabilities, grad, seq, scores_grad)
                    });
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

/// Row by row: query `i` of every `[seq, seq]` matrix sees keys `0..=i`; `e^{x − max}` over them,
/// normalised by its sum.
#[macerator::with_simd]
fn causal_softmax_loop<S: Simd>(scores: &[f32], seq: usize, probabilities: &mut [f32]) {
    let rows = scores
        .chunks_exact(seq)
        .zip(probabilities.chunks_exact_mut(seq));
    for (row, (scores, probabilities)) in rows.enumerate() {
        let visible = row % seq + 1;
        let (scores, probabilities) = (&scores[..visible], &mut probabilities[..visible]);
        let largest = max::<S>(scores);
        for (p, &x) in probabilities.iter_mut().zip(scores) {
            *p = exp(x - largest);
        }
        let normaliser = 1.0 / sum::<S>(probabilities);
        for p in probabilities.iter_mut() {
            *p *= normaliser;
        }
    }
}

/// Row by row: `∂x_j = y_j (∂y_j − Σ_k y_k ∂y_k)` over the visible keys (zero after them).
#[macerator::with_simd]
fn causal_softmax_backward_loop<S: Simd>(
    probabilities: &[f32],
    grad: &[f32],
    seq: usize,
    scores_grad: &mut [f32],
) {
    let inputs = probabilities.chunks_exact(seq).zip(grad.chunks_exact(seq));
    for (row, ((y, dy), dx)) in inputs.zip(scores_grad.chunks_exact_mut(seq)).enumerate() {
        let visible = row % seq + 1;
        let (y, dy) = (&y[..visible], &dy[..visible]);
        let along_row = dot_product::<S, f32>(y, dy);
        for ((dx, &y), &dy) in dx.iter_mut().zip(y).zip(dy) {
            *dx = y * (dy - along_row);
        }
    }
}
