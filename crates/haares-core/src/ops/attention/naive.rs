//! The plain tensor-operation forms of causal attention: the reference for every kernel and graph
//! node of [`super`].

use burn::tensor::{Bool, Tensor, backend::Backend};

use super::AttentionBackend;
use crate::ops::rotary::naive::turned_heads;

/// The plain form of
/// [`AttentionBackend::causal_attention`]: the heads
/// moved in front of the positions, [`causal_attention_by_head`] (a product, the causal softmax, a
/// product), and the heads moved back.
pub fn causal_attention<B: AttentionBackend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let context = causal_attention_by_head(
        B::swap_heads(query),
        B::swap_heads(key),
        B::swap_heads(value),
    );
    B::swap_heads(context)
}

/// `softmax(QKᵀ + M)V` with the causal mask `M` (0 where a query may see a key, −∞ where the key
/// lies in its future), for queries already scaled by `1/√d_h`; the masked softmax is one
/// operation ([`SoftmaxBackend::causal_softmax`](crate::ops::SoftmaxBackend::causal_softmax)).
///
/// Burn's `attention` module op is fused on some backends for inference, but under autodiff it
/// runs a decomposition that fills a `[batch, heads, seq, seq]` copy of a broadcast boolean mask
/// at every call.
///
/// # Shapes
/// - query, key, value: `[batch, heads, seq, d_h]`
/// - output: `[batch, heads, seq, d_h]`
pub fn causal_attention_by_head<B: AttentionBackend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let probabilities = B::causal_softmax(B::matmul_transposed_rhs(query, key));
    B::matmul(probabilities, value)
}

/// The plain form of
/// [`AttentionBackend::causal_attention_forward`]:
/// the output of
/// [`causal_attention`] and each query's log-sum-exp `ln Σ_{j ≤ i} e^{s_ij}` over the scores it
/// sees.
pub fn causal_attention_forward<B: AttentionBackend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let [batch, seq, heads, _] = query.dims();
    let scores = causal_scores(query.swap_dims(1, 2), key.swap_dims(1, 2));
    let most = scores.clone().max_dim(3);
    let logsumexp = (scores.clone() - most.clone()).exp().sum_dim(3).log() + most;
    let probabilities = (scores - logsumexp.clone()).exp();
    let output = probabilities.matmul(value.swap_dims(1, 2)).swap_dims(1, 2);
    let logsumexp = logsumexp.swap_dims(1, 2).reshape([batch, seq, heads]);
    (output, logsumexp)
}

/// The plain form of
/// [`AttentionBackend::causal_attention_backward`],
/// with the probabilities recomputed from the scores and the log-sum-exp: `∂V = Pᵀ ∂O`, `∂S = P ⊙
/// (∂O Vᵀ − Δ)` with `Δ = rowsum(∂O ⊙ O)`, `∂Q = ∂S K` and `∂K = ∂Sᵀ Q`.
pub fn causal_attention_backward<B: AttentionBackend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    output: Tensor<B, 4>,
    logsumexp: Tensor<B, 3>,
    grad: Tensor<B, 4>,
) -> [Tensor<B, 4>; 3] {
    let [batch, seq, heads, _] = query.dims();
    let heads_first = |x: Tensor<B, 4>| x.swap_dims(1, 2);
    let (query, key, value) = (heads_first(query), heads_first(key), heads_first(value));
    let (output, grad) = (heads_first(output), heads_first(grad));
    let logsumexp = logsumexp.reshape([batch, seq, heads, 1]).swap_dims(1, 2);
    let probabilities = (causal_scores(query.clone(), key.clone()) - logsumexp).exp();
    let value_grad = probabilities.clone().swap_dims(2, 3).matmul(grad.clone());
    let along = (grad.clone() * output).sum_dim(3);
    let score_grad = probabilities * (grad.matmul(value.swap_dims(2, 3)) - along);
    let query_grad = score_grad.clone().matmul(key);
    let key_grad = score_grad.swap_dims(2, 3).matmul(query);
    [query_grad, key_grad, value_grad].map(heads_first)
}

/// `Q Kᵀ` with −∞ wherever a key lies after its query, for `[batch, heads, seq, d_h]` operands.
fn causal_scores<B: Backend>(query: Tensor<B, 4>, key: Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, heads, seq, _] = query.dims();
    let future = Tensor::<B, 2, Bool>::tril_mask([seq, seq], 0, &query.device())
        .unsqueeze::<4>()
        .expand([batch, heads, seq, seq]);
    query
        .matmul(key.swap_dims(2, 3))
        .mask_fill(future, f64::NEG_INFINITY)
}

/// The plain form of [`AttentionBackend::swap_heads`]: Burn's
/// view.
pub fn swap_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    x.swap_dims(1, 2)
}

/// The plain form of
/// [`AttentionBackend::causal_attention_packed`]:
/// the heads unpacked, RoPE on the queries (scaled by `query_scale`) and the keys, then
/// [`causal_attention`](AttentionBackend::causal_attention).
pub fn causal_attention_packed<B: AttentionBackend>(
    qkv: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    query_scale: f64,
) -> Tensor<B, 4> {
    let [query, key, value] = turned_heads(qkv, [cos, sin, quarter_turn], query_scale);
    B::causal_attention(query, key, value)
}
