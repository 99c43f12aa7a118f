//! The causal softmax on Burn's autodiff backend: one graph node whose backward pass, the inner
//! backend's, keeps only the output.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::SoftmaxBackend;
use crate::autodiff_node::{finish, from_primitive, primitive, register};

impl<B: SoftmaxBackend, C: CheckpointStrategy> SoftmaxBackend for Autodiff<B, C> {
    fn causal_softmax<const D: usize>(scores: Tensor<Self, D>) -> Tensor<Self, D> {
        let parents = [primitive(scores.clone())];
        let output = crate::op_times::forward(module_path!(), || B::causal_softmax(scores.inner()));
        let probabilities = output.clone();
        finish(CausalSoftmaxBackward::<D>, parents, probabilities, output)
    }
}

#[derive(Debug)]
struct CausalSoftmaxBackward<const D: usize>;

impl<B: SoftmaxBackend, const D: usize> Backward<B, 1> for CausalSoftmaxBackward<D> {
    /// The softmax's output.
    type State = Tensor<B, D>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let scores_grad = B::causal_softmax_backward(ops.state.clone(), grad);
        register(grads, &ops, 0, scores_grad);
    }
}
