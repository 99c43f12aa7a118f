//! Affine RMSNorm on Burn's Flex backend as SIMD loops over its f32 buffers, a task of whole rows
//! (about [`TASK_ELEMENTS`] elements) on Rayon's pool; other float types and non-contiguous
//! operands take the plain operations ([`naive`]).
//!
//! The plain operations pass over `[rows, d]` eight times forward and backward together, each
//! into a fresh tensor; these loops read each operand once per row, while it is in cache.

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::Tensor;
use macerator::Simd;
use rayon::prelude::*;

use super::{NormBackend, naive};
use crate::simd::{TASK_ELEMENTS, dot_product, f32_buffers, flex_tensor, slice};

impl NormBackend for Flex {
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let [rows, d] = x.dims();
        match (f32_buffers([&x]), f32_buffers([&weight])) {
            (Some([x_buffer]), Some([weight_buffer])) if weight.dims() == [d] => {
                let (x, weight) = (slice(&x_buffer), slice(&weight_buffer));
                let task = rows_per_task(d) * d;
                let mut output = Vec::with_capacity(x.len());
                output.spare_capacity_mut()[..x.len()]
                    .par_chunks_mut(task)
                    .zip(x.par_chunks(task))
                    .for_each(|(output, x)| rms_norm_loop(x, weight, epsilon as f32, output));
                // SAFETY: every task wrote each element of its rows.
                unsafe { output.set_len(x.len()) };
                flex_tensor(output, [rows, d])
            }
            _ => naive::rms_norm(x, weight, epsilon),
        }
    }

    fn rms_norm_backward(
        x: Tensor<Self, 2>,
        weight: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        let [rows, d] = x.dims();
        match (f32_buffers([&x, &grad]), f32_buffers([&weight])) {
            (Some([x_buffer, grad_buffer]), Some([weight_buffer])) if weight.dims() == [d] => {
                let (x, grad) = (slice(&x_buffer), slice(&grad_buffer));
                let weight = slice(&weight_buffer);
                let task = rows_per_task(d) * d;
                let mut x_grad = Vec::with_capacity(x.len());
                // Each task's share of `∂w`, added up below in the tasks' order, so that the sum
                // is the same however many threads ran them.
                let partial_weight_grads: Vec<Vec<f32>> = x_grad.spare_capacity_mut()[..x.len()]
                    .par_chunks_mut(task)
                    .zip(x.par_chunks(task).zip(grad.par_chunks(task)))
                    .map(|(x_grad, (x, grad))| {
                        rms_norm_backward_loop([x, weight, grad], epsilon as f32, x_grad)
                    })
                    .collect();
                // SAFETY: every task wrote each element of its rows.
                unsafe { x_grad.set_len(x.len()) };
                let mut weight_grad = vec![0.0; d];
                for partial in &partial_weight_grads {
                    for (total, &part) in weight_grad.iter_mut().zip(partial) {
                        *total += part;
                    }
                }
                (
                    flex_tensor(x_grad, [rows, d]),
                    flex_tensor(weight_grad, [d]),
                )
            }
            _ => naive::rms_norm_backward(x, weight, grad, epsilon),
        }
    }
}

/// Whole rows of `d` per task, about [`TASK_ELEMENTS`] elements: fixed, not derived from the
/// number of threads, so that `∂w`'s partial sums are the same however many threads run.
fn rows_per_task(d: usize) -> usize {
    (TASK_ELEMENTS / d).max(1)
}

/// `rms = sqrt(Σ x² / d + ε)` of one row, as the plain form computes it.
#[inline(always)]
fn root_mean_square<S: Simd>(row: &[f32], epsilon: f32) -> f32 {
    (dot_product::<S, f32>(row, row) / row.len() as f32 + epsilon).sqrt()
}

/// `y = x / rms ⊙ w`, row by row (a division, as in the plain form).
#[macerator::with_simd]
fn rms_norm_loop<S: Simd>(
    x: &[f32],
    weight: &[f32],
    epsilon: f32,
    output: &mut [MaybeUninit<f32>],
) {
    let d = weight.len();
    for (row, output) in x.chunks_exact(d).zip(output.chunks_exact_mut(d)) {
        let rms = root_mean_square::<S>(row, epsilon);
        for ((y, &x), &w) in output.iter_mut().zip(row).zip(weight) {
            y.write(x / rms * w);
        }
    }
}

/// `∂x = (∂y⊙w − x̂ mean(∂y⊙w⊙x̂)) / rms` row by row, with `x̂ = x / rms`, into `x_grad`; returns
/// these rows' share of `∂w = Σ_rows ∂y⊙x̂`.
#[macerator::with_simd]
fn rms_norm_backward_loop<S: Simd>(
    operands: [&[f32]; 3],
    epsilon: f32,
    x_grad: &mut [MaybeUninit<f32>],
) -> Vec<f32> {
    let [x, weight, grad] = operands;
    let d = weight.len();
    let (mut normed, mut weighted) = (vec![0.0f32; d], vec![0.0f32; d]);
    let mut weight_grad = vec![0.0f32; d];
    let rows = x.chunks_exact(d).zip(grad.chunks_exact(d));
    for ((x, grad), x_grad) in rows.zip(x_grad.chunks_exact_mut(d)) {
        let rms = root_mean_square::<S>(x, epsilon);
        for (normed, &x) in normed.iter_mut().zip(x) {
            *normed = x / rms;
        }
        for ((weighted, &g), &w) in weighted.iter_mut().zip(grad).zip(weight) {
            *weighted = g * w;
        }
        let along_row = dot_product::<S, f32>(&weighted, &normed) / d as f32;
        for ((dx, &weighted), &normed) in x_grad.iter_mut().zip(&weighted).zip(&normed) {
            dx.write((weighted - normed * along_row) / rms);
        }
        for ((total, &g), &normed) in weight_grad.iter_mut().zip(grad).zip(&normed) {
            *total += g * normed;
        }
    }
    weight_grad
}
