//! The kernels of `../cube.rs`: a whole read of eq:routingweights forward and backward, one
//! cube per token.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use crate::ops::cube_shared::kernels::cube_total;
use crate::ops::routing::sums::cube::kernels::partial_dots;
use crate::ops::routing::sums::cube::kernels::total_slots;

/// One cube per token `n`: `dot_s = u · raw_s[n]` with `u = q ⊙ w` reduced in shared memory,
/// then (one thread) `z'_s = dot_s · c_s / √(m_s + ε)`, `α = softmax_s(z' + b)`, then every
/// thread `h̃[n, k] = Σ_s α_s c_s raw_s[n, k]` for its `k`. Slot `s` has a scale where bit `s` of
/// `scaled` is set (`c_s = 1` otherwise), and takes the bias `b = bias[0]` where bit `s` of
/// `biased` is (`bias` is read only then). `with_norm` then normalises the token's row,
/// `normed[n, k] = h̃[n, k] / √(mean_k h̃[n]² + ε_norm) · g[k]`, as the RMSNorm kernel does.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(in crate::ops) fn read_forward_kernel<F: Float>(
    slots: &Sequence<Tensor<F>>,
    scales: &Sequence<Tensor<F>>,
    mean_squares: &Sequence<Tensor<F>>,
    query: &Tensor<F>,
    key_weight: &Tensor<F>,
    bias: &Tensor<F>,
    gain: &Tensor<F>,
    mixture: &mut Tensor<F>,
    weights: &mut Tensor<F>,
    scores: &mut Tensor<F>,
    normed: &mut Tensor<F>,
    scaled: u32,
    biased: u32,
    epsilon: f32,
    norm_epsilon: f32,
    #[comptime] with_norm: bool,
    #[comptime] threads: usize,
    #[comptime] planes: bool,
    #[define(F)] _dtype: StorageType,
) {
    let count = comptime![slots.len()];
    let token = CUBE_POS;
    if token >= mixture.shape(0) {
        terminate!();
    }
    let lane = UNIT_POS_X as usize;
    let d_model = mixture.shape(1);
    let mut partials = SharedMemory::<F>::new(count * threads);
    // Per slot: its logit, then e^{logit − max}; and `α_s c_s`, the mixture's factor.
    let mut logits = SharedMemory::<F>::new(count);
    let mut factors = SharedMemory::<F>::new(count);
    partial_dots::<F>(
        slots,
        query,
        0,
        key_weight,
        token,
        &mut partials,
        lane,
        true,
        threads,
    );
    sync_cube();
    total_slots::<F>(&mut partials, lane, count, threads);
    if lane == 0 {
        #[unroll]
        for slot in 0..count {
            let dot = partials[slot * threads];
            let mean_square = mean_squares.index(slot);
            let m = mean_square[token * mean_square.stride(0)];
            let scale = scale_at::<F>(scales, scaled, token, slot);
            // A division, as the composition's coefficient is formed.
            let score = dot * (scale / (m + F::cast_from(epsilon)).sqrt());
            scores[slot * scores.stride(0) + token * scores.stride(1)] = score;
            let mut logit = score;
            if (biased >> u32::cast_from(slot)) & 1 == 1 {
                logit += bias[0];
            }
            logits[slot] = logit;
            factors[slot] = scale;
        }
        let mut largest = logits[0];
        for slot in 1..count {
            largest = F::max(largest, logits[slot]);
        }
        let mut total = F::new(0.0);
        for slot in 0..count {
            let exponential = (logits[slot] - largest).exp();
            logits[slot] = exponential;
            total += exponential;
        }
        for slot in 0..count {
            let weight = logits[slot] / total;
            weights[slot * weights.stride(0) + token * weights.stride(1)] = weight;
            factors[slot] = weight * factors[slot];
        }
    }
    sync_cube();
    let mut squares = F::new(0.0);
    let mut k = lane;
    while k < d_model {
        let sum = mixed::<F>(slots, &factors, token, k);
        mixture[token * mixture.stride(0) + k * mixture.stride(1)] = sum;
        if with_norm {
            squares += sum * sum;
        }
        k += threads;
    }
    if with_norm {
        // Each thread reads back the entries it wrote.
        let squares = cube_total::<F>(&mut partials, lane, squares, threads, false, planes);
        let rms = (squares / F::cast_from(d_model) + F::cast_from(norm_epsilon)).sqrt();
        k = lane;
        while k < d_model {
            let h = mixture[token * mixture.stride(0) + k * mixture.stride(1)];
            normed[token * normed.stride(0) + k * normed.stride(1)] =
                h / rms * gain[k * gain.stride(1)];
            k += threads;
        }
    }
}

