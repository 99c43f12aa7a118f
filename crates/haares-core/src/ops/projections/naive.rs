//! The plain forms of the packed projections' joins and splits (Burn's `cat` and `narrow`), the
//! reference for the kernels and graph nodes of [`super`], and the views that unpack a packed
//! projection's parts.

use burn::tensor::{Tensor, backend::Backend};

/// The plain form of
/// [`ProjectionBackend::concat_columns`](super::ProjectionBackend::concat_columns): Burn's `cat`
/// along the columns.
pub fn concat_columns<B: Backend>(parts: Vec<Tensor<B, 2>>) -> Tensor<B, 2> {
    Tensor::cat(parts, 1)
}

/// The plain form of [`ProjectionBackend::split_columns`](super::ProjectionBackend::split_columns):
/// consecutive column ranges of `whole`, `widths[i]` wide.
pub fn split_columns<B: Backend>(whole: Tensor<B, 2>, widths: &[usize]) -> Vec<Tensor<B, 2>> {
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
pub fn unpack_heads<B: Backend>(qkv: Tensor<B, 4>) -> [Tensor<B, 4>; 3] {
    let heads = qkv.dims()[2] / 3;
    [0, 1, 2].map(|part| qkv.clone().narrow(2, part * heads, heads))
}

/// The gate and up halves of a packed `[rows, 2 d_ff]` projection, as views.
pub fn unpack_gate_up<B: Backend>(gate_up: Tensor<B, 2>) -> [Tensor<B, 2>; 2] {
    let width = gate_up.dims()[1] / 2;
    [0, 1].map(|half| gate_up.clone().narrow(1, half * width, width))
}
