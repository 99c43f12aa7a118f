//! The fused activations on Burn's Flex backend as SIMD loops over its f32 buffers, with the
//! vectorised exponential of [`crate::simd::exp`]; other float types and non-contiguous operands
//! take the plain operations. Each loop reads its operands once and writes each output once, in
//! tasks of a fixed size on Rayon's pool (Flex's own elementwise kernels split over threads only
//! past 4M elements). The heads' swap copies runs of `d_h` elements, split the same way.

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use burn_flex::FlexTensor;
use macerator::Simd;
use rayon::prelude::*;

use super::{ActivationBackend, naive};
use crate::simd::{TASK_ELEMENTS, dot_product, exp, flex_tensor, max, sum};

impl ActivationBackend for Flex {
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        super::flex_matmul::matmul(&lhs, &rhs).unwrap_or_else(|| naive::matmul(lhs, rhs))
    }

    fn swiglu<const D: usize>(gate: Tensor<Self, D>, up: Tensor<Self, D>) -> Tensor<Self, D> {
        let dims = gate.dims();
        match f32_buffers([&gate, &up]) {
            Some([gate_buffer, up_buffer]) => {
                let (gate, up) = (slice(&gate_buffer), slice(&up_buffer));
                let mut output = Vec::with_capacity(gate.len());
                // `with_capacity` may reserve more than asked: only the first `len` are written.
                output.spare_capacity_mut()[..gate.len()]
                    .par_chunks_mut(TASK_ELEMENTS)
                    .zip(
                        gate.par_chunks(TASK_ELEMENTS)
                            .zip(up.par_chunks(TASK_ELEMENTS)),
                    )
                    .for_each(|(output, (gate, up))| swiglu_loop(gate, up, output));
                // SAFETY: every task wrote each element of its chunk.
                unsafe { output.set_len(gate.len()) };
                flex_tensor(output, dims)
            }
            None => naive::swiglu(gate, up),
        }
    }

    fn swiglu_backward<const D: usize>(
        gate: Tensor<Self, D>,
        up: Tensor<Self, D>,
        grad: Tensor<Self, D>,
    ) -> (Tensor<Self, D>, Tensor<Self, D>) {
        let dims = gate.dims();
        match f32_buffers([&gate, &up, &grad]) {
            Some([gate_buffer, up_buffer, grad_buffer]) => {
                let operands = [&gate_buffer, &up_buffer, &grad_buffer].map(slice);
                let len = operands[0].len();
                let (mut gate_grad, mut up_grad) =
                    (Vec::with_capacity(len), Vec::with_capacity(len));
                let [gate, up, grad] = operands.map(|operand| operand.par_chunks(TASK_ELEMENTS));
                gate_grad.spare_capacity_mut()[..len]
                    .par_chunks_mut(TASK_ELEMENTS)
                    .zip(up_grad.spare_capacity_mut()[..len].par_chunks_mut(TASK_ELEMENTS))
                    .zip(gate.zip(up).zip(grad))
                    .for_each(|((gate_grad, up_grad), ((gate, up), grad))| {
                        swiglu_backward_loop([gate, up, grad], gate_grad, up_grad)
                    });
                // SAFETY: every task wrote each element of its two chunks.
                unsafe {
                    gate_grad.set_len(len);
                    up_grad.set_len(len);
                }
                (flex_tensor(gate_grad, dims), flex_tensor(up_grad, dims))
            }
            None => naive::swiglu_backward(gate, up, grad),
        }
    }

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

    fn swap_heads(x: Tensor<Self, 4>) -> Tensor<Self, 4> {
        let [a, b, c, e] = x.dims();
        let buffer = x.clone().into_primitive().tensor();
        let layout = buffer.layout();
        let strides: Vec<usize> = layout.strides().iter().map(|&s| s as usize).collect();
        // Runs of `e` elements, strides that do not step backwards, f32, something to copy.
        let readable = x.dtype() == DType::F32
            && layout.strides()[..3].iter().all(|&s| s >= 0)
            && strides[3] == 1
            && a * b * c * e > 0;
        if !readable {
            return naive::swap_heads(x);
        }
        let values = &buffer.storage::<f32>()[layout.start_offset()..];
        let mut swapped = vec![0.0; a * b * c * e];
        // One task per (i, k): the `b` runs of `x[i, ·, k, ·]`, which become `out[i, k]`.
        swapped
            .par_chunks_mut(b * e)
            .enumerate()
            .for_each(|(ik, out)| {
                let first = (ik / c) * strides[0] + (ik % c) * strides[2];
                for (j, run) in out.chunks_exact_mut(e).enumerate() {
                    run.copy_from_slice(&values[first + j * strides[1]..][..e]);
                }
            });
        flex_tensor(swapped, [a, c, b, e])
    }
}

