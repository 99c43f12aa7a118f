//! A source's write on Burn's autodiff backend: the signed sum and a mean square as one graph node
//! each, whose backward passes add into the gradient the operand has accumulated so far
//! ([`take_accumulated`]) in the pass that forms their share; RMS matching's multiplier a
//! constant and the matched mean square a node of its own.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use crate::autodiff_node::{finish, from_primitive, primitive};

use super::{PairWrite, RmsMatching, SourceWriteBackend};
use crate::ops::routing::autodiff_slots::{register, take_accumulated};

impl<B: SourceWriteBackend, C: CheckpointStrategy> SourceWriteBackend for Autodiff<B, C> {
    fn row_mean_square(rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        mean_square_node(rows)
    }

    /// The inner backend's values: the multiplier untracked (no graph for a constant), the
    /// matched mean square a node whose backward pass gives `m_D` the gradient times `a²`.
    fn rms_match_multiplier(
        cumulative_mean_square: Tensor<Self, 2>,
        detail_mean_square: Tensor<Self, 2>,
        gamma: f64,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let parents = [primitive(detail_mean_square.clone())];
        let (multiplier, matched) = crate::op_times::forward(module_path!(), || {
            B::rms_match_multiplier(
                cumulative_mean_square.inner(),
                detail_mean_square.inner(),
                gamma,
                epsilon,
            )
        });
        let matched = finish(
            MatchedMeanSquareBackward::<2>,
            parents,
            multiplier.clone(),
            matched,
        );
        (Tensor::from_inner(multiplier), matched)
    }

    fn signed_sum<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> Tensor<Self, D> {
        let output = crate::op_times::forward(module_path!(), || {
            B::signed_sum(sum.clone().inner(), term.clone().inner(), sign)
        });
        signed_sum_node(&sum, &term, sign, output)
    }

    /// The sum as [`signed_sum`](SourceWriteBackend::signed_sum)'s node, and the inner backend's
    /// mean square as a node over the sum.
    fn signed_sum_with_mean_square<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        let (output, mean_square) = crate::op_times::forward(module_path!(), || {
            B::signed_sum_with_mean_square(sum.clone().inner(), term.clone().inner(), sign)
        });
        let node = signed_sum_node(&sum, &term, sign, output.clone());
        let mean_square = mean_square.map(|mean_square| mean_square_of(&node, output, mean_square));
        (node, mean_square)
    }

    /// The inner backend's values (one launch on the cube backends) with the nodes of the
    /// operations they replace: each sum's, each mean square's over its sum, and the matched
    /// mean square's; the multiplier untracked.
    fn pair_write<const D: usize>(
        cumulative: Tensor<Self, D>,
        detail: Option<Tensor<Self, D>>,
        term: Tensor<Self, D>,
        sign: f64,
        matching: RmsMatching,
    ) -> PairWrite<Self, D> {
        let inner = crate::op_times::forward(module_path!(), || {
            B::pair_write(
                cumulative.clone().inner(),
                detail.clone().map(Tensor::inner),
                term.clone().inner(),
                sign,
                matching,
            )
        });
        let tracked = |base: &Tensor<Self, D>, sign: f64, (sum, mean_square): (Tensor<B, D>, _)| {
            let node = signed_sum_node(base, &term, sign, sum.clone());
            let mean_square = mean_square_of(&node, sum, mean_square);
            (node, mean_square)
        };
        let (cumulative, cumulative_mean_square) = tracked(
            &cumulative,
            1.0,
            (inner.cumulative, inner.cumulative_mean_square),
        );
        let detail = detail
            .zip(inner.detail)
            .map(|(base, sum)| tracked(&base, sign, sum));
        let detail_mean_square = detail
            .as_ref()
            .map_or(&cumulative_mean_square, |(_, mean_square)| mean_square);
        let parents = [primitive(detail_mean_square.clone())];
        let matched_mean_square = finish(
            MatchedMeanSquareBackward::<D>,
            parents,
            inner.multiplier.clone(),
            inner.matched_mean_square,
        );
        PairWrite {
            cumulative,
            cumulative_mean_square,
            detail,
            multiplier: Tensor::from_inner(inner.multiplier),
            matched_mean_square,
        }
    }
}

