//! The weighted cross-entropy of the tied head's logits as CubeCL kernels: one cube per row of
//! logits, its threads striding over the vocabulary, the row's maximum and sum reduced in shared
//! memory. The forward pass is one launch (each row's loss and log-sum-exp), the backward pass one
//! (`∂x = g w (softmax(x) − onehot)`), where Burn's `log_softmax`, `gather` and the weighting
//! launch about two dozen kernels in both directions (a training step's launches outside its layers
//! fell from 45 to 23 with these two; docs/benchmarks.md). The training loss's sum over rows is one
//! more launch of one cube ([`CrossEntropyBackend::loss_total`]), in place of Burn's reduction.

use burn::tensor::{Int, Tensor};
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::CrossEntropyBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{
    ROW_THREADS, empty_like, empty_shaped, per_row, plane_reduction, primitive,
};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
/// Each row's weighted loss and its log-sum-exp.
type LossesAndSums<R, F, I, BT> = (Tensor<Cube<R, F, I, BT>, 1>, Tensor<Cube<R, F, I, BT>, 1>);

impl<R, F, I, BT> CrossEntropyBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn fuses_cross_entropy() -> bool {
        true
    }

    fn cross_entropy_forward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> (Tensor<Self, 1>, Tensor<Self, 1>) {
        cross_entropy_forward(logits, targets, weights)
    }

    fn cross_entropy_backward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
        logsumexp: Tensor<Self, 1>,
        grad: Tensor<Self, 1>,
    ) -> Tensor<Self, 2> {
        cross_entropy_backward(logits, targets, weights, logsumexp, grad)
    }

    fn loss_total(losses: Tensor<Self, 1>) -> Tensor<Self, 1> {
        loss_total(losses)
    }
}

/// Threads of the one cube that sums the losses: a step's 8,192 rows are 32 a thread.
pub(super) const TOTAL_THREADS: usize = 256;

/// [`CrossEntropyBackend::loss_total`] in one launch of one cube: `[rows]` to `[1]`, in an order
/// fixed for a given row count and device (the same from run to run).
fn loss_total<R, F, I, BT>(losses: Tensor<Cube<R, F, I, BT>, 1>) -> Tensor<Cube<R, F, I, BT>, 1>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let losses = primitive(losses);
    let total = empty_shaped(&losses, vec![1]);
    kernels::loss_total_kernel::launch::<R>(
        &losses.client.clone(),
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(TOTAL_THREADS as u32),
        losses.clone().into_tensor_arg(),
        total.clone().into_tensor_arg(),
        TOTAL_THREADS,
        plane_reduction(&losses.client, TOTAL_THREADS),
        losses.dtype.into(),
    );
    from_primitive(total)
}

/// [`CrossEntropyBackend::cross_entropy_forward`]
/// in one launch: each row's weighted loss and its log-sum-exp, both `[rows]`.
fn cross_entropy_forward<R, F, I, BT>(
    logits: Tensor<Cube<R, F, I, BT>, 2>,
    targets: Tensor<Cube<R, F, I, BT>, 1, Int>,
    weights: Tensor<Cube<R, F, I, BT>, 1>,
) -> LossesAndSums<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (logits, weights) = (primitive(logits), primitive(weights));
    let targets = targets.into_primitive();
    let (losses, logsumexp) = (empty_like(&weights), empty_like(&weights));
    let (cube_count, cube_dim) = per_row(&logits);
    kernels::cross_entropy_kernel::launch::<R>(
        &logits.client.clone(),
        cube_count,
        cube_dim,
        logits.clone().into_tensor_arg(),
        targets.clone().into_tensor_arg(),
        weights.into_tensor_arg(),
        losses.clone().into_tensor_arg(),
        logsumexp.clone().into_tensor_arg(),
        ROW_THREADS,
        plane_reduction(&logits.client, ROW_THREADS),
        [logits.dtype.into(), targets.dtype.into()],
    );
    (from_primitive(losses), from_primitive(logsumexp))
}

/// [`CrossEntropyBackend::cross_entropy_backward`]
/// in one launch.
fn cross_entropy_backward<R, F, I, BT>(
    logits: Tensor<Cube<R, F, I, BT>, 2>,
    targets: Tensor<Cube<R, F, I, BT>, 1, Int>,
    weights: Tensor<Cube<R, F, I, BT>, 1>,
    logsumexp: Tensor<Cube<R, F, I, BT>, 1>,
    grad: Tensor<Cube<R, F, I, BT>, 1>,
) -> Tensor<Cube<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (logits, weights) = (primitive(logits), primitive(weights));
    let (logsumexp, grad) = (primitive(logsumexp), primitive(grad));
    let targets = targets.into_primitive();
    let logits_grad = empty_like(&logits);
    let (cube_count, cube_dim) = per_row(&logits);
    kernels::cross_entropy_backward_kernel::launch::<R>(
        &logits.client.clone(),
        cube_count,
        cube_dim,
        logits.clone().into_tensor_arg(),
        targets.clone().into_tensor_arg(),
        weights.into_tensor_arg(),
        logsumexp.into_tensor_arg(),
        grad.into_tensor_arg(),
        logits_grad.clone().into_tensor_arg(),
        ROW_THREADS,
        [logits.dtype.into(), targets.dtype.into()],
    );
    from_primitive(logits_grad)
}

pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::cube_total;

    /// Element `k` of row `row` of the `[rows, vocab]` `logits`, through its strides.
    #[cube]
    fn logit<F: Float>(logits: &Tensor<F>, row: usize, k: usize) -> F {
        logits[row * logits.stride(0) + k * logits.stride(1)]
    }

    /// Row `row`'s target as an index; an id outside the vocabulary reads as the last entry, so
    /// that no thread reads past the row (prepared shards refuse such ids when they are written,
    /// and the embedding reads every input id before the loss does).
    #[cube]
    fn target_of<I: Int>(targets: &Tensor<I>, row: usize, vocab: usize) -> usize {
        let target = usize::cast_from(targets[row * targets.stride(0)]);
        if target < vocab { target } else { vocab - 1 }
    }

    /// `lse = max + ln Σ e^{x − max}` and `loss = w (lse − x_target)` per row, one cube per row.
    #[cube(launch)]
    pub(in crate::ops) fn cross_entropy_kernel<F: Float, I: Int>(
        logits: &Tensor<F>,
        targets: &Tensor<I>,
        weights: &Tensor<F>,
        losses: &mut Tensor<F>,
        logsumexp: &mut Tensor<F>,
        #[comptime] threads: usize,
        #[comptime] planes: bool,
        #[define(F, I)] _dtypes: [StorageType; 2],
    ) {
        let (rows, vocab) = (logits.shape(0), logits.shape(1));
        let row = CUBE_POS;
        if row >= rows {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let mut partials = SharedMemory::<F>::new(threads);
        let mut most = logit(logits, row, 0);
        let mut k = lane;
        while k < vocab {
            let x = logit(logits, row, k);
            if x > most {
                most = x;
            }
            k += threads;
        }
        let row_max = cube_total::<F>(&mut partials, lane, most, threads, true, planes);
        let mut sum = F::new(0.0);
        k = lane;
        while k < vocab {
            sum += (logit(logits, row, k) - row_max).exp();
            k += threads;
        }
        let row_sum = cube_total::<F>(&mut partials, lane, sum, threads, false, planes);
        if lane == 0 {
            let lse = row_max + row_sum.ln();
            let target = logit(logits, row, target_of(targets, row, vocab));
            losses[row] = weights[row * weights.stride(0)] * (lse - target);
            logsumexp[row] = lse;
        }
    }

    /// `∂x_k = g w (e^{x_k − lse} − [k = target])` per row, one cube per row.
    #[cube(launch)]
    pub(in crate::ops) fn cross_entropy_backward_kernel<F: Float, I: Int>(
        logits: &Tensor<F>,
        targets: &Tensor<I>,
        weights: &Tensor<F>,
        logsumexp: &Tensor<F>,
        grad: &Tensor<F>,
        logits_grad: &mut Tensor<F>,
        #[comptime] threads: usize,
        #[define(F, I)] _dtypes: [StorageType; 2],
    ) {
        let (rows, vocab) = (logits.shape(0), logits.shape(1));
        let row = CUBE_POS;
        if row >= rows {
            terminate!();
        }
        let scale = grad[row * grad.stride(0)] * weights[row * weights.stride(0)];
        let lse = logsumexp[row * logsumexp.stride(0)];
        let target = target_of(targets, row, vocab);
        let mut k = UNIT_POS_X as usize;
        while k < vocab {
            let mut p = (logit(logits, row, k) - lse).exp();
            if k == target {
                p -= F::new(1.0);
            }
            logits_grad[row * vocab + k] = scale * p;
            k += threads;
        }
    }

    /// `total[0] = Σ_r losses[r]`, one cube: each thread sums every `threads`-th row, then the
    /// cube adds the threads' sums ([`cube_total`]).
    #[cube(launch)]
    pub(in crate::ops) fn loss_total_kernel<F: Float>(
        losses: &Tensor<F>,
        total: &mut Tensor<F>,
        #[comptime] threads: usize,
        #[comptime] planes: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let lane = UNIT_POS_X as usize;
        let mut partials = SharedMemory::<F>::new(threads);
        let mut sum = F::new(0.0);
        let mut row = lane;
        while row < losses.shape(0) {
            sum += losses[row * losses.stride(0)];
            row += threads;
        }
        let sum = cube_total::<F>(&mut partials, lane, sum, threads, false, planes);
        if lane == 0 {
            total[0] = sum;
        }
    }
}
