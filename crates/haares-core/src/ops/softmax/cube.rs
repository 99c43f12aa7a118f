//! The causal softmax of the plain attention path as one CubeCL kernel per direction: one cube per
//! query row, its threads striding over the keys the query may see, with the row's maximum, sum or
//! dot product reduced in shared memory.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::SoftmaxBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{ROW_THREADS, empty_like, per_row, primitive};

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
        probabilities.dtype.into(),
    );
    from_primitive(output)
}

pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::{reduce, strided};

    /// Row `r` of the `[rows, seq]` view of `[..., seq, seq]` scores is query `r mod seq`: it sees
    /// keys `0..=r mod seq`. One cube per row: the row's maximum, then `Σ e^{x − max}`, then the
    /// probabilities, zero after the query.
    #[cube(launch)]
    pub(in crate::ops) fn causal_softmax_kernel<F: Float>(
        scores: &Tensor<F>,
        output: &mut Tensor<F>,
        #[comptime] threads: usize,
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
        let mut partials = SharedMemory::<F>::new(threads);
        // Key 0 is visible to every query: a finite start for the maximum.
        let mut most = scores[strided(scores, start)];
        let mut key = lane;
        while key < visible {
            let x = scores[strided(scores, start + key)];
            if x > most {
                most = x;
            }
            key += threads;
        }
        partials[lane] = most;
        reduce(&mut partials, lane, threads, true);
        let row_max = partials[0];
        sync_cube();
        let mut sum = F::new(0.0);
        key = lane;
        while key < visible {
            sum += (scores[strided(scores, start + key)] - row_max).exp();
            key += threads;
        }
        partials[lane] = sum;
        reduce(&mut partials, lane, threads, false);
        let row_sum = partials[0];
        key = lane;
        while key < seq {
            let mut p = F::new(0.0);
            if key < visible {
                p = (scores[strided(scores, start + key)] - row_max).exp() / row_sum;
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
        #[define(F)] _dtype: StorageType,
    ) {
        let seq = output.shape(output.rank() - 1);
        let row = CUBE_POS;
        if row * seq >= output.len() {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let start = row * seq;
        let mut partials = SharedMemory::<F>::new(threads);
        let mut dot = F::new(0.0);
        let mut key = lane;
        while key < seq {
            let index = start + key;
            dot += probabilities[strided(probabilities, index)] * grad[strided(grad, index)];
            key += threads;
        }
        partials[lane] = dot;
        reduce(&mut partials, lane, threads, false);
        let row_dot = partials[0];
        key = lane;
        while key < seq {
            let index = start + key;
            let y = probabilities[strided(probabilities, index)];
            output[index] = y * (grad[strided(grad, index)] - row_dot);
            key += threads;
        }
    }
}
