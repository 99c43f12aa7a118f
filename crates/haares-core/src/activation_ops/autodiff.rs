//! The fused activations on Burn's autodiff backend: each operation is one graph node whose
//! backward pass is the inner backend's `*_backward` primitive.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::ActivationBackend;
use crate::autodiff_node::{finish, from_primitive, primitive};

impl<B: ActivationBackend, C: CheckpointStrategy> ActivationBackend for Autodiff<B, C> {
    fn swiglu<const D: usize>(gate: Tensor<Self, D>, up: Tensor<Self, D>) -> Tensor<Self, D> {
        let parents = [primitive(gate.clone()), primitive(up.clone())];
        let (gate, up) = (gate.inner(), up.inner());
        let output = B::swiglu(gate.clone(), up.clone());
        finish(SwiGluBackward::<D>, parents, (gate, up), output)
    }

    fn causal_softmax<const D: usize>(scores: Tensor<Self, D>) -> Tensor<Self, D> {
        let parents = [primitive(scores.clone())];
        let output = B::causal_softmax(scores.inner());
        let probabilities = output.clone();
        finish(CausalSoftmaxBackward::<D>, parents, probabilities, output)
    }

    fn swap_heads(x: Tensor<Self, 4>) -> Tensor<Self, 4> {
        let parents = [primitive(x.clone())];
        finish(SwapHeadsBackward, parents, (), B::swap_heads(x.inner()))
    }
}

/// Registers `gradient` for the parent at `position`, when that parent is tracked.
fn register<B: Backend, S, const N: usize, const D: usize>(
    grads: &mut Gradients,
    ops: &Ops<S, N>,
    position: usize,
    gradient: Tensor<B, D>,
) {
    if let Some(parent) = &ops.parents[position] {
        grads.register::<B>(parent.id, gradient.into_primitive().tensor());
    }
}

#[derive(Debug)]
struct SwiGluBackward<const D: usize>;

impl<B: ActivationBackend, const D: usize> Backward<B, 2> for SwiGluBackward<D> {
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
struct CausalSoftmaxBackward<const D: usize>;

impl<B: ActivationBackend, const D: usize> Backward<B, 1> for CausalSoftmaxBackward<D> {
    /// The softmax's output.
    type State = Tensor<B, D>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let scores_grad = B::causal_softmax_backward(ops.state.clone(), grad);
        register(grads, &ops, 0, scores_grad);
    }
}

#[derive(Debug)]
struct SwapHeadsBackward;

impl<B: ActivationBackend> Backward<B, 1> for SwapHeadsBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        register(grads, &ops, 0, B::swap_heads(grad));
    }
}
