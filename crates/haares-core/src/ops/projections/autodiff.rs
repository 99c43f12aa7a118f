//! The packed projections on Burn's autodiff backend: `x [W₁ … W_k]` as one graph node with the
//! input and every weight as parents, whose backward pass is two products and a split.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::ProjectionBackend;
use super::naive;
use crate::autodiff_node::{finish, from_primitive, primitive, register};
use crate::ops::MatmulBackend;

impl<B: ProjectionBackend, C: CheckpointStrategy> ProjectionBackend for Autodiff<B, C> {
    fn packs_projections() -> bool {
        B::packs_projections()
    }

    fn projections(x: Tensor<Self, 2>, weights: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        projections_node(x, weights)
    }
}

type Ad<B, C, const D: usize> = Tensor<Autodiff<B, C>, D>;

/// [`ProjectionBackend::projections`] as one node with the input and every weight as parents,
/// for up to three weights (the backbone's most); more are the plain composition.
fn projections_node<B: ProjectionBackend, C: CheckpointStrategy>(
    x: Ad<B, C, 2>,
    weights: Vec<Ad<B, C, 2>>,
) -> Ad<B, C, 2> {
    match weights.len() {
        1 => projection_node::<B, C, 2>(x, weights),
        2 => projection_node::<B, C, 3>(x, weights),
        3 => projection_node::<B, C, 4>(x, weights),
        _ => Autodiff::<B, C>::matmul(x, naive::concat_columns(weights)),
    }
}

/// The node of `x [W₁ … W_k]` with `P = k + 1` parents. It keeps the input for the weights'
/// gradient and the joined weights for the input's, each only when the other is tracked.
fn projection_node<B: ProjectionBackend, C: CheckpointStrategy, const P: usize>(
    x: Ad<B, C, 2>,
    weights: Vec<Ad<B, C, 2>>,
) -> Ad<B, C, 2> {
    let widths = weights.iter().map(|weight| weight.dims()[1]).collect();
    let operands = std::iter::once(x.clone()).chain(weights.iter().cloned());
    let parents: [_; P] = operands
        .map(primitive)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| unreachable!("one parent per operand"));
    let x_tracked = parents[0].is_tracked();
    let weights_tracked = parents[1..].iter().any(|parent| parent.is_tracked());
    let x = x.inner();
    let (joined, output) = crate::op_times::forward(module_path!(), || {
        let joined = B::concat_columns(weights.into_iter().map(Tensor::inner).collect());
        let output = B::matmul(x.clone(), joined.clone());
        (joined, output)
    });
    let state = (weights_tracked.then_some(x), x_tracked.then_some(joined));
    finish(ProjectionsBackward { widths }, parents, state, output)
}

/// `Y = x W` for `W = [W₁ … W_k]`: `∂x = ∂Y Wᵀ`, and `∂W = xᵀ ∂Y` split into the weights' columns.
#[derive(Debug)]
struct ProjectionsBackward {
    widths: Vec<usize>,
}

impl<B: ProjectionBackend, const P: usize> Backward<B, P> for ProjectionsBackward {
    /// The input when a weight is tracked, the joined weights when the input is.
    type State = (Option<Tensor<B, 2>>, Option<Tensor<B, 2>>);

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, 2> = from_primitive(grads.consume::<B>(&ops.node));
        let (x, joined) = ops.state.clone();
        if let Some(joined) = joined.filter(|_| ops.parents[0].is_some()) {
            register(grads, &ops, 0, B::matmul(grad.clone(), joined.transpose()));
        }
        if let Some(x) = x {
            let whole = B::matmul(x.transpose(), grad);
            for (at, part) in B::split_columns(whole, &self.widths)
                .into_iter()
                .enumerate()
            {
                register(grads, &ops, at + 1, part);
            }
        }
    }
}
