//! Attention on Burn's Flex backend: causal attention as one pass per sequence and head
//! (`flex_fused.rs`) for f32, the plain pair for other float types; and the move of the heads,
//! the swapped tensor written at once in runs of `d_h` elements, where a use of Burn's view copies
//! it element by element through a strided iterator.

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

use super::flex_fused;
use super::flex_heads::Heads;
use super::{AttentionBackend, naive};
use crate::simd::flex_tensor;

impl AttentionBackend for Flex {
    /// Every head width: the pass pads a head to whole vectors (`flex_fused.rs`).
    fn fuses_causal_attention(_head_dim: usize) -> bool {
        true
    }

    fn causal_attention_forward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
    ) -> (Tensor<Self, 4>, Tensor<Self, 3>) {
        match heads_of([&query, &key, &value]) {
            Some([query, key, value]) => flex_fused::forward([&query, &key, &value]),
            None => naive::causal_attention_forward(query, key, value),
        }
    }

    fn causal_attention_backward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
        output: Tensor<Self, 4>,
        logsumexp: Tensor<Self, 3>,
        grad: Tensor<Self, 4>,
    ) -> [Tensor<Self, 4>; 3] {
        let [batch, seq, heads] = logsumexp.dims();
        let sums = logsumexp.clone().reshape([batch, seq, heads, 1]);
        let matching = query.dims()[..3] == [batch, seq, heads];
        let fused = heads_of([&query, &key, &value, &output, &grad]).filter(|_| matching);
        match fused.zip(Heads::new(&sums)) {
            Some(([query, key, value, output, grad], sums)) => {
                flex_fused::backward([&query, &key, &value, &output, &sums, &grad])
            }
            None => naive::causal_attention_backward(query, key, value, output, logsumexp, grad),
        }
    }

    fn swap_heads(x: Tensor<Self, 4>) -> Tensor<Self, 4> {
        let [a, b, c, e] = x.dims();
        let buffer = x.clone().into_primitive().tensor();
        let layout = buffer.layout();
        let strides: Vec<usize> = layout.strides().iter().map(|&s| s as usize).collect();
        // Runs of `e` elements, strides that do not step backwards, f32, something to copy.
        let readable = x.dtype() == DType::F32
            && layout.strides()[..3].iter().all(|&s| s >= 0)
            && strides[3] == 1
            && a * b * c * e > 0;
        if !readable {
            return naive::swap_heads(x);
        }
        let values = &buffer.storage::<f32>()[layout.start_offset()..];
        let mut swapped = vec![0.0; a * b * c * e];
        // One task per (i, k): the `b` runs of `x[i, ·, k, ·]`, which become `out[i, k]`.
        swapped
            .par_chunks_mut(b * e)
            .enumerate()
            .for_each(|(ik, out)| {
                let first = (ik / c) * strides[0] + (ik % c) * strides[2];
                for (j, run) in out.chunks_exact_mut(e).enumerate() {
                    run.copy_from_slice(&values[first + j * strides[1]..][..e]);
                }
            });
        flex_tensor(swapped, [a, c, b, e])
    }
}

/// The tensors' elements for the fused pass, when each is f32 and readable through its strides
/// and all have one shape.
fn heads_of<const N: usize>(tensors: [&Tensor<Flex, 4>; N]) -> Option<[Heads; N]> {
    let dims = tensors[0].dims();
    if tensors.iter().any(|tensor| tensor.dims() != dims) {
        return None;
    }
    let heads: Vec<Heads> = tensors
        .iter()
        .map(|tensor| Heads::new(tensor))
        .collect::<Option<_>>()?;
    heads.try_into().ok()
}