/// Elements per task of the softmax loops: whole `[seq, seq]` matrices, about [`TASK_ELEMENTS`] elements.
fn matrices_per_task(seq: usize) -> usize {
    (TASK_ELEMENTS / (seq * seq)).max(1) * seq * seq
}

/// Flex's buffers behind tensors of one shape, when all are f32, contiguous and not empty.
fn f32_buffers<const D: usize, const N: usize>(
    tensors: [&Tensor<Flex, D>; N],
) -> Option<[FlexTensor; N]> {
    let dims = tensors[0].dims();
    let readable = tensors
        .iter()
        .all(|tensor| tensor.dims() == dims && tensor.dtype() == DType::F32 && !dims.contains(&0));
    let buffers = tensors.map(|tensor| tensor.clone().into_primitive().tensor());
    let contiguous = buffers
        .iter()
        .all(|buffer| buffer.as_slice::<f32>().is_some());
    (readable && contiguous).then_some(buffers)
}

/// The elements of a buffer [`f32_buffers`] accepted.
fn slice(buffer: &FlexTensor) -> &[f32] {
    buffer
        .as_slice::<f32>()
        .expect("f32_buffers accepts contiguous f32 buffers only")
}

/// Whether the last two dimensions are equal (queries and keys of one sequence).
fn square<const D: usize>(dims: &[usize; D]) -> bool {
    D >= 2 && dims[D - 1] == dims[D - 2]
}

/// `σ(x) = 1 / (1 + e^{−x})`.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `h = g σ(g) ⊙ u`, into memory not yet initialised: a zero fill first would be one more pass
/// over `[tokens, d_ff]`. (`S`, unused in the body, picks the instruction set it is compiled for.)
#[allow(clippy::extra_unused_type_parameters)]
#[macerator::with_simd]
fn swiglu_loop<S: Simd>(gate: &[f32], up: &[f32], output: &mut [MaybeUninit<f32>]) {
    assert!(gate.len() == output.len() && up.len() == output.len());
    for ((h, &g), &u) in output.iter_mut().zip(gate).zip(up) {
        h.write(g * sigmoid(g) * u);
    }
}

/// `∂g = ∂h ⊙ u ⊙ (σ + g σ (1 − σ))` and `∂u = ∂h ⊙ g σ`, from `[gate, up, ∂h]`, into memory not
/// yet initialised.
#[allow(clippy::extra_unused_type_parameters)]
#[macerator::with_simd]
fn swiglu_backward_loop<S: Simd>(
    operands: [&[f32]; 3],
    gate_grad: &mut [MaybeUninit<f32>],
    up_grad: &mut [MaybeUninit<f32>],
) {
    let [gate, up, grad] = operands;
    assert!([gate.len(), up.len(), grad.len(), up_grad.len()] == [gate_grad.len(); 4]);
    let inputs = gate.iter().zip(up).zip(grad);
    for ((gate_grad, up_grad), ((&g, &u), &dh)) in gate_grad.iter_mut().zip(up_grad).zip(inputs) {
        let s = sigmoid(g);
        let silu = g * s;
        up_grad.write(dh * silu);
        gate_grad.write(dh * u * (s + silu * (1.0 - s)));
    }
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