/// A token's mixture at `k`, `Σ_s factors_s raw_s[token, k]` (`factors_s = α_s c_s`), summed in
/// the slots' order: the forward kernel's value, which the backward kernel forms again.
#[cube]
fn mixed<F: Float>(
    slots: &Sequence<Tensor<F>>,
    factors: &SharedMemory<F>,
    token: usize,
    k: usize,
) -> F {
    let count = comptime![slots.len()];
    let mut sum = F::new(0.0);
    #[unroll]
    for slot in 0..count {
        let source = slots.index(slot);
        sum += factors[slot] * source[token * source.stride(0) + k * source.stride(1)];
    }
    sum
}

/// Slot `slot`'s scale at `token`: 1 where its bit in `scaled` is clear.
#[cube]
fn scale_at<F: Float>(
    scales: &Sequence<Tensor<F>>,
    scaled: u32,
    token: usize,
    #[comptime] slot: usize,
) -> F {
    let mut scale = F::new(1.0);
    if (scaled >> u32::cast_from(slot)) & 1 == 1 {
        let of_slot = scales.index(slot);
        scale = of_slot[token * of_slot.stride(0)];
    }
    scale
}

/// One cube per token `n`, with `g = ∂L/∂h̃[n]`: `a_s = c_s (g · raw_s[n])` reduced in shared
/// memory; then (one thread) `∂α_s = a_s (+ ∂L/∂α_s)`, `∂ℓ_s = α_s (∂α_s − Σ_r α_r ∂α_r)` (the
/// logits' gradient), `w_s = ∂ℓ_s c_s / √(m_s + ε)` and `∂m_s = −½ ∂ℓ_s z'_s / (m_s + ε)`, and with
/// `bias_wanted` the token's share of `∂b`, `Σ_s ∂ℓ_s` over the slots whose bit in `biased` is set,
/// written to column `d` of `query_rows`; then every thread, for its `k`, `∂raw_s[n, k] = into_s[n,
/// k] + α_s c_s g[k] + w_s u[k]` for the wanted slots (rows `s·tokens + n` of `raw_grads`, with `u
/// = q ⊙ w`) and `Σ_s w_s raw_s[n, k]`, the token's share of `∂u`. With `fold`, each wanted slot's
/// row also takes its mean square's gradient, `+ (∂m_s c_s²)(2/d) raw_s[n, k]`
/// ([`ReadBackward::fold_mean_squares`]( super::ReadBackward::fold_mean_squares)), and
/// `mean_square_grads` is not written. Bit `s` of `scaled`, `accumulated` and `wanted` says whether
/// slot `s` has a scale, a gradient `into_s` to add to, and a gradient wanted; bit `s` of `merged`,
/// that slot `s`'s rows are slot `s − 1`'s, whose entry then takes slot `s`'s gradient too (slot
/// `s`'s is not written). With `with_norm`, `grad` is the gradient of the normalised mixture and
/// `g` above is `∂h̃`, formed first by [`norm_backward_row`] in slot 0's rows of `raw_grads` (each
/// thread reading back what it wrote before it writes the slot's gradient there).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(in crate::ops) fn read_backward_kernel<F: Float>(
    slots: &Sequence<Tensor<F>>,
    scales: &Sequence<Tensor<F>>,
    mean_squares: &Sequence<Tensor<F>>,
    into: &Sequence<Tensor<F>>,
    query: &Tensor<F>,
    key_weight: &Tensor<F>,
    weights: &Tensor<F>,
    scores: &Tensor<F>,
    grad: &Tensor<F>,
    weights_grad: &Tensor<F>,
    gain: &Tensor<F>,
    raw_grads: &mut Tensor<F>,
    mean_square_grads: &mut Tensor<F>,
    query_rows: &mut Tensor<F>,
    scaled: u32,
    accumulated: u32,
    wanted: u32,
    merged: u32,
    biased: u32,
    epsilon: f32,
    norm_epsilon: f32,
    #[comptime] extra: bool,
    #[comptime] fold: bool,
    #[comptime] bias_wanted: bool,
    #[comptime] with_norm: bool,
    #[comptime] threads: usize,
    #[comptime] planes: bool,
    #[define(F)] _dtype: StorageType,
) {
    let count = comptime![slots.len()];
    let tokens = query_rows.shape(0);
    let token = CUBE_POS;
    if token >= tokens {
        terminate!();
    }
    let lane = UNIT_POS_X as usize;
    let d_model = grad.shape(1);
    let grad_row = token * grad.stride(0);
    let mut partials = SharedMemory::<F>::new(count * threads);
    // Per slot: `α_s c_s`, then `w_s`.
    let mut mixture_factors = SharedMemory::<F>::new(count);
    let mut score_factors = SharedMemory::<F>::new(count);
    // Per slot: `∂m_s (2/d) c_s²` where mean squares are folded.
    let mut fold_factors = SharedMemory::<F>::new(count);
    // Slot 0's gradient row of this token, which holds `∂h̃` with a norm.
    let scratch_row = token * raw_grads.stride(0);
    if with_norm {
        if lane == 0 {
            #[unroll]
            for slot in 0..count {
                let weight = weights[slot * weights.stride(0) + token * weights.stride(1)];
                mixture_factors[slot] = weight * scale_at::<F>(scales, scaled, token, slot);
            }
        }
        sync_cube();
        let gain_column = d_model + comptime![usize::from(bias_wanted)];
        norm_backward_row::<F>(
            slots,
            &mixture_factors,
            gain,
            grad,
            raw_grads,
            query_rows,
            token,
            gain_column,
            norm_epsilon,
            &mut partials,
            lane,
            threads,
            planes,
        );
        partial_dots::<F>(
            slots,
            raw_grads,
            scratch_row,
            grad,
            token,
            &mut partials,
            lane,
            false,
            threads,
        );
    } else {
        partial_dots::<F>(
            slots,
            grad,
            grad_row,
            grad,
            token,
            &mut partials,
            lane,
            false,
            threads,
        );
    }
    sync_cube();
    total_slots::<F>(&mut partials, lane, count, threads);
    if lane == 0 {
        let mut along = F::new(0.0);
        #[unroll]
        for slot in 0..count {
            let dot = partials[slot * threads];
            let scale = scale_at::<F>(scales, scaled, token, slot);
            let at = slot * weights.stride(0) + token * weights.stride(1);
            let mut weight_grad = dot * scale;
            if extra {
                weight_grad +=
                    weights_grad[slot * weights_grad.stride(0) + token * weights_grad.stride(1)];
            }
            // Kept in the score factors until the sum along the slots is known.
            score_factors[slot] = weight_grad;
            along += weights[at] * weight_grad;
        }
        let mut bias_share = F::new(0.0);
        #[unroll]
        for slot in 0..count {
            let scale = scale_at::<F>(scales, scaled, token, slot);
            let mean_square = mean_squares.index(slot);
            let shifted = mean_square[token * mean_square.stride(0)] + F::cast_from(epsilon);
            let weight = weights[slot * weights.stride(0) + token * weights.stride(1)];
            let logit_grad = weight * (score_factors[slot] - along);
            if (biased >> u32::cast_from(slot)) & 1 == 1 {
                bias_share += logit_grad;
            }
            let score = scores[slot * scores.stride(0) + token * scores.stride(1)];
            let mean_square_grad = (logit_grad * score / shifted) * F::new(-0.5);
            if !fold {
                mean_square_grads
                    [slot * mean_square_grads.stride(0) + token * mean_square_grads.stride(1)] =
                    mean_square_grad;
            } else {
                // As the composition forms it: `∂m · c · c`, then times `2/d`.
                fold_factors[slot] =
                    mean_square_grad * scale * scale * (F::new(2.0) / F::cast_from(d_model));
            }
            mixture_factors[slot] = weight * scale;
            // A division, as the composition's coefficient is formed.
            score_factors[slot] = logit_grad * (scale / shifted.sqrt());
        }
        if bias_wanted {
            query_rows[token * query_rows.stride(0) + d_model * query_rows.stride(1)] = bias_share;
        }
    }
    sync_cube();
    let mut k = lane;
    while k < d_model {
        let g = if with_norm {
            raw_grads[scratch_row + k * raw_grads.stride(1)]
        } else {
            grad[grad_row + k * grad.stride(1)]
        };
        let u = query[k * query.stride(1)] * key_weight[k * key_weight.stride(1)];
        let mut query_sum = F::new(0.0);
        #[unroll]
        for slot in 0..count {
            let source = slots.index(slot);
            let row = source[token * source.stride(0) + k * source.stride(1)];
            query_sum += score_factors[slot] * row;
            if (wanted >> u32::cast_from(slot)) & 1 == 1 {
                let mut sum = g * mixture_factors[slot];
                if (accumulated >> u32::cast_from(slot)) & 1 == 1 {
                    let earlier = into.index(slot);
                    sum = earlier[token * earlier.stride(0) + k * earlier.stride(1)] + sum;
                }
                let mut total = sum + score_factors[slot] * u;
                if fold {
                    total += fold_factors[slot] * row;
                }
                let at = slot * tokens + token;
                if (merged >> u32::cast_from(slot)) & 1 == 1 {
                    // The previous slot's rows are this slot's: its entry, which this thread
                    // has just written, takes both gradients.
                    let previous = (at - tokens) * raw_grads.stride(0) + k * raw_grads.stride(1);
                    raw_grads[previous] = raw_grads[previous] + total;
                } else {
                    raw_grads[at * raw_grads.stride(0) + k * raw_grads.stride(1)] = total;
                }
            }
        }
        query_rows[token * query_rows.stride(0) + k * query_rows.stride(1)] = query_sum;
        k += threads;
    }
}

