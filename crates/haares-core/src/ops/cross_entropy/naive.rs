//! The plain tensor-operation forms of the weighted cross-entropy: the reference for every kernel
//! and graph node of [`super`].

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, backend::Backend};

/// The plain form of
/// [`CrossEntropyBackend::cross_entropy`](super::CrossEntropyBackend::cross_entropy): Burn's
/// `log_softmax`, each row's target entry gathered, weighted and negated.
pub fn cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let rows = logits.dims()[0];
    let picked = log_softmax(logits, 1).gather(1, targets.reshape([rows, 1]));
    -(picked.reshape([rows]) * weights)
}

/// The plain form of
/// [`CrossEntropyBackend::cross_entropy_forward`](super::CrossEntropyBackend::cross_entropy_forward):
/// each row's weighted `lse − x_target` and its log-sum-exp `lse = max + ln Σ e^{x − max}`.
pub fn cross_entropy_forward<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let rows = logits.dims()[0];
    let most = logits.clone().max_dim(1);
    let logsumexp = (logits.clone() - most.clone()).exp().sum_dim(1).log() + most;
    let picked = logits.gather(1, targets.reshape([rows, 1]));
    let losses = (logsumexp.clone() - picked).reshape([rows]) * weights;
    (losses, logsumexp.reshape([rows]))
}

/// The plain form of
/// [`CrossEntropyBackend::cross_entropy_backward`](super::CrossEntropyBackend::cross_entropy_backward):
/// `g w (e^{x − lse} − onehot(target))` per row.
pub fn cross_entropy_backward<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
    logsumexp: Tensor<B, 1>,
    grad: Tensor<B, 1>,
) -> Tensor<B, 2> {
    let [rows, vocab] = logits.dims();
    let device = logits.device();
    let ids = Tensor::<B, 1, Int>::arange(0..vocab as i64, &device).reshape([1, vocab]);
    let target = ids
        .expand([rows, vocab])
        .equal(targets.reshape([rows, 1]).expand([rows, vocab]))
        .float();
    let probabilities = (logits - logsumexp.reshape([rows, 1])).exp();
    (probabilities - target) * (grad * weights).reshape([rows, 1])
}

/// The plain form of
/// [`CrossEntropyBackend::loss_total`](super::CrossEntropyBackend::loss_total): Burn's `sum` of
/// the rows' losses.
pub fn loss_total<B: Backend>(losses: Tensor<B, 1>) -> Tensor<B, 1> {
    losses.sum()
}
