//! SwiGLU on Burn's Flex backend as SIMD loops over its f32 buffers, with the vectorised
//! exponential of [`crate::simd::exp`]; other float types and non-contiguous operands take the
//! plain operations. Each loop reads its operands once and writes each output once, in tasks of a
//! fixed size on Rayon's pool (Flex's own elementwise kernels split over threads only past 4M
//! elements).

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::Tensor;
use macerator::Simd;
use rayon::prelude::*;

use super::{SwigluBackend, naive};
use crate::simd::{TASK_ELEMENTS, exp, f32_buffers, flex_tensor, slice};

impl SwigluBackend for Flex {
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