/// The RMSNorm's backward pass for token `n`'s row, as the RMSNorm's backward kernel forms it:
/// the mixture `h̃[n, k] = Σ_s factors_s raw_s[n, k]` formed again as the forward kernel formed it
/// (`factors_s = α_s c_s`), then with `rms = √(mean_k h̃[n]² + ε)` and `x̂ = h̃[n] / rms`,
/// `∂h̃[n] = (∂y⊙g − x̂ mean(∂y⊙g⊙x̂)) / rms` into row `n` of `out` (`h̃[n]` first, then
/// overwritten), and the row's share of `∂g`, `∂y⊙x̂`, into `query_rows` from column
/// `gain_column`. Each thread writes and reads back the entries of its own `k`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn norm_backward_row<F: Float>(
    slots: &Sequence<Tensor<F>>,
    factors: &SharedMemory<F>,
    gain: &Tensor<F>,
    grad: &Tensor<F>,
    out: &mut Tensor<F>,
    query_rows: &mut Tensor<F>,
    token: usize,
    gain_column: usize,
    norm_epsilon: f32,
    partials: &mut SharedMemory<F>,
    lane: usize,
    #[comptime] threads: usize,
    #[comptime] planes: bool,
) {
    let d_model = grad.shape(1);
    let (h_row, grad_row) = (token * out.stride(0), token * grad.stride(0));
    let mut squares = F::new(0.0);
    let mut k = lane;
    while k < d_model {
        let h = mixed::<F>(slots, factors, token, k);
        out[h_row + k * out.stride(1)] = h;
        squares += h * h;
        k += threads;
    }
    let squares = cube_total::<F>(partials, lane, squares, threads, false, planes);
    let rms = (squares / F::cast_from(d_model) + F::cast_from(norm_epsilon)).sqrt();
    let mut dot = F::new(0.0);
    k = lane;
    while k < d_model {
        let normed = out[h_row + k * out.stride(1)] / rms;
        dot += grad[grad_row + k * grad.stride(1)] * gain[k * gain.stride(1)] * normed;
        k += threads;
    }
    let along_row =
        cube_total::<F>(partials, lane, dot, threads, false, planes) / F::cast_from(d_model);
    k = lane;
    while k < d_model {
        let at = h_row + k * out.stride(1);
        let normed = out[at] / rms;
        let dy = grad[grad_row + k * grad.stride(1)];
        out[at] = (dy * gain[k * gain.stride(1)] - normed * along_row) / rms;
        query_rows[token * query_rows.stride(0) + (gain_column + k) * query_rows.stride(1)] =
            dy * normed;
        k += threads;
    }
}

