//! The plain tensor-operation forms of RoPE with a scale: the reference for every kernel and graph
//! node of [`super`], on separate heads and on a packed projection.

use burn::tensor::Tensor;

use super::RotaryBackend;
use crate::ops::projections::naive::unpack_heads;

/// The plain form of [`RotaryBackend::rotary`]: `s (x ⊙ cos + (x P) ⊙
/// sin)`.
///
/// Every operand is contiguous and `x P` is one small matrix product, where slicing the pairs
/// apart would make each elementwise operation walk strided views; the tables are one
/// `[seq·heads·d_h]` row shared by every batch row, a broadcast CPU backends vectorise.
pub fn rotary<B: RotaryBackend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    scale: f64,
) -> Tensor<B, 4> {
    turn_pairs(x, cos, sin, quarter_turn, scale, false)
}

/// The plain form of [`RotaryBackend::rotary_backward`]:
/// `s (∂y ⊙ cos − (∂y P) ⊙ sin)`.
pub fn rotary_backward<B: RotaryBackend>(
    grad: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    scale: f64,
) -> Tensor<B, 4> {
    turn_pairs(grad, cos, sin, quarter_turn, scale, true)
}

/// `s (x ⊙ cos ± (x P) ⊙ sin)`: the rotation by each position's angle, or back.
fn turn_pairs<B: RotaryBackend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    scale: f64,
    back: bool,
) -> Tensor<B, 4> {
    let [batch, seq, heads, head_dim] = x.dims();
    let row = seq * heads * head_dim;
    let at_positions = |table: Tensor<B, 2>| table.narrow(0, 0, seq).reshape([1, row]);
    let pairs = x.clone().reshape([batch * seq * heads, head_dim]);
    let turned = B::matmul(pairs, quarter_turn).reshape([batch, row]) * at_positions(sin);
    let straight = x.reshape([batch, row]) * at_positions(cos);
    let rotated = match back {
        false => straight + turned,
        true => straight - turned,
    };
    let scaled = match scale == 1.0 {
        true => rotated,
        false => rotated.mul_scalar(scale),
    };
    scaled.reshape([batch, seq, heads, head_dim])
}

/// The query, key and value heads of a packed projection, the first two turned by RoPE (the
/// queries scaled by `query_scale`).
pub(crate) fn turned_heads<B: RotaryBackend>(
    qkv: Tensor<B, 4>,
    [cos, sin, quarter_turn]: [Tensor<B, 2>; 3],
    query_scale: f64,
) -> [Tensor<B, 4>; 3] {
    let [query, key, value] = unpack_heads(qkv);
    let turn = |x, scale| B::rotary(x, cos.clone(), sin.clone(), quarter_turn.clone(), scale);
    [turn(query, query_scale), turn(key, 1.0), value]
}

/// The plain form of [`RotaryBackend::rotary_packed`]: RoPE on
/// the query's and the key's heads, the three joined along the heads again.
pub fn rotary_packed<B: RotaryBackend>(
    qkv: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    query_scale: f64,
) -> Tensor<B, 4> {
    let heads = turned_heads(qkv, [cos, sin, quarter_turn], query_scale);
    Tensor::cat(heads.to_vec(), 2)
}

/// The plain form of [`RotaryBackend::rotary_join`]: RoPE's
/// backward pass on the query's and the key's gradients, then the three joined along the heads.
pub fn rotary_join<B: RotaryBackend>(
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
