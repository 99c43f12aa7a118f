//! The matrix products on Burn's autodiff backend: one graph node each, whose backward pass is
//! two more products, each operand kept only for the other's gradient.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::MatmulBackend;
use crate::autodiff_node::{finish, from_primitive, primitive, register};
use crate::op_times::ProductShape;

impl<B: MatmulBackend, C: CheckpointStrategy> MatmulBackend for Autodiff<B, C> {
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        let width = rhs.dims()[D - 1];
        product_node(MatmulBackward::<D>, lhs, rhs, width, B::matmul)
    }

    fn matmul_transposed_rhs<const D: usize>(
        lhs: Tensor<Self, D>,
        rhs: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        let width = rhs.dims()[D - 2];
        product_node(
            MatmulTransposedRhsBackward::<D>,
            lhs,
            rhs,
            width,
            B::matmul_transposed_rhs,
        )
    }

    fn product_kernels() -> String {
        B::product_kernels()
    }
}

/// The node of a product of two operands, `forward` on the inner backend, `width` columns wide.
/// `∂A` needs `B` and `∂B` needs `A`: an operand is kept only for the other's gradient.
fn product_node<B, C, T, const D: usize>(
    backward: T,
    lhs: Tensor<Autodiff<B, C>, D>,
    rhs: Tensor<Autodiff<B, C>, D>,
    width: usize,
    forward: impl FnOnce(Tensor<B, D>, Tensor<B, D>) -> Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D>
where
    B: MatmulBackend,
    C: CheckpointStrategy,
    T: Backward<B, 2, State = (Option<Tensor<B, D>>, Option<Tensor<B, D>>)>,
{
    let parents = [primitive(lhs.clone()), primitive(rhs.clone())];
    let (lhs_tracked, rhs_tracked) = (parents[0].is_tracked(), parents[1].is_tracked());
    let (lhs, rhs) = (lhs.inner(), rhs.inner());
    let output = crate::op_times::forward(module_path!(), || {
        crate::op_times::product(
            (lhs.clone(), rhs.clone()),
            |(lhs, _)| ProductShape::of(lhs.dims(), width),
            |(lhs, rhs)| forward(lhs, rhs),
        )
    });
    let state = (rhs_tracked.then_some(lhs), lhs_tracked.then_some(rhs));
    finish(backward, parents, state, output)
}

#[derive(Debug)]
struct MatmulBackward<const D: usize>;

#[derive(Debug)]
struct MatmulTransposedRhsBackward<const D: usize>;

impl<B: MatmulBackend, const D: usize> Backward<B, 2> for MatmulBackward<D> {
    /// The left operand when the right one is tracked, the right one when the left one is.
    type State = (Option<Tensor<B, D>>, Option<Tensor<B, D>>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let (lhs, rhs) = ops.state.clone();
        let transposed = |x: Tensor<B, D>| x.swap_dims(D - 2, D - 1);
        if let Some(rhs) = rhs.filter(|_| ops.parents[0].is_some()) {
            register(grads, &ops, 0, matmul(grad.clone(), transposed(rhs)));
        }
        if let Some(lhs) = lhs.filter(|_| ops.parents[1].is_some()) {
            register(grads, &ops, 1, matmul(transposed(lhs), grad));
        }
    }
}

impl<B: MatmulBackend, const D: usize> Backward<B, 2> for MatmulTransposedRhsBackward<D> {
    /// As [`MatmulBackward`]'s: each operand kept only for the other's gradient.
    type State = (Option<Tensor<B, D>>, Option<Tensor<B, D>>);

    /// `C = A Bᵀ`: `∂A = ∂C B` and `∂B = ∂Cᵀ A`, both in their operands' layouts.
    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let (lhs, rhs) = ops.state.clone();
        if let Some(rhs) = rhs.filter(|_| ops.parents[0].is_some()) {
            register(grads, &ops, 0, matmul(grad.clone(), rhs));
        }
        if let Some(lhs) = lhs.filter(|_| ops.parents[1].is_some()) {
            register(grads, &ops, 1, matmul(grad.swap_dims(D - 2, D - 1), lhs));
        }
    }
}

/// A backward pass's product on the inner backend, timed by shape while
/// [`crate::op_times`] records.
fn matmul<B: MatmulBackend, const D: usize>(lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
    crate::op_times::product(
        (lhs, rhs),
        |(lhs, rhs)| ProductShape::of(lhs.dims(), rhs.dims()[D - 1]),
        |(lhs, rhs)| B::matmul(lhs, rhs),
    )
}
