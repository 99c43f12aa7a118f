//! A source's write as one kernel on the cube backends.
//!
//! eq:update's signed sum with the mean square of the result, the one its source will be read
//! with: the sum's launch and the mean square's in one. A HAARES pair's write
//! ([`SourceWriteBackend::pair_write`]): both sums, their mean squares and RMS matching's
//! multiplier in one launch, where they are three.
//!
//! RMS matching's multiplier (eq:rmsmatch, [`SourceWriteBackend::rms_match_multiplier`]) from the
//! two mean squares, and the matched detail's mean square `m_D · a²`: two square roots, an
//! addition, a division, a clamp (two comparisons, two mask fills) and a square, nine launches as
//! tensor operations counted on lavapipe (docs/benchmarks.md), and a product.
//!
//! A mean square is one launch of the slot sums' row dots; its backward pass one launch of their
//! scaled rows (`f = 2/d`).

use burn::tensor::Tensor;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::{PairWrite, RmsMatching, SourceWriteBackend};
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{ROW_THREADS, empty, plane_reduction};
use crate::ops::routing::cube_shared::cube_tensor;
use crate::ops::routing::sums::cube::{add_scaled_rows, row_dots};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> SourceWriteBackend
    for CubeBackend<R, F, I, BT>
{
    /// One launch: the row dots of the rows with themselves, divided by `d` in the kernel.
    fn row_mean_square(rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let rows = cube_tensor(rows);
        let sums = row_dots(std::slice::from_ref(&rows), rows.clone(), d_model as f64);
        from_primitive::<Self, 2>(sums).reshape([tokens, 1])
    }

    /// One launch  where the tensor operations take a scalar product, a product
    /// and an addition.
    fn row_mean_square_backward(
        into: Option<Tensor<Self, 2>>,
        grad: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let column = cube_tensor(grad.reshape([1, tokens]));
        from_primitive(add_scaled_rows(
            into.map(cube_tensor),
            &column,
            0,
            &cube_tensor(rows),
            2.0 / d_model as f64,
        ))
    }

    /// One launch : the sum and its mean square.
    fn signed_sum_with_mean_square<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        let shape = sum.dims();
        let d_model = shape[D - 1];
        let tokens = sum.shape().num_elements() / d_model;
        let rows = |tensor: Tensor<Self, D>| cube_tensor(tensor.reshape([tokens, d_model]));
        let (output, mean_square) = signed_sum_with_mean_square(&rows(sum), &rows(term), sign);
        let mut mean_square_shape = shape;
        mean_square_shape[D - 1] = 1;
        (
            from_primitive::<Self, 2>(output).reshape(shape),
            Some(from_primitive::<Self, 2>(mean_square).reshape(mean_square_shape)),
        )
    }

    /// One launch .
    fn rms_match_multiplier(
        cumulative_mean_square: Tensor<Self, 2>,
        detail_mean_square: Tensor<Self, 2>,
        gamma: f64,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let (multiplier, matched) = rms_match_multiplier(
            &cube_tensor(cumulative_mean_square),
            &cube_tensor(detail_mean_square),
            gamma,
            epsilon,
        );
        (from_primitive(multiplier), from_primitive(matched))
    }

    /// One launch : both sums, their mean squares and the multiplier.
    fn pair_write<const D: usize>(
        cumulative: Tensor<Self, D>,
        detail: Option<Tensor<Self, D>>,
        term: Tensor<Self, D>,
        sign: f64,
        matching: RmsMatching,
    ) -> PairWrite<Self, D> {
        let shape = cumulative.dims();
        let d_model = shape[D - 1];
        let tokens = cumulative.shape().num_elements() / d_model;
        let rows = |tensor: Tensor<Self, D>| cube_tensor(tensor.reshape([tokens, d_model]));
        let pair = pair_write(
            &rows(cumulative),
            detail.map(rows).as_ref(),
            &rows(term),
            sign,
            matching.gamma,
            matching.epsilon,
        );
        let mut column_shape = shape;
        column_shape[D - 1] = 1;
        let full = |tensor| from_primitive::<Self, 2>(tensor).reshape(shape);
        let column = |tensor| from_primitive::<Self, 2>(tensor).reshape(column_shape);
        let (cumulative, cumulative_mean_square) = pair.cumulative;
        PairWrite {
            cumulative: full(cumulative),
            cumulative_mean_square: column(cumulative_mean_square),
            detail: pair
                .detail
                .map(|(detail, mean_square)| (full(detail), column(mean_square))),
            multiplier: column(pair.multiplier),
            matched_mean_square: column(pair.matched),
        }
    }
}

