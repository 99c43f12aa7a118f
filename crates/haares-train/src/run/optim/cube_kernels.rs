//! The kernels of `cube.rs`, in a module of their own because CubeCL's `Tensor` is not Burn's.
//! Each takes a batch of parameters as CubeCL `Sequence`s (one binding per tensor) and unrolls
//! its loop over them.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// One element of [`update_plain`](super::rule::update_plain) per thread, in its order, for a
/// batch of parameters laid end to end (thread `t` updates element `t − start_i` of the parameter
/// `i` whose range holds it): `g ← g·clip`, `m ← β₁m + (1 − β₁)g`, `v ← β₂v + (1 − β₂)g²`,
/// `p ← p·decay − (m / (√v / √(1 − β₂ᵗ) + ε))·step`. Parameter `i` decays where bit `i` of
/// `decayed` is set; `decay` and `clip` are 1 where the plain path skips the product (`x·1 = x`
/// exactly).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
pub(super) fn adamw_kernel(
    p: &Sequence<Tensor<f32>>,
    g: &Sequence<Tensor<f32>>,
    m: &Sequence<Tensor<f32>>,
    v: &Sequence<Tensor<f32>>,
    out_p: &mut Sequence<Tensor<f32>>,
    out_m: &mut Sequence<Tensor<f32>>,
    out_v: &mut Sequence<Tensor<f32>>,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias2_root: f32,
    epsilon: f32,
    step_size: f32,
    decayed: u32,
    decay: f32,
    clip: f32,
) {
    let count = comptime![p.len()];
    let mut start = 0usize;
    #[unroll]
    for item in 0..count {
        let len = p.index(item).len();
        if ABSOLUTE_POS >= start && ABSOLUTE_POS < start + len {
            let at = ABSOLUTE_POS - start;
            let factor = if (decayed >> (item as u32)) & 1 == 1 {
                decay
            } else {
                f32::new(1.0)
            };
            let grad = g.index(item)[at] * clip;
            let exp_avg = m.index(item)[at] * beta1 + grad * one_minus_beta1;
            let exp_avg_sq = v.index(item)[at] * beta2 + (grad * grad) * one_minus_beta2;
            let denominator = f32::sqrt(exp_avg_sq) / bias2_root + epsilon;
            out_p.index_mut(item)[at] =
                p.index(item)[at] * factor - (exp_avg / denominator) * step_size;
            out_m.index_mut(item)[at] = exp_avg;
            out_v.index_mut(item)[at] = exp_avg_sq;
        }
        start += len;
    }
}

/// `partials[first + i, part] = Σ g_i²` over part `part` of gradient `i` of the batch: cube
/// `(part, i)` takes every `parts`-th run of `threads` elements of the gradient (`part` counted
/// from its first run), so that a large gradient is spread over `parts` cubes and the batch over
/// `parts ×` its count, and adds its threads' sums in a tree of fixed order.
#[cube(launch)]
pub(super) fn sum_of_squares_kernel(
    gradients: &Sequence<Tensor<f32>>,
    partials: &mut Tensor<f32>,
    first: u32,
    #[comptime] threads: usize,
    #[comptime] parts: usize,
) {
    let count = comptime![gradients.len()];
    let lane = UNIT_POS_X as usize;
    let (part, position) = (CUBE_POS_X as usize, CUBE_POS_Y as usize);
    let mut shared = SharedMemory::<f32>::new(threads);
    let mut sum = f32::new(0.0);
    #[unroll]
    for item in 0..count {
        if position == item {
            let g = gradients.index(item);
            let mut at = part * threads + lane;
            while at < g.len() {
                let x = g[at];
                sum += x * x;
                at += parts * threads;
            }
        }
    }
    shared[lane] = sum;
    let total = tree_total(&mut shared, lane);
    if lane == 0 {
        partials[(first as usize + position) * parts + part] = total;
    }
}

/// `total[0] = Σ partials`, one cube: each thread sums every `threads`-th element, then a tree
/// of fixed order adds the threads' sums.
#[cube(launch)]
pub(super) fn total_kernel(
    partials: &Tensor<f32>,
    total: &mut Tensor<f32>,
    #[comptime] threads: usize,
) {
    let lane = UNIT_POS_X as usize;
    let mut shared = SharedMemory::<f32>::new(threads);
    let mut sum = f32::new(0.0);
    let mut at = lane;
    while at < partials.len() {
        sum += partials[at];
        at += threads;
    }
    shared[lane] = sum;
    let sum = tree_total(&mut shared, lane);
    if lane == 0 {
        total[0] = sum;
    }
}

/// The sum of `shared[0..CUBE_DIM_X]` (a power of two), halving the live threads each step;
/// every thread of the one-dimensional cube calls it, having written its own `shared[lane]`.
#[cube]
fn tree_total(shared: &mut SharedMemory<f32>, lane: usize) -> f32 {
    sync_cube();
    // The cube is one-dimensional, of `threads` threads: its size is the stride's runtime start
    // (a compile-time value cannot change in a loop).
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if lane < stride {
            shared[lane] = shared[lane] + shared[lane + stride];
        }
        sync_cube();
        stride /= 2;
    }
    shared[0]
}
