//! Per-token row operations of the routing path as one kernel each on the cube backends.
//!
//! A slot's gradient `into + (f · columns[s, ·]) ⊗ rows`: the scaled rows of
//! [`RoutingBackend::add_scaled_rows`](super::RoutingBackend::add_scaled_rows) and the mean
//! square's backward pass ([`RoutingBackend::row_mean_square_backward`](
//! super::RoutingBackend::row_mean_square_backward), `f = 2/d`), where the tensor operations
//! launch a product, a scalar product and an addition. Each element takes the plain operations'
//! f32 steps in their order (`naive.rs`): the column times `f`, that times the row, plus `into`.
//!
//! eq:update's signed sum with the mean square of the result, the one its source will be read
//! with: the sum's launch and the mean square's in one.
//!
//! A HAARES pair's write ([`RoutingBackend::pair_write`](super::RoutingBackend::pair_write)):
//! both sums, their mean squares and RMS matching's multiplier in one launch, where they are
//! three.
//!
//! RMS matching's multiplier (eq:rmsmatch, [`RoutingBackend::rms_match_multiplier`](
//! super::RoutingBackend::rms_match_multiplier)) from the two mean squares, and the matched
//! detail's mean square `m_D · a²`: two square roots, an addition, a division, a clamp (two
//! comparisons, two mask fills) and a square, nine launches as tensor operations counted on
//! lavapipe (docs/benchmarks.md), and a product.

use burn_cubecl::CubeRuntime;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::tensor::CubeTensor;

use super::cube::{ROW_THREADS, empty};

/// `into + (factor · columns[slot, n]) · rows[n, k]` (`rows[0, k]` for one shared row), or the
/// product alone without `into`, as a new `[tokens, d]` tensor.
pub(super) fn add_scaled_rows<R: CubeRuntime>(
    into: Option<CubeTensor<R>>,
    columns: &CubeTensor<R>,
    slot: usize,
    rows: &CubeTensor<R>,
    factor: f64,
) -> CubeTensor<R> {
    let tokens = columns.meta.shape()[1];
    let d_model = rows.meta.shape()[1];
    let output = empty(rows, [tokens, d_model]);
    let row_stride = match rows.meta.shape()[0] {
        1 => 0,
        _ => rows.meta.strides()[0] as u32,
    };
    let accumulated = into.is_some();
    let into = into.unwrap_or_else(|| rows.clone());
    let elements = tokens * d_model;
    let client = rows.client.clone();
    let cube_dim = CubeDim::new(&client, elements);
    let cube_count = calculate_cube_count_elemwise(&client, elements, cube_dim);
    kernels::add_scaled_rows_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        into.into_tensor_arg(),
        columns.clone().into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        output.clone().into_tensor_arg(),
        slot as u32,
        row_stride,
        factor as f32,
        accumulated,
        rows.dtype.into(),
    );
    output
}

/// eq:rmsmatch's multiplier `a = clip(√m_C / (√m_D + ε), 1/γ, γ)` and the matched mean square
/// `m_D · a²` per token, from `[tokens, 1]` mean squares.
pub(super) fn rms_match_multiplier<R: CubeRuntime>(
    cumulative_mean_square: &CubeTensor<R>,
    detail_mean_square: &CubeTensor<R>,
    gamma: f64,
    epsilon: f64,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let like = cumulative_mean_square;
    let tokens = like.meta.shape()[0];
    let [multiplier, matched] = [(); 2].map(|_| empty(like, [tokens, 1]));
    let client = like.client.clone();
    let cube_dim = CubeDim::new(&client, tokens);
    let cube_count = calculate_cube_count_elemwise(&client, tokens, cube_dim);
    kernels::rms_match_multiplier_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        cumulative_mean_square.clone().into_tensor_arg(),
        detail_mean_square.clone().into_tensor_arg(),
        multiplier.clone().into_tensor_arg(),
        matched.clone().into_tensor_arg(),
        (1.0 / gamma) as f32,
        gamma as f32,
        epsilon as f32,
        like.dtype.into(),
    );
    (multiplier, matched)
}

/// eq:update's `sum + sign · term` on `[tokens, d]` rows and the result's mean square per token
/// (`[tokens, 1]`), in one launch: one cube per token, each thread summing the squares of the
/// elements it writes, in the order of the row-dot kernel (`cube_kernels.rs`) that
/// [`RoutingBackend::row_mean_square`](super::RoutingBackend::row_mean_square) launches.
pub(super) fn signed_sum_with_mean_square<R: CubeRuntime>(
    sum: &CubeTensor<R>,
    term: &CubeTensor<R>,
    sign: f64,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let [tokens, d_model] = [sum.meta.shape()[0], sum.meta.shape()[1]];
    let [output, mean_square] = [d_model, 1].map(|width| empty(sum, [tokens, width]));
    let client = sum.client.clone();
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&client, tokens * ROW_THREADS, cube_dim);
    kernels::signed_sum_with_mean_square_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        sum.clone().into_tensor_arg(),
        term.clone().into_tensor_arg(),
        output.clone().into_tensor_arg(),
        mean_square.clone().into_tensor_arg(),
        sign as f32,
        ROW_THREADS,
        sum.dtype.into(),
    );
    (output, mean_square)
}

