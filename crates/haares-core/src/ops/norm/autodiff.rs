//! RMSNorm on Burn's autodiff backend: one graph node, the input and the gain its parents, whose
//! backward pass is the inner backend's.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::NormBackend;
use crate::autodiff_node::{finish, from_primitive, primitive, register};

impl<B: NormBackend, C: CheckpointStrategy> NormBackend for Autodiff<B, C> {
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let parents = [primitive(x.clone()), primitive(weight.clone())];
        let (x, weight) = (x.inner(), weight.inner());
        let output = crate::op_times::forward(module_path!(), || {
            B::rms_norm(x.clone(), weight.clone(), epsilon)
        });
        finish(RmsNormBackward { epsilon }, parents, (x, weight), output)
    }
}

#[derive(Debug)]
struct RmsNormBackward {
    epsilon: f64,
}

impl<B: NormBackend> Backward<B, 2> for RmsNormBackward {
    /// The input and the gain.
    type State = (Tensor<B, 2>, Tensor<B, 1>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let (x, weight) = ops.state.clone();
        let (x_grad, weight_grad) = B::rms_norm_backward(x, weight, grad, self.epsilon);
        register(grads, &ops, 0, x_grad);
        register(grads, &ops, 1, weight_grad);
    }
}
