//! The weighted cross-entropy on Burn's autodiff backend: where the inner backend fuses it, one
//! graph node with the logits as its parent (for the rows' losses or their total); elsewhere the
//! plain operations.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::{Int, Tensor};

use super::{CrossEntropyBackend, naive};
use crate::autodiff_node::{finish, from_primitive, primitive, register};

impl<B: CrossEntropyBackend, C: CheckpointStrategy> CrossEntropyBackend for Autodiff<B, C> {
    fn cross_entropy(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> Tensor<Self, 1> {
        match B::fuses_cross_entropy() {
            true => fused_node(logits, targets, weights, |losses| losses),
            false => naive::cross_entropy(logits, targets, weights),
        }
    }

    fn summed_cross_entropy(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> Tensor<Self, 1> {
        match B::fuses_cross_entropy() {
            true => fused_node(logits, targets, weights, B::loss_total),
            false => naive::loss_total(naive::cross_entropy(logits, targets, weights)),
        }
    }

    fn fuses_cross_entropy() -> bool {
        B::fuses_cross_entropy()
    }
}

/// The fused forward pass as one node whose output is `output` of the rows' losses: the losses
/// themselves, or their total.
fn fused_node<B: CrossEntropyBackend, C: CheckpointStrategy>(
    logits: Tensor<Autodiff<B, C>, 2>,
    targets: Tensor<Autodiff<B, C>, 1, Int>,
    weights: Tensor<Autodiff<B, C>, 1>,
    output: impl FnOnce(Tensor<B, 1>) -> Tensor<B, 1>,
) -> Tensor<Autodiff<B, C>, 1> {
    let parents = [primitive(logits.clone())];
    let (logits, targets, weights) = (logits.inner(), targets.inner(), weights.inner());
    let (result, logsumexp) = crate::op_times::forward(module_path!(), || {
        let (losses, logsumexp) =
            B::cross_entropy_forward(logits.clone(), targets.clone(), weights.clone());
        (output(losses), logsumexp)
    });
    let state = (logits, targets, weights, logsumexp);
    finish(CrossEntropyBackward, parents, state, result)
}

/// The fused cross-entropy's node: the logits are its one parent (the targets and weights are
/// data); it keeps them and each row's log-sum-exp. Its gradient is the rows' (`[rows]`) or the
/// total's (`[1]`), which every row reads (a broadcast view: no copy on the cube backends).
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: CrossEntropyBackend> Backward<B, 1> for CrossEntropyBackward {
    /// The logits, targets and weights, and each row's log-sum-exp.
    type State = (Tensor<B, 2>, Tensor<B, 1, Int>, Tensor<B, 1>, Tensor<B, 1>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, 1> = from_primitive(grads.consume::<B>(&ops.node));
        let (logits, targets, weights, logsumexp) = ops.state.clone();
        let grad = grad.expand([logits.dims()[0]]);
        let logits_grad = B::cross_entropy_backward(logits, targets, weights, logsumexp, grad);
        register(grads, &ops, 0, logits_grad);
    }
}