/// What [`pair_write`] forms: the new cumulative sum and its mean square, the new detail and its
/// mean square where the detail is a tensor of its own, the multiplier and the matched mean square.
pub(super) struct PairRows<R: CubeRuntime> {
    pub cumulative: (CubeTensor<R>, CubeTensor<R>),
    pub detail: Option<(CubeTensor<R>, CubeTensor<R>)>,
    pub multiplier: CubeTensor<R>,
    pub matched: CubeTensor<R>,
}

/// [`RoutingBackend::pair_write`](super::RoutingBackend::pair_write) on `[tokens, d]` rows in one
/// launch: one cube per token forms `C + u` (and `D + s·u`) as [`signed_sum_with_mean_square`]
/// does, each sum's mean square, and from them the multiplier as [`rms_match_multiplier`] does.
pub(super) fn pair_write<R: CubeRuntime>(
    cumulative: &CubeTensor<R>,
    detail: Option<&CubeTensor<R>>,
    term: &CubeTensor<R>,
    sign: f64,
    gamma: f64,
    epsilon: f64,
) -> PairRows<R> {
    let [tokens, d_model] = [cumulative.meta.shape()[0], cumulative.meta.shape()[1]];
    let own_detail = detail.is_some();
    // Without a detail of its own the kernel writes no detail: one-element stand-ins.
    let detail_rows = if own_detail { tokens } else { 1 };
    let [cumulative_out, detail_out] =
        [d_model, d_model].map(|width| empty(cumulative, [tokens, width]));
    let detail_out = if own_detail {
        detail_out
    } else {
        empty(cumulative, [1, 1])
    };
    let [cumulative_mean_square, multiplier, matched] =
        [(); 3].map(|_| empty(cumulative, [tokens, 1]));
    let detail_mean_square = empty(cumulative, [detail_rows, 1]);
    let client = cumulative.client.clone();
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&client, tokens * ROW_THREADS, cube_dim);
    kernels::pair_write_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        cumulative.clone().into_tensor_arg(),
        detail.unwrap_or(term).clone().into_tensor_arg(),
        term.clone().into_tensor_arg(),
        cumulative_out.clone().into_tensor_arg(),
        detail_out.clone().into_tensor_arg(),
        cumulative_mean_square.clone().into_tensor_arg(),
        detail_mean_square.clone().into_tensor_arg(),
        multiplier.clone().into_tensor_arg(),
        matched.clone().into_tensor_arg(),
        sign as f32,
        (1.0 / gamma) as f32,
        gamma as f32,
        epsilon as f32,
        ROW_THREADS,
        own_detail,
        cumulative.dtype.into(),
    );
    PairRows {
        cumulative: (cumulative_out, cumulative_mean_square),
        detail: own_detail.then_some((detail_out, detail_mean_square)),
        multiplier,
        matched,
    }
}