/// Groups of partial sums in [`query_gradients_kernel`]'s reduction; its thread count is a
/// multiple.
pub(super) const GROUPS: usize = 16;

/// `∂q = (Σ_n rows[n, k]) w[k]` and `∂w = (Σ_n rows[n, k]) q[k]` (each a `[1, d]` row): the
/// folded query's gradient, summed over the tokens' rows the backward kernel writes, taken to the
/// query and the key weight (the tensor operations' sum, then two products); `∂b = Σ_n rows[n,
/// d]` where `bias_columns` is 1; and the norm's `∂g[j] = Σ_n rows[n, d + bias_columns + j]` in
/// the columns after. One cube per column `k`: its threads stride over the tokens, and shared
/// memory sums their partial sums in [`GROUPS`] groups.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(in crate::ops) fn query_gradients_kernel<F: Float>(
    rows: &Tensor<F>,
    query: &Tensor<F>,
    key_weight: &Tensor<F>,
    query_grad: &mut Tensor<F>,
    key_weight_grad: &mut Tensor<F>,
    bias_grad: &mut Tensor<F>,
    gain_grad: &mut Tensor<F>,
    bias_columns: u32,
    #[comptime] threads: usize,
    #[define(F)] _dtype: StorageType,
) {
    let k = CUBE_POS;
    if k >= rows.shape(1) {
        terminate!();
    }
    let lane = UNIT_POS_X as usize;
    let mut partials = SharedMemory::<F>::new(threads);
    let mut sum = F::new(0.0);
    let mut token = lane;
    while token < rows.shape(0) {
        sum += rows[token * rows.stride(0) + k * rows.stride(1)];
        token += threads;
    }
    partials[lane] = sum;
    sync_cube();
    // In two rounds: `groups` threads each sum a group of partials, then one thread the groups.
    let groups = comptime![GROUPS];
    let per_group = comptime![threads / GROUPS];
    if lane < groups {
        let mut group_sum = F::new(0.0);
        for at in 0..per_group {
            group_sum += partials[lane * per_group + at];
        }
        partials[lane * per_group] = group_sum;
    }
    sync_cube();
    if lane == 0 {
        let mut total = F::new(0.0);
        for group in 0..groups {
            total += partials[group * per_group];
        }
        let d_model = query.shape(1);
        let gain_column = d_model + bias_columns as usize;
        if k < d_model {
            query_grad[k * query_grad.stride(1)] = total * key_weight[k * key_weight.stride(1)];
            key_weight_grad[k * key_weight_grad.stride(1)] = total * query[k * query.stride(1)];
        } else if k < gain_column {
            bias_grad[0] = total;
        } else {
            gain_grad[(k - gain_column) * gain_grad.stride(1)] = total;
        }
    }
}
