//! The weighted cross-entropy on Burn's autodiff backend: where the inner backend fuses it, one
//! graph node with the logits as its parent; elsewhere the plain operations.

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
        if !B::fuses_cross_entropy() {
            return naive::cross_entropy(logits, targets, weights);
        }
        let parents = [primitive(logits.clone())];
        let (logits, targets, weights) = (logits.inner(), targets.inner(), weights.inner());
        let (losses, logsumexp) = crate::op_times::forward(module_path!(), || {
            B::cross_entropy_forward(logits.clone(), targets.clone(), weights.clone())
        });
        let state = (logits, targets, weights, logsumexp);
        finish(CrossEntropyBackward, parents, state, losses)
    }

    fn fuses_cross_entropy() -> bool {
        B::fuses_cross_entropy()
    }
}

/// The fused cross-entropy's node: the logits are its one parent (the targets and weights are
/// data); it keeps them and each row's log-sum-exp.
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: CrossEntropyBackend> Backward<B, 1> for CrossEntropyBackward {
    /// The logits, targets and weights, and each row's log-sum-exp.
    type State = (Tensor<B, 2>, Tensor<B, 1, Int>, Tensor<B, 1>, Tensor<B, 1>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let (logits, targets, weights, logsumexp) = ops.state.clone();
        let logits_grad = B::cross_entropy_backward(logits, targets, weights, logsumexp, grad);
        register(grads, &ops, 0, logits_grad);
    }
}