/// eq:rmsmatch's multiplier `a = clip(√m_C / (√m_D + ε), 1/γ, γ)` and the matched mean square
/// `m_D · a²` per token, from `[tokens, 1]` mean squares.
fn rms_match_multiplier<R: CubeRuntime>(
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
/// elements it writes, the cube adding the threads' sums as every row kernel does
/// (`cube_shared::kernels::reduce`).
fn signed_sum_with_mean_square<R: CubeRuntime>(
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
        plane_reduction(&client, ROW_THREADS),
        sum.dtype.into(),
    );
    (output, mean_square)
}

/// What [`pair_write`] forms: the new cumulative sum and its mean square, the new detail and its
/// mean square where the detail is a tensor of its own, the multiplier and the matched mean square.
struct PairRows<R: CubeRuntime> {
    pub cumulative: (CubeTensor<R>, CubeTensor<R>),
    pub detail: Option<(CubeTensor<R>, CubeTensor<R>)>,
    pub multiplier: CubeTensor<R>,
    pub matched: CubeTensor<R>,
}

/// [`RoutingBackend::pair_write`](super::RoutingBackend::pair_write) on `[tokens, d]` rows in one
/// launch: one cube per token forms `C + u` (and `D + s·u`) as [`signed_sum_with_mean_square`]
/// does, each sum's mean square, and from them the multiplier as [`rms_match_multiplier`] does.
fn pair_write<R: CubeRuntime>(
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
        plane_reduction(&client, ROW_THREADS),
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
pub(in crate::ops) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::cube_total;

    /// One cube per token `n`: `output[n, k] = sum[n, k] + sign · term[n, k]` for each thread's
    /// `k` (exactly `sum + term` and `sum − term` for the signs ±1), then
    /// `mean_square[n] = Σ_k output[n, k]² / d` from the threads' partial sums in shared memory.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::ops) fn signed_sum_with_mean_square_kernel<F: Float>(
        sum: &Tensor<F>,
        term: &Tensor<F>,
        output: &mut Tensor<F>,
        mean_square: &mut Tensor<F>,
        sign: f32,
        #[comptime] threads: usize,
        #[comptime] planes: bool,
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
        let squares = cube_total::<F>(&mut partials, lane, squares, threads, false, planes);
        if lane == 0 {
            mean_square[token * mean_square.stride(0)] = squares / F::cast_from(d_model);
        }
    }

    /// One token's multiplier per thread, [`matching_multiplier`], then `m_D` times its square.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::ops) fn rms_match_multiplier_kernel<F: Float>(
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
    pub(in crate::ops) fn pair_write_kernel<F: Float>(
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
        #[comptime] planes: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let token = CUBE_POS;
        if token >= cumulative_out.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let d_model = cumulative_out.shape(1);
        let mut partials = SharedMemory::<F>::new(threads);
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
        let cumulative_squares = cube_total::<F>(
            &mut partials,
            lane,
            cumulative_squares,
            threads,
            false,
            planes,
        );
        if comptime![own_detail] {
            detail_squares =
                cube_total::<F>(&mut partials, lane, detail_squares, threads, false, planes);
        }
        if lane == 0 {
            let cumulative_mean = cumulative_squares / F::cast_from(d_model);
            cumulative_mean_square[token * cumulative_mean_square.stride(0)] = cumulative_mean;
            let mut detail_mean = cumulative_mean;
            if comptime![own_detail] {
                detail_mean = detail_squares / F::cast_from(d_model);
                detail_mean_square[token * detail_mean_square.stride(0)] = detail_mean;
            }
            let clamped =
                matching_multiplier::<F>(cumulative_mean, detail_mean, low, high, epsilon);
            multiplier[token * multiplier.stride(0)] = clamped;
            matched[token * matched.stride(0)] = detail_mean * (clamped * clamped);
        }
    }
}
