//! RMSNorm with its gain as CubeCL kernels: one cube per row, its threads striding over the width,
//! the row's sums reduced in shared memory. The forward pass is one launch; the backward pass is
//! one launch for `∂x` and each row's share of `∂w`, and one sum over the rows for `∂w` (a
//! reduction across cubes, which Burn's own sum does well).

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::NormBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{ROW_THREADS, empty_like, per_row, primitive};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
/// `(∂x, ∂w)`.
type InputAndGainGrads<R, F, I, BT> = (Tensor<Cube<R, F, I, BT>, 2>, Tensor<Cube<R, F, I, BT>, 1>);

impl<R, F, I, BT> NormBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        rms_norm(x, weight, epsilon)
    }

    fn rms_norm_backward(
        x: Tensor<Self, 2>,
        weight: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        rms_norm_backward(x, weight, grad, epsilon)
    }
}

/// [`NormBackend::rms_norm`] in one launch.
fn rms_norm<R, F, I, BT>(
    x: Tensor<Cube<R, F, I, BT>, 2>,
    weight: Tensor<Cube<R, F, I, BT>, 1>,
    epsilon: f64,
) -> Tensor<Cube<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (x, weight) = (primitive(x), primitive(weight));
    let output = empty_like(&x);
    let (cube_count, cube_dim) = per_row(&output);
    kernels::rms_norm_kernel::launch::<R>(
        &x.client.clone(),
        cube_count,
        cube_dim,
        x.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        epsilon as f32,
        ROW_THREADS,
        x.dtype.into(),
    );
    from_primitive(output)
}

/// [`NormBackend::rms_norm_backward`]: one
/// launch for `∂x` and the rows' shares of `∂w`, then their sum.
fn rms_norm_backward<R, F, I, BT>(
    x: Tensor<Cube<R, F, I, BT>, 2>,
    weight: Tensor<Cube<R, F, I, BT>, 1>,
    grad: Tensor<Cube<R, F, I, BT>, 2>,
    epsilon: f64,
) -> InputAndGainGrads<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let d = weight.dims()[0];
    let (x, weight, grad) = (primitive(x), primitive(weight), primitive(grad));
    let (x_grad, weight_shares) = (empty_like(&x), empty_like(&x));
    let (cube_count, cube_dim) = per_row(&x_grad);
    kernels::rms_norm_backward_kernel::launch::<R>(
        &x.client.clone(),
        cube_count,
        cube_dim,
        x.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        grad.into_tensor_arg(),
        x_grad.clone().into_tensor_arg(),
        weight_shares.clone().into_tensor_arg(),
        epsilon as f32,
        ROW_THREADS,
        x.dtype.into(),
    );
    let weight_shares: Tensor<Cube<R, F, I, BT>, 2> = from_primitive(weight_shares);
    (
        from_primitive(x_grad),
        weight_shares.sum_dim(0).reshape([d]),
    )
}

pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::{reduce, strided};

    /// `rms = sqrt(Σ_k x_k² / d + ε)` of row `row` of `[rows, d]` `x`, every thread of the cube
    /// calling it; `partials` is the cube's scratch.
    #[cube]
    fn row_rms<F: Float>(
        x: &Tensor<F>,
        row: usize,
        d: usize,
        epsilon: f32,
        partials: &mut SharedMemory<F>,
        lane: usize,
        #[comptime] threads: usize,
    ) -> F {
        let mut squares = F::new(0.0);
        let mut k = lane;
        while k < d {
            let value = x[strided(x, row * d + k)];
            squares += value * value;
            k += threads;
        }
        partials[lane] = squares;
        reduce(partials, lane, threads, false);
        let total = partials[0];
        sync_cube();
        (total / F::cast_from(d) + F::cast_from(epsilon)).sqrt()
    }

    /// `y = x / rms ⊙ w`, one cube per row.
    #[cube(launch)]
    pub(in crate::ops) fn rms_norm_kernel<F: Float>(
        x: &Tensor<F>,
        weight: &Tensor<F>,
        output: &mut Tensor<F>,
        epsilon: f32,
        #[comptime] threads: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let d = output.shape(1);
        let row = CUBE_POS;
        if row >= output.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let mut partials = SharedMemory::<F>::new(threads);
        let rms = row_rms::<F>(x, row, d, epsilon, &mut partials, lane, threads);
        let mut k = lane;
        while k < d {
            let at = row * d + k;
            output[at] = x[strided(x, at)] / rms * weight[strided(weight, k)];
            k += threads;
        }
    }

    /// `∂x = (∂y⊙w − x̂ mean(∂y⊙w⊙x̂)) / rms` and the row's share of `∂w`, `∂y⊙x̂`, with
    /// `x̂ = x / rms`; one cube per row.
    #[cube(launch)]
    pub(in crate::ops) fn rms_norm_backward_kernel<F: Float>(
        x: &Tensor<F>,
        weight: &Tensor<F>,
        grad: &Tensor<F>,
        x_grad: &mut Tensor<F>,
        weight_shares: &mut Tensor<F>,
        epsilon: f32,
        #[comptime] threads: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let d = x_grad.shape(1);
        let row = CUBE_POS;
        if row >= x_grad.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let mut partials = SharedMemory::<F>::new(threads);
        let rms = row_rms::<F>(x, row, d, epsilon, &mut partials, lane, threads);
        let mut dot = F::new(0.0);
        let mut k = lane;
        while k < d {
            let at = row * d + k;
            let normed = x[strided(x, at)] / rms;
            dot += grad[strided(grad, at)] * weight[strided(weight, k)] * normed;
            k += threads;
        }
        partials[lane] = dot;
        reduce(&mut partials, lane, threads, false);
        let along_row = partials[0] / F::cast_from(d);
        k = lane;
        while k < d {
            let at = row * d + k;
            let normed = x[strided(x, at)] / rms;
            let dy = grad[strided(grad, at)];
            x_grad[at] = (dy * weight[strided(weight, k)] - normed * along_row) / rms;
            weight_shares[at] = dy * normed;
            k += threads;
        }
    }
}
