//! RoPE on Burn's autodiff backend: one graph node whose backward pass turns the gradient back
//! (the inner backend's).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::RotaryBackend;
use crate::autodiff_node::{finish, from_primitive, primitive, register};

impl<B: RotaryBackend, C: CheckpointStrategy> RotaryBackend for Autodiff<B, C> {
    fn rotary(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        let parents = [primitive(x.clone())];
        let tables = (cos.inner(), sin.inner(), quarter_turn.inner());
        let (cos, sin, turn) = tables.clone();
        let output = crate::op_times::forward(module_path!(), || {
            B::rotary(x.inner(), cos, sin, turn, scale)
        });
        finish(RotaryBackward { scale }, parents, tables, output)
    }
}

/// RoPE's node: the tables are constants, so only `x` is a parent.
#[derive(Debug)]
struct RotaryBackward {
    scale: f64,
}

impl<B: RotaryBackend> Backward<B, 1> for RotaryBackward {
    /// The cosine and sine tables and the quarter turn.
    type State = (Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let (cos, sin, turn) = ops.state.clone();
        register(
            grads,
            &ops,
            0,
            B::rotary_backward(grad, cos, sin, turn, self.scale),
        );
    }
}
