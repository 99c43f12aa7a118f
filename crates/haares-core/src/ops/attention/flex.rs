//! Attention's move of the heads on Burn's Flex backend: the swapped tensor written at once, in
//! runs of `d_h` elements, where a use of Burn's view copies it element by element through a
//! strided iterator.

use burn::backend::Flex;
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

use super::{AttentionBackend, naive};
use crate::simd::flex_tensor;

impl AttentionBackend for Flex {
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