/// The kernel, in a module of its own because CubeCL's `Tensor` is not Burn's.
pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::activation_ops::cube::kernels::reduce;

    /// One element of `output = into + (factor · columns[slot, n]) · rows[n·row_stride, k]` per
    /// thread; without `accumulated`, `into` is a stand-in that is never read.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::routing_ops) fn add_scaled_rows_kernel<F: Float>(
        into: &Tensor<F>,
        columns: &Tensor<F>,
        rows: &Tensor<F>,
        output: &mut Tensor<F>,
        slot: u32,
        row_stride: u32,
        factor: f32,
        #[comptime] accumulated: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let d_model = output.shape(1);
        if ABSOLUTE_POS >= output.shape(0) * d_model {
            terminate!();
        }
        let token = ABSOLUTE_POS / d_model;
        let k = ABSOLUTE_POS % d_model;
        let column = columns[(slot as usize) * columns.stride(0) + token * columns.stride(1)]
            * F::cast_from(factor);
        let row = rows[token * (row_stride as usize) + k * rows.stride(1)];
        let mut value = column * row;
        if comptime![accumulated] {
            value = into[token * into.stride(0) + k * into.stride(1)] + value;
        }
        output[token * output.stride(0) + k * output.stride(1)] = value;
    }

    /// One cube per token `n`: `output[n, k] = sum[n, k] + sign · term[n, k]` for each thread's
    /// `k` (exactly `sum + term` and `sum − term` for the signs ±1), then
    /// `mean_square[n] = Σ_k output[n, k]² / d` from the threads' partial sums in shared memory.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::routing_ops) fn signed_sum_with_mean_square_kernel<F: Float>(
        sum: &Tensor<F>,
        term: &Tensor<F>,
        output: &mut Tensor<F>,
        mean_square: &mut Tensor<F>,
        sign: f32,
        #[comptime] threads: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let token = CUBE_POS;
        if token >= output.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let d_model = output.shape(1);
        let mut partials = SharedMemory::<F>::new(threads);
        let mut squares = F::new(0.0);
        let mut k = lane;
        while k < d_model {
            let value = sum[token * sum.stride(0) + k * sum.stride(1)]
                + term[token * term.stride(0) + k * term.stride(1)] * F::cast_from(sign);
            output[token * output.stride(0) + k * output.stride(1)] = value;
            squares += value * value;
            k += threads;
        }
        partials[lane] = squares;
        reduce::<F>(&mut partials, lane, threads, false);
        if lane == 0 {
            mean_square[token * mean_square.stride(0)] = partials[0] / F::cast_from(d_model);
        }
    }

    /// One token's multiplier per thread, [`matching_multiplier`], then `m_D` times its square.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::routing_ops) fn rms_match_multiplier_kernel<F: Float>(
        cumulative: &Tensor<F>,
        detail: &Tensor<F>,
        multiplier: &mut Tensor<F>,
        matched: &mut Tensor<F>,
        low: f32,
        high: f32,
        epsilon: f32,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= multiplier.shape(0) {
            terminate!();
        }
        let token = ABSOLUTE_POS;
        let detail = detail[token * detail.stride(0)];
        let clamped = matching_multiplier::<F>(
            cumulative[token * cumulative.stride(0)],
            detail,
            low,
            high,
            epsilon,
        );
        multiplier[token * multiplier.stride(0)] = clamped;
        matched[token * matched.stride(0)] = detail * (clamped * clamped);
    }

    /// eq:rmsmatch's `clip(√m_C / (√m_D + ε), low, high)` in the tensor operations' steps (square
    /// roots, `+ ε`, division, `clamp_min` then `clamp_max`, which pass NaN through).
    #[cube]
    fn matching_multiplier<F: Float>(
        cumulative: F,
        detail: F,
        low: f32,
        high: f32,
        epsilon: f32,
    ) -> F {
        let ratio = F::sqrt(cumulative) / (F::sqrt(detail) + F::cast_from(epsilon));
        let mut clamped = ratio;
        if ratio < F::cast_from(low) {
            clamped = F::cast_from(low);
        }
        if clamped > F::cast_from(high) {
            clamped = F::cast_from(high);
        }
        clamped
    }

    /// One cube per token `n`: `C'[n, k] = C[n, k] + u[n, k]` and, with `own_detail`,
    /// `D'[n, k] = D[n, k] + sign · u[n, k]` for each thread's `k` (the signed-sum kernel's
    /// steps), each sum's mean square from the threads' partial sums (without `own_detail` the
    /// detail's is the cumulative's), then the multiplier and `m_D · a²` (the multiplier
    /// kernel's steps). Without `own_detail`, `detail` is a stand-in that is never read and the
    /// detail's outputs are never written.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::routing_ops) fn pair_write_kernel<F: Float>(
        cumulative: &Tensor<F>,
        detail: &Tensor<F>,
        term: &Tensor<F>,
        cumulative_out: &mut Tensor<F>,
        detail_out: &mut Tensor<F>,
        cumulative_mean_square: &mut Tensor<F>,
        detail_mean_square: &mut Tensor<F>,
        multiplier: &mut Tensor<F>,
        matched: &mut Tensor<F>,
        sign: f32,
        low: f32,
        high: f32,
        epsilon: f32,
        #[comptime] threads: usize,
        #[comptime] own_detail: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let token = CUBE_POS;
        if token >= cumulative_out.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let d_model = cumulative_out.shape(1);
        let mut cumulative_partials = SharedMemory::<F>::new(threads);
        let mut detail_partials = SharedMemory::<F>::new(threads);
        let mut cumulative_squares = F::new(0.0);
        let mut detail_squares = F::new(0.0);
        let mut k = lane;
        while k < d_model {
            let added = term[token * term.stride(0) + k * term.stride(1)];
            let sum = cumulative[token * cumulative.stride(0) + k * cumulative.stride(1)] + added;
            cumulative_out[token * cumulative_out.stride(0) + k * cumulative_out.stride(1)] = sum;
            cumulative_squares += sum * sum;
            if comptime![own_detail] {
                let sum = detail[token * detail.stride(0) + k * detail.stride(1)]
                    + added * F::cast_from(sign);
                detail_out[token * detail_out.stride(0) + k * detail_out.stride(1)] = sum;
                detail_squares += sum * sum;
            }
            k += threads;
        }
        cumulative_partials[lane] = cumulative_squares;
        reduce::<F>(&mut cumulative_partials, lane, threads, false);
        if comptime![own_detail] {
            detail_partials[lane] = detail_squares;
            reduce::<F>(&mut detail_partials, lane, threads, false);
        }
        if lane == 0 {
            let cumulative_mean = cumulative_partials[0] / F::cast_from(d_model);
            cumulative_mean_square[token * cumulative_mean_square.stride(0)] = cumulative_mean;
            let mut detail_mean = cumulative_mean;
            if comptime![own_detail] {
                detail_mean = detail_partials[0] / F::cast_from(d_model);
                detail_mean_square[token * detail_mean_square.stride(0)] = detail_mean;
            }
            let clamped =
                matching_multiplier::<F>(cumulative_mean, detail_mean, low, high, epsilon);
            multiplier[token * multiplier.stride(0)] = clamped;
            matched[token * matched.stride(0)] = detail_mean * (clamped * clamped);
        }
    }
}
