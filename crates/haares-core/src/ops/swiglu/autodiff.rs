//! SwiGLU on Burn's autodiff backend: one graph node each way, on separate halves and on a
//! packed projection, whose backward pass is the inner backend's.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::SwigluBackend;
use crate::autodiff_node::{finish, from_primitive, primitive, register};

impl<B: SwigluBackend, C: CheckpointStrategy> SwigluBackend for Autodiff<B, C> {
    fn swiglu<const D: usize>(gate: Tensor<Self, D>, up: Tensor<Self, D>) -> Tensor<Self, D> {
        let parents = [primitive(gate.clone()), primitive(up.clone())];
        let (gate, up) = (gate.inner(), up.inner());
        let output =
            crate::op_times::forward(module_path!(), || B::swiglu(gate.clone(), up.clone()));
        finish(SwiGluBackward::<D>, parents, (gate, up), output)
    }

    fn swiglu_packed(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let parents = [primitive(gate_up.clone())];
        let gate_up = gate_up.inner();
        let output = crate::op_times::forward(module_path!(), || B::swiglu_packed(gate_up.clone()));
        finish(SwiGluPackedBackward, parents, gate_up, output)
    }
}

#[derive(Debug)]
struct SwiGluBackward<const D: usize>;

impl<B: SwigluBackend, const D: usize> Backward<B, 2> for SwiGluBackward<D> {
    /// The gate and up projections.
    type State = (Tensor<B, D>, Tensor<B, D>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let (gate, up) = ops.state.clone();
        let (gate_grad, up_grad) = B::swiglu_backward(gate, up, grad);
        register(grads, &ops, 0, gate_grad);
        register(grads, &ops, 1, up_grad);
    }
}

#[derive(Debug)]
struct SwiGluPackedBackward;

impl<B: SwigluBackend> Backward<B, 1> for SwiGluPackedBackward {
    /// The packed projection.
    type State = Tensor<B, 2>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let gate_up_grad = B::swiglu_packed_backward(ops.state.clone(), grad);
        register(grads, &ops, 0, gate_up_grad);
    }
}
