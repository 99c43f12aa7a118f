//! The plain form of the matrix product: Burn's own, the reference for Flex's direct call of its
//! `gemm` kernel and for the graph nodes of [`super`].

use burn::tensor::{Tensor, backend::Backend};

/// The plain form of [`MatmulBackend::matmul`](super::MatmulBackend::matmul): Burn's `matmul`.
pub fn matmul<B: Backend, const D: usize>(lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
    lhs.matmul(rhs)
}
