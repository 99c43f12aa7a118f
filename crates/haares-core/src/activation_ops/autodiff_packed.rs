//! The packed operations ([`super::packed`]) on Burn's autodiff backend, one graph node each: the
//! side-by-side projections, whose backward pass is two products and a split; attention over a
//! packed projection, whose backward pass is the fused attention's and one join; SwiGLU over a
//! packed projection.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::autodiff::register;
use super::{ActivationBackend, packed};
use crate::autodiff_node::{finish, from_primitive, primitive};

type Ad<B, C, const D: usize> = Tensor<Autodiff<B, C>, D>;

/// [`ActivationBackend::projections`] as one node with the input and every weight as parents,
/// for up to three weights (the backbone's most); more are the plain composition.
pub(super) fn projections<B: ActivationBackend, C: CheckpointStrategy>(
    x: Ad<B, C, 2>,
    weights: Vec<Ad<B, C, 2>>,
) -> Ad<B, C, 2> {
    match weights.len() {
        1 => projection_node::<B, C, 2>(x, weights),
        2 => projection_node::<B, C, 3>(x, weights),
        3 => projection_node::<B, C, 4>(x, weights),
        _ => Autodiff::<B, C>::matmul(x, packed::concat_columns(weights)),
    }
}

/// The node of `x [W₁ … W_k]` with `P = k + 1` parents. It keeps the input for the weights'
/// gradient and the joined weights for the input's, each only when the other is tracked.
fn projection_node<B: ActivationBackend, C: CheckpointStrategy, const P: usize>(
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
    let joined = B::concat_columns(weights.into_iter().map(Tensor::inner).collect());
    let output = B::matmul(x.clone(), joined.clone());
    let state = (weights_tracked.then_some(x), x_tracked.then_some(joined));
    finish(ProjectionsBackward { widths }, parents, state, output)
}

/// `Y = x W` for `W = [W₁ … W_k]`: `∂x = ∂Y Wᵀ`, and `∂W = xᵀ ∂Y` split into the weights' columns.
#[derive(Debug)]
struct ProjectionsBackward {
    widths: Vec<usize>,
}

impl<B: ActivationBackend, const P: usize> Backward<B, P> for ProjectionsBackward {
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

/// [`ActivationBackend::causal_attention_packed`] as one node where the backend fuses attention
/// at this head width: [`ActivationBackend::rotary_packed`], then the fused attention on views of
/// its heads, with the packed projection as the one parent (the tables are constants). It keeps
/// the turned projection, as many values as the separate query, key and value would be. Elsewhere the plain
/// composition.
pub(super) fn causal_attention_packed<B: ActivationBackend, C: CheckpointStrategy>(
    qkv: Ad<B, C, 4>,
    tables: [Ad<B, C, 2>; 3],
    query_scale: f64,
) -> Ad<B, C, 4> {
    if !B::fuses_causal_attention(qkv.dims()[3]) {
        let [cos, sin, turn] = tables;
        return packed::causal_attention_packed(qkv, cos, sin, turn, query_scale);
    }
    let parents = [primitive(qkv.clone())];
    let tables = tables.map(Tensor::inner);
    let [cos, sin, turn] = tables.clone();
    let turned = B::rotary_packed(qkv.inner(), cos, sin, turn, query_scale);
    let inputs = packed::unpack_heads(turned);
    let [q, k, v] = inputs.clone();
    let (output, logsumexp) = B::causal_attention_forward(q, k, v);
    let state = (inputs, output.clone(), logsumexp, tables);
    finish(
        PackedAttentionBackward { query_scale },
        parents,
        state,
        output,
    )
}

/// The fused attention's backward pass, then [`ActivationBackend::rotary_join`].
#[derive(Debug)]
struct PackedAttentionBackward {
    query_scale: f64,
}

impl<B: ActivationBackend> Backward<B, 1> for PackedAttentionBackward {
    /// The turned queries and keys and the values (views of one packed tensor), the output,
    /// each query's log-sum-exp, and RoPE's tables.
    type State = (
        [Tensor<B, 4>; 3],
        Tensor<B, 4>,
        Tensor<B, 3>,
        [Tensor<B, 2>; 3],
    );

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let ([query, key, value], output, logsumexp, [cos, sin, turn]) = ops.state.clone();
        let gradients = B::causal_attention_backward(query, key, value, output, logsumexp, grad);
        let joined = B::rotary_join(gradients, cos, sin, turn, self.query_scale);
        register(grads, &ops, 0, joined);
    }
}

/// [`ActivationBackend::swiglu_packed`] as one node over the packed projection.
pub(super) fn swiglu_packed<B: ActivationBackend, C: CheckpointStrategy>(
    gate_up: Ad<B, C, 2>,
) -> Ad<B, C, 2> {
    let parents = [primitive(gate_up.clone())];
    let gate_up = gate_up.inner();
    let output = B::swiglu_packed(gate_up.clone());
    finish(SwiGluPackedBackward, parents, gate_up, output)
}

#[derive(Debug)]
struct SwiGluPackedBackward;

impl<B: ActivationBackend> Backward<B, 1> for SwiGluPackedBackward {
    /// The packed projection.
    type State = Tensor<B, 2>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let gate_up_grad = B::swiglu_packed_backward(ops.state.clone(), grad);
        register(grads, &ops, 0, gate_up_grad);
    }
}