/// The backward pass of a mean square over the last dimension,
/// [`SourceWriteBackend::row_mean_square_backward`] on the tensor's token rows.
#[derive(Debug)]
struct MeanSquareBackward<const D: usize>;

impl<B: SourceWriteBackend, const D: usize> Backward<B, 1> for MeanSquareBackward<D> {
    /// The tensor whose mean square was taken.
    type State = Tensor<B, D>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let into = take_accumulated(grads, &ops, 1, &grad).pop().flatten();
        let shape = ops.state.dims();
        let d_model = shape[D - 1];
        let tokens = ops.state.shape().num_elements() / d_model;
        let rows = |tensor: Tensor<B, D>| tensor.reshape([tokens, d_model]);
        let value =
            B::row_mean_square_backward(into.map(rows), grad.reshape([tokens, 1]), rows(ops.state));
        let parents = ops.parents.map(|parent| parent.map(|node| node.id));
        register(grads, &parents, vec![Some(value.reshape(shape))]);
    }
}

fn mean_square_node<B: SourceWriteBackend, C: CheckpointStrategy>(
    rows: Tensor<Autodiff<B, C>, 2>,
) -> Tensor<Autodiff<B, C>, 2> {
    let inner_rows = rows.clone().inner();
    let output =
        crate::op_times::forward(module_path!(), || B::row_mean_square(inner_rows.clone()));
    mean_square_of(&rows, inner_rows, output)
}

/// The node of `sum + sign · term` over the inner backend's `output`.
fn signed_sum_node<B: SourceWriteBackend, C: CheckpointStrategy, const D: usize>(
    sum: &Tensor<Autodiff<B, C>, D>,
    term: &Tensor<Autodiff<B, C>, D>,
    sign: f64,
    output: Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D> {
    let parents = [primitive(term.clone()), primitive(sum.clone())];
    finish(SignedSumBackward::<D>, parents, sign, output)
}

/// The node of the mean square over the last dimension of `node`, whose inner value is `value`,
/// over the inner backend's `mean_square`.
fn mean_square_of<B: SourceWriteBackend, C: CheckpointStrategy, const D: usize>(
    node: &Tensor<Autodiff<B, C>, D>,
    value: Tensor<B, D>,
    mean_square: Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D> {
    finish(
        MeanSquareBackward::<D>,
        [primitive(node.clone())],
        value,
        mean_square,
    )
}

/// The backward pass of the matched mean square `m_D · a²` of
/// [`SourceWriteBackend::rms_match_multiplier`]: `∂m_D = g · a²`, as the product's backward pass
/// forms it (`a²` rounded first). It runs only where a gradient reaches it (a read that does not
/// fold mean squares).
#[derive(Debug)]
struct MatchedMeanSquareBackward<const D: usize>;

impl<B: SourceWriteBackend, const D: usize> Backward<B, 1> for MatchedMeanSquareBackward<D> {
    /// The multiplier `a`.
    type State = Tensor<B, D>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let square = ops.state.clone() * ops.state;
        let parents = ops.parents.map(|parent| parent.map(|node| node.id));
        register(grads, &parents, vec![Some(grad * square)]);
    }
}

/// The backward pass of [`SourceWriteBackend::signed_sum`]; its parents are `[term, sum]`.
#[derive(Debug)]
struct SignedSumBackward<const D: usize>;

impl<B: SourceWriteBackend, const D: usize> Backward<B, 2> for SignedSumBackward<D> {
    /// The sign.
    type State = f64;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let sign = ops.state;
        let accumulated = take_accumulated(grads, &ops, 1, &grad).pop().flatten();
        let parents = ops.parents.map(|parent| parent.map(|node| node.id));
        let term = parents[0].map(|_| match accumulated {
            Some(accumulated) => B::signed_sum(accumulated, grad.clone(), sign),
            None if sign == 1.0 => grad.clone(),
            None => grad.clone().mul_scalar(sign),
        });
        register(grads, &parents, vec![term, Some(grad)]);
    }
}
