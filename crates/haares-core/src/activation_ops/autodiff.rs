//! The fused activations on Burn's autodiff backend: each operation is one graph node whose
//! backward pass is the inner backend's `*_backward` primitive (the matrix product's: two more
//! products).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

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

    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        let parents = [primitive(x.clone()), primitive(weight.clone())];
        let (x, weight) = (x.inner(), weight.inner());
        let output = B::rms_norm(x.clone(), weight.clone(), epsilon);
        finish(RmsNormBackward { epsilon }, parents, (x, weight), output)
    }

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
        let output = B::rotary(x.inner(), cos, sin, turn, scale);
        finish(RotaryBackward { scale }, parents, tables, output)
    }

    fn causal_attention(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
    ) -> Tensor<Self, 4> {
        if !B::fuses_causal_attention(query.dims()[3]) {
            return super::naive::causal_attention(query, key, value);
        }
        let parents = [query.clone(), key.clone(), value.clone()].map(primitive);
        let inputs = [query.inner(), key.inner(), value.inner()];
        let [q, k, v] = inputs.clone();
        let (output, logsumexp) = B::causal_attention_forward(q, k, v);
        let state = (inputs, output.clone(), logsumexp);
        finish(AttentionBackward, parents, state, output)
    }

    fn fuses_causal_attention(head_dim: usize) -> bool {
        B::fuses_causal_attention(head_dim)
    }

    fn cross_entropy(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> Tensor<Self, 1> {
        if !B::fuses_cross_entropy() {
            return super::naive::cross_entropy(logits, targets, weights);
        }
        let parents = [primitive(logits.clone())];
        let (logits, targets, weights) = (logits.inner(), targets.inner(), weights.inner());
        let (losses, logsumexp) =
            B::cross_entropy_forward(logits.clone(), targets.clone(), weights.clone());
        let state = (logits, targets, weights, logsumexp);
        finish(CrossEntropyBackward, parents, state, losses)
    }

    fn fuses_cross_entropy() -> bool {
        B::fuses_cross_entropy()
    }

    fn swap_heads(x: Tensor<Self, 4>) -> Tensor<Self, 4> {
        let parents = [primitive(x.clone())];
        finish(SwapHeadsBackward, parents, (), B::swap_heads(x.inner()))
    }

    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        product_node(MatmulBackward::<D>, lhs, rhs, B::matmul)
    }

    fn matmul_transposed_rhs<const D: usize>(
        lhs: Tensor<Self, D>,
        rhs: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        product_node(
            MatmulTransposedRhsBackward::<D>,
            lhs,
            rhs,
            B::matmul_transposed_rhs,
        )
    }

    fn packs_projections() -> bool {
        B::packs_projections()
    }

    fn projections(x: Tensor<Self, 2>, weights: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        super::autodiff_packed::projections(x, weights)
    }

    fn causal_attention_packed(
        qkv: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        super::autodiff_packed::causal_attention_packed(qkv, [cos, sin, quarter_turn], query_scale)
    }

    fn swiglu_packed(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        super::autodiff_packed::swiglu_packed(gate_up)
    }
}

