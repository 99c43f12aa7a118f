//! Side-by-side projections: the products of one input with several weights as one product,
//! `x [W₁ … W_k]`, and the operations that read its output in place. Attention's query, key and
//! value (App. A) become one `[tokens, 3d]` product, SwiGLU's gate and up projections one
//! `[tokens, 2 d_ff]` product; in the backward pass the input's gradient is then one product,
//! `∂x = ∂Y [W₁ … W_k]ᵀ`, where the separate projections take `k` products and `k − 1` additions,
//! and the weights' gradients one product, `xᵀ ∂Y`, split by columns (docs/decisions.md,
//! decision 23). On a GPU every product and addition is a kernel launch (issue 34).
//!
//! The plain forms here are the reference: Burn's `cat` and `narrow` around the backbone's own
//! operations. The cube backends replace the joins and splits with one kernel each
//! (`cube_packed.rs`), and the autodiff backend makes each packed operation one graph node
//! (`autodiff_packed.rs`). `tests/core/packed_checks.rs` checks the nodes against the separate
//! projections, output and every gradient.

use burn::tensor::Tensor;

use super::ActivationBackend;

/// The plain form of [`ActivationBackend::concat_columns`]: Burn's `cat` along the columns.
pub fn concat_columns<B: ActivationBackend>(parts: Vec<Tensor<B, 2>>) -> Tensor<B, 2> {
    Tensor::cat(parts, 1)
}

/// The plain form of [`ActivationBackend::split_columns`]: consecutive column ranges of `whole`,
/// `widths[i]` wide.
pub fn split_columns<B: ActivationBackend>(
    whole: Tensor<B, 2>,
    widths: &[usize],
) -> Vec<Tensor<B, 2>> {
    let starts = widths.iter().scan(0, |start, &width| {
        *start += width;
        Some(*start - width)
    });
    starts
        .zip(widths)
        .map(|(start, &width)| whole.clone().narrow(1, start, width))
        .collect()
}

/// The query, key and value heads of a packed `[batch, seq, 3·heads, d_h]` projection, as views.
pub fn unpack_heads<B: ActivationBackend>(qkv: Tensor<B, 4>) -> [Tensor<B, 4>; 3] {
    let heads = qkv.dims()[2] / 3;
    [0, 1, 2].map(|part| qkv.clone().narrow(2, part * heads, heads))
}

/// The query, key and value heads of a packed projection, the first two turned by RoPE (the
/// queries scaled by `query_scale`).
fn turned_heads<B: ActivationBackend>(
    qkv: Tensor<B, 4>,
    [cos, sin, quarter_turn]: [Tensor<B, 2>; 3],
    query_scale: f64,
) -> [Tensor<B, 4>; 3] {
    let [query, key, value] = unpack_heads(qkv);
    let turn = |x, scale| B::rotary(x, cos.clone(), sin.clone(), quarter_turn.clone(), scale);
    [turn(query, query_scale), turn(key, 1.0), value]
}

/// The plain form of [`ActivationBackend::causal_attention_packed`]: the heads unpacked, RoPE on
/// the queries (scaled by `query_scale`) and the keys, then
/// [`causal_attention`](ActivationBackend::causal_attention).
pub fn causal_attention_packed<B: ActivationBackend>(
    qkv: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    query_scale: f64,
) -> Tensor<B, 4> {
    let [query, key, value] = turned_heads(qkv, [cos, sin, quarter_turn], query_scale);
    B::causal_attention(query, key, value)
}

/// The plain form of [`ActivationBackend::rotary_packed`]: RoPE on the query's and the key's
/// heads, the three joined along the heads again.
pub fn rotary_packed<B: ActivationBackend>(
    qkv: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    query_scale: f64,
) -> Tensor<B, 4> {
    let heads = turned_heads(qkv, [cos, sin, quarter_turn], query_scale);
    Tensor::cat(heads.to_vec(), 2)
}

/// The plain form of [`ActivationBackend::rotary_join`]: RoPE's backward pass on the query's and
/// the key's gradients, then the three joined along the heads.
pub fn rotary_join<B: ActivationBackend>(
    [query_grad, key_grad, value_grad]: [Tensor<B, 4>; 3],
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    query_scale: f64,
) -> Tensor<B, 4> {
    let back =
        |x, scale| B::rotary_backward(x, cos.clone(), sin.clone(), quarter_turn.clone(), scale);
    Tensor::cat(
        vec![
            back(query_grad, query_scale),
            back(key_grad, 1.0),
            value_grad,
        ],
        2,
    )
}

/// The gate and up halves of a packed `[rows, 2 d_ff]` projection, as views.
pub fn unpack_gate_up<B: ActivationBackend>(gate_up: Tensor<B, 2>) -> [Tensor<B, 2>; 2] {
    let width = gate_up.dims()[1] / 2;
    [0, 1].map(|half| gate_up.clone().narrow(1, half * width, width))
}

/// The plain form of [`ActivationBackend::swiglu_packed`]: [`swiglu`](ActivationBackend::swiglu)
/// of the two halves.
pub fn swiglu_packed<B: ActivationBackend>(gate_up: Tensor<B, 2>) -> Tensor<B, 2> {
    let [gate, up] = unpack_gate_up(gate_up);
    B::swiglu(gate, up)
}

/// The plain form of [`ActivationBackend::swiglu_packed_backward`]: SwiGLU's two gradients,
/// joined as the halves they belong to.
pub fn swiglu_packed_backward<B: ActivationBackend>(
    gate_up: Tensor<B, 2>,
    grad: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let [gate, up] = unpack_gate_up(gate_up);
    let (gate_grad, up_grad) = B::swiglu_backward(gate, up, grad);
    Tensor::cat(vec![gate_grad, up_grad], 1)
}
