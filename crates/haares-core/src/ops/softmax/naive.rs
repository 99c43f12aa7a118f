//! The plain tensor-operation form of the causal softmax: the reference for every loop, kernel
//! and graph node of [`super`].

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Tensor, backend::Backend};

/// The plain form of [`SoftmaxBackend::causal_softmax`](super::SoftmaxBackend::causal_softmax): the
/// `[seq, seq]` mask added to every matrix of scores, then Burn's softmax.
///
/// The mask is one `[seq·seq]` row added to every `[seq·seq]` row of scores: a broadcast CPU
/// backends run as one vectorised pass (Flex's scalar strided path takes a `[1, 1, seq, seq]`
/// operand), and a constant, so nothing in the backward pass.
pub fn causal_softmax<B: Backend, const D: usize>(scores: Tensor<B, D>) -> Tensor<B, D> {
    let dims = scores.dims();
    let seq = dims[D - 1];
    assert_eq!(
        dims[D - 2],
        seq,
        "causal softmax: scores must be square, got {dims:?}"
    );
    let device = scores.device();
    // `tril_mask` marks what a lower-triangular fill would overwrite: every key after the query.
    let future = Tensor::<B, 2, Bool>::tril_mask([seq, seq], 0, &device);
    let mask = Tensor::<B, 2>::zeros([seq, seq], &device)
        .mask_fill(future, f64::NEG_INFINITY)
        .reshape([1, seq * seq]);
    let matrices = dims[..D - 2].iter().product::<usize>();
    let masked = scores.reshape([matrices, seq * seq]) + mask;
    softmax(masked.reshape(dims), D - 1)
}

/// The plain form of
/// [`SoftmaxBackend::causal_softmax_backward`](super::SoftmaxBackend::causal_softmax_backward): `y
/// ⊙ (∂y − Σ_k y_k ∂y_k)` per row (zero where `y` is).
pub fn causal_softmax_backward<B: Backend, const D: usize>(
    probabilities: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> Tensor<B, D> {
    let along_row = (probabilities.clone() * grad.clone()).sum_dim(D - 1);
    probabilities * (grad - along_row)
}