/// The node of a product of two operands, `forward` on the inner backend. `∂A` needs `B` and
/// `∂B` needs `A`: an operand is kept only for the other's gradient.
fn product_node<B, C, T, const D: usize>(
    backward: T,
    lhs: Tensor<Autodiff<B, C>, D>,
    rhs: Tensor<Autodiff<B, C>, D>,
    forward: impl FnOnce(Tensor<B, D>, Tensor<B, D>) -> Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D>
where
    B: ActivationBackend,
    C: CheckpointStrategy,
    T: Backward<B, 2, State = (Option<Tensor<B, D>>, Option<Tensor<B, D>>)>,
{
    let parents = [primitive(lhs.clone()), primitive(rhs.clone())];
    let (lhs_tracked, rhs_tracked) = (parents[0].is_tracked(), parents[1].is_tracked());
    let (lhs, rhs) = (lhs.inner(), rhs.inner());
    let output = forward(lhs.clone(), rhs.clone());
    let state = (rhs_tracked.then_some(lhs), lhs_tracked.then_some(rhs));
    finish(backward, parents, state, output)
}

/// Registers `gradient` for the parent at `position`, when that parent is tracked.
pub(super) fn register<B: Backend, S, const N: usize, const D: usize>(
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
struct RmsNormBackward {
    epsilon: f64,
}

impl<B: ActivationBackend> Backward<B, 2> for RmsNormBackward {
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

/// RoPE's node: the tables are constants, so only `x` is a parent.
#[derive(Debug)]
struct RotaryBackward {
    scale: f64,
}

impl<B: ActivationBackend> Backward<B, 1> for RotaryBackward {
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

/// The fused attention's node: it keeps the three inputs, the output and the log-sum-exp, and
/// no `[seq, seq]` tensor.
#[derive(Debug)]
struct AttentionBackward;

impl<B: ActivationBackend> Backward<B, 3> for AttentionBackward {
    /// The query, key and value, the output, and each query's log-sum-exp.
    type State = ([Tensor<B, 4>; 3], Tensor<B, 4>, Tensor<B, 3>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let ([query, key, value], output, logsumexp) = ops.state.clone();
        let gradients = B::causal_attention_backward(query, key, value, output, logsumexp, grad);
        for (position, gradient) in gradients.into_iter().enumerate() {
            register(grads, &ops, position, gradient);
        }
    }
}

/// The fused cross-entropy's node: the logits are its one parent (the targets and weights are
/// data); it keeps them and each row's log-sum-exp.
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: ActivationBackend> Backward<B, 1> for CrossEntropyBackward {
    /// The logits, targets and weights, and each row's log-sum-exp.
    type State = (Tensor<B, 2>, Tensor<B, 1, Int>, Tensor<B, 1>, Tensor<B, 1>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let (logits, targets, weights, logsumexp) = ops.state.clone();
        let logits_grad = B::cross_entropy_backward(logits, targets, weights, logsumexp, grad);
        register(grads, &ops, 0, logits_grad);
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

#[derive(Debug)]
struct MatmulBackward<const D: usize>;

#[derive(Debug)]
struct MatmulTransposedRhsBackward<const D: usize>;

impl<B: ActivationBackend, const D: usize> Backward<B, 2> for MatmulBackward<D> {
    /// The left operand when the right one is tracked, the right one when the left one is.
    type State = (Option<Tensor<B, D>>, Option<Tensor<B, D>>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let (lhs, rhs) = ops.state.clone();
        let transposed = |x: Tensor<B, D>| x.swap_dims(D - 2, D - 1);
        if let Some(rhs) = rhs.filter(|_| ops.parents[0].is_some()) {
            register(grads, &ops, 0, B::matmul(grad.clone(), transposed(rhs)));
        }
        if let Some(lhs) = lhs.filter(|_| ops.parents[1].is_some()) {
            register(grads, &ops, 1, B::matmul(transposed(lhs), grad));
        }
    }
}

impl<B: ActivationBackend, const D: usize> Backward<B, 2> for MatmulTransposedRhsBackward<D> {
    /// As [`MatmulBackward`]'s: each operand kept only for the other's gradient.
    type State = (Option<Tensor<B, D>>, Option<Tensor<B, D>>);

    /// `C = A Bᵀ`: `∂A = ∂C B` and `∂B = ∂Cᵀ A`, both in their operands' layouts.
    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let (lhs, rhs) = ops.state.clone();
        if let Some(rhs) = rhs.filter(|_| ops.parents[0].is_some()) {
            register(grads, &ops, 0, B::matmul(grad.clone(), rhs));
        }
        if let Some(lhs) = lhs.filter(|_| ops.parents[1].is_some()) {
            register(grads, &ops, 1, B::matmul(grad.swap_dims(D - 2, D - 1), lhs));
        }
    }
}
