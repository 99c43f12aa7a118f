//! The causal softmax of the plain attention path as one CubeCL kernel per direction: one cube per
//! query row, its threads striding over the keys the query may see, with the row's maximum, sum or
//! dot product reduced in shared memory.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::SoftmaxBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{ROW_THREADS, empty_like, per_row, plane_reduction, primitive};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

impl<R, F, I, BT> SoftmaxBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn causal_softmax<const D: usize>(scores: Tensor<Self, D>) -> Tensor<Self, D> {
        causal_softmax(scores)
    }

    fn causal_softmax_backward<const D: usize>(
        probabilities: Tensor<Self, D>,
        grad: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        causal_softmax_backward(probabilities, grad)
    }
}

/// [`SoftmaxBackend::causal_softmax`] in one launch.
fn causal_softmax<R, F, I, BT, const D: usize>(
    scores: Tensor<Cube<R, F, I, BT>, D>,
) -> Tensor<Cube<R, F, I, BT>, D>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let dims = scores.dims();
    assert_eq!(
        dims[D - 2],
        dims[D - 1],
        "causal softmax: scores must be square, got {dims:?}"
    );
    let scores = primitive(scores);
    let output = empty_like(&scores);
    let (cube_count, cube_dim) = per_row(&output);
    kernels::causal_softmax_kernel::launch::<R>(
        &scores.client.clone(),
        cube_count,
        cube_dim,
        scores.clone().into_tensor_arg(),
        output.clone().into_tensor_arg(),
        ROW_THREADS,
        plane_reduction(&scores.client, ROW_THREADS),
        scores.dtype.into(),
    );
    from_primitive(output)
}

/// [`SoftmaxBackend::causal_softmax_backward`]
/// in one launch.
fn causal_softmax_backward<R, F, I, BT, const D: usize>(
    probabilities: Tensor<Cube<R, F, I, BT>, D>,
    grad: Tensor<Cube<R, F, I, BT>, D>,
) -> Tensor<Cube<R, F, I, BT>, D>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (probabilities, grad) = (primitive(probabilities), primitive(grad));
    let output = empty_like(&probabilities);
    let (cube_count, cube_dim) = per_row(&output);
    kernels::causal_softmax_backward_kernel::launch::<R>(
        &probabilities.client.clone(),
        cube_count,
        cube_dim,
        probabilities.clone().into_tensor_arg(),
        grad.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        ROW_THREADS,
        plane_reduction(&probabilities.client, ROW_THREADS),
        probabilities.dtype.into(),
    );
    from_primitive(output)
}

pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::{cube_total, strided};

    /// Row `r` of the `[rows, seq]` view of `[..., seq, seq]` scores is query `r mod seq`: it sees
    /// keys `0..=r mod seq`. One cube per row: the row's maximum, then `Σ e^{x − max}`, then the
    /// probabilities, zero after the query. An input's row is found once through its strides;
    /// its keys are its last stride apart.
    #[cube(launch)]
    pub(in crate::ops) fn causal_softmax_kernel<F: Float>(
        scores: &Tensor<F>,
        output: &mut Tensor<F>,
        #[comptime] threads: usize,
        #[comptime] planes: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let seq = output.shape(output.rank() - 1);
        let row = CUBE_POS;
        if row * seq >= output.len() {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let visible = row % seq + 1;
        let start = row * seq;
        let (base, step) = (strided(scores, start), scores.stride(scores.rank() - 1));
        let mut partials = SharedMemory::<F>::new(threads);
        // Key 0 is visible to every query: a finite start for the maximum.
        let mut most = scores[base];
        let mut key = lane;
        while key < visible {
            let x = scores[base + key * step];
            if x > most {
                most = x;
            }
            key += threads;
        }
        let row_max = cube_total::<F>(&mut partials, lane, most, threads, true, planes);
        let mut sum = F::new(0.0);
        key = lane;
        while key < visible {
            sum += (scores[base + key * step] - row_max).exp();
            key += threads;
        }
        let row_sum = cube_total::<F>(&mut partials, lane, sum, threads, false, planes);
        key = lane;
        while key < seq {
            let mut p = F::new(0.0);
            if key < visible {
                p = (scores[base + key * step] - row_max).exp() / row_sum;
            }
            output[start + key] = p;
            key += threads;
        }
    }

    /// `∂x = y ⊙ (∂y − Σ_k y_k ∂y_k)` per row, one cube per row (zero where `y` is).
    #[cube(launch)]
    pub(in crate::ops) fn causal_softmax_backward_kernel<F: Float>(
        probabilities: &Tensor<F>,
        grad: &Tensor<F>,
        output: &mut Tensor<F>,
        #[comptime] threads: usize,
        #[comptime] planes: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let seq = output.shape(output.rank() - 1);
        let row = CUBE_POS;
        if row * seq >= output.len() {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let start = row * seq;
        let (y_base, y_step) = (
            strided(probabilities, start),
            probabilities.stride(probabilities.rank() - 1),
        );
        let (dy_base, dy_step) = (strided(grad, start), grad.stride(grad.rank() - 1));
        let mut partials = SharedMemory::<F>::new(threads);
        let mut dot = F::new(0.0);
        let mut key = lane;
        while key < seq {
            dot += probabilities[y_base + key * y_step] * grad[dy_base + key * dy_step];
            key += threads;
        }
        let row_dot = cube_total::<F>(&mut partials, lane, dot, threads, false, planes);
        key = lane;
        while key < seq {
            let y = probabilities[y_base + key * y_step];
            output[start + key] = y * (grad[dy_base + key * dy_step] - row_dot);
            key += threads;
        }
    }
}
