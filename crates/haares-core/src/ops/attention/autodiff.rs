//! Causal attention on Burn's autodiff backend: where the inner backend fuses attention at the
//! head width, one graph node (over separate heads, or over a packed projection with RoPE in
//! front) that keeps no `[seq, seq]` tensor; elsewhere the plain operations. The heads' move is a
//! node of its own, its own inverse.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::AttentionBackend;
use super::naive;
use crate::autodiff_node::{finish, from_primitive, primitive, register};
use crate::ops::projections::naive::unpack_heads;

impl<B: AttentionBackend, C: CheckpointStrategy> AttentionBackend for Autodiff<B, C> {
    fn causal_attention(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
    ) -> Tensor<Self, 4> {
        if !B::fuses_causal_attention(query.dims()[3]) {
            return naive::causal_attention(query, key, value);
        }
        let parents = [query.clone(), key.clone(), value.clone()].map(primitive);
        let inputs = [query.inner(), key.inner(), value.inner()];
        let [q, k, v] = inputs.clone();
        let (output, logsumexp) =
            crate::op_times::forward(module_path!(), || B::causal_attention_forward(q, k, v));
        let state = (inputs, output.clone(), logsumexp);
        finish(AttentionBackward, parents, state, output)
    }

    fn fuses_causal_attention(head_dim: usize) -> bool {
        B::fuses_causal_attention(head_dim)
    }

    fn swap_heads(x: Tensor<Self, 4>) -> Tensor<Self, 4> {
        let parents = [primitive(x.clone())];
        finish(
            SwapHeadsBackward,
            parents,
            (),
            crate::op_times::forward(module_path!(), || B::swap_heads(x.inner())),
        )
    }

    fn causal_attention_packed(
        qkv: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        packed_attention_node(qkv, [cos, sin, quarter_turn], query_scale)
    }
}

type Ad<B, C, const D: usize> = Tensor<Autodiff<B, C>, D>;

/// The fused attention's node: it keeps the three inputs, the output and the log-sum-exp, and
/// no `[seq, seq]` tensor.
#[derive(Debug)]
struct AttentionBackward;

impl<B: AttentionBackend> Backward<B, 3> for AttentionBackward {
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

#[derive(Debug)]
struct SwapHeadsBackward;

impl<B: AttentionBackend> Backward<B, 1> for SwapHeadsBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        register(grads, &ops, 0, B::swap_heads(grad));
    }
}

/// [`AttentionBackend::causal_attention_packed`] as one node where the backend fuses attention
/// at this head width: [`AttentionBackend::rotary_packed`], then the fused attention on views of
/// its heads, with the packed projection as the one parent (the tables are constants). It keeps the
/// turned projection, as many values as the separate query, key and value would be. Elsewhere the
/// plain composition.
fn packed_attention_node<B: AttentionBackend, C: CheckpointStrategy>(
    qkv: Ad<B, C, 4>,
    tables: [Ad<B, C, 2>; 3],
    query_scale: f64,
) -> Ad<B, C, 4> {
    if !B::fuses_causal_attention(qkv.dims()[3]) {
        let [cos, sin, turn] = tables;
        return naive::causal_attention_packed(qkv, cos, sin, turn, query_scale);
    }
    let parents = [primitive(qkv.clone())];
    let tables = tables.map(Tensor::inner);
    let [cos, sin, turn] = tables.clone();
    let turned = crate::op_times::forward(module_path!(), || {
        B::rotary_packed(qkv.inner(), cos, sin, turn, query_scale)
    });
    let inputs = unpack_heads(turned);
    let [q, k, v] = inputs.clone();
    let (output, logsumexp) =
        crate::op_times::forward(module_path!(), || B::causal_attention_forward(q, k, v));
    let state = (inputs, output.clone(), logsumexp, tables);
    finish(
        PackedAttentionBackward { query_scale },
        parents,
        state,
        output,
    )
}

/// The fused attention's backward pass, then [`AttentionBackend::rotary_join`].
#[derive(Debug)]
struct PackedAttentionBackward {
    query_scale: f64,
}

impl<B: AttentionBackend> Backward<B, 1> for PackedAttentionBackward {
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
