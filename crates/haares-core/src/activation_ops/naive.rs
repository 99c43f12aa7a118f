//! The plain tensor-operation forms of the backbone's fused activations: the reference for every
//! loop and graph node of [`super`], with the sigmoid and SiLU they are built from.

use burn::tensor::activation::{self, log_softmax, softmax};
use burn::tensor::{Bool, DType, Int, Tensor, backend::Backend};

use super::ActivationBackend;

/// The plain form of [`ActivationBackend::swiglu`]: `SiLU(gate) ⊙ up`.
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    silu(gate) * up
}

/// The plain form of [`ActivationBackend::swiglu_backward`]:
/// `∂up = ∂h ⊙ g σ(g)` and `∂gate = ∂h ⊙ up ⊙ (σ(g) + g σ(g) (1 − σ(g)))`.
pub fn swiglu_backward<B: Backend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> (Tensor<B, D>, Tensor<B, D>) {
    let sigmoid = sigmoid(gate.clone());
    let silu = gate * sigmoid.clone();
    let up_grad = grad.clone() * silu.clone();
    let silu_slope = sigmoid.clone() + silu * (sigmoid.neg() + 1.0);
    (grad * up * silu_slope, up_grad)
}

/// The plain form of [`ActivationBackend::causal_softmax`]: the
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

/// The plain form of [`ActivationBackend::causal_attention`]: the heads moved in front of the
/// positions, [`causal_attention_by_head`] (a product, the causal softmax, a product), and the
/// heads moved back.
pub fn causal_attention<B: ActivationBackend>(
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
/// operation ([`ActivationBackend::causal_softmax`]).
///
/// Burn's `attention` module op is fused on some backends for inference, but under autodiff it
/// runs a decomposition that fills a `[batch, heads, seq, seq]` copy of a broadcast boolean mask
/// at every call.
///
/// # Shapes
/// - query, key, value: `[batch, heads, seq, d_h]`
/// - output: `[batch, heads, seq, d_h]`
pub fn causal_attention_by_head<B: ActivationBackend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let probabilities = B::causal_softmax(B::matmul_transposed_rhs(query, key));
    B::matmul(probabilities, value)
}

/// The plain form of [`ActivationBackend::causal_attention_forward`]: the output of
/// [`causal_attention`] and each query's log-sum-exp `ln Σ_{j ≤ i} e^{s_ij}` over the scores it
/// sees.
pub fn causal_attention_forward<B: ActivationBackend>(
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

/// The plain form of [`ActivationBackend::causal_attention_backward`], with the probabilities
/// recomputed from the scores and the log-sum-exp: `∂V = Pᵀ ∂O`,
/// `∂S = P ⊙ (∂O Vᵀ − Δ)` with `Δ = rowsum(∂O ⊙ O)`, `∂Q = ∂S K` and `∂K = ∂Sᵀ Q`.
pub fn causal_attention_backward<B: ActivationBackend>(
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

/// The plain form of [`ActivationBackend::cross_entropy`]: Burn's `log_softmax`, each row's
/// target entry gathered, weighted and negated.
pub fn cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let rows = logits.dims()[0];
    let picked = log_softmax(logits, 1).gather(1, targets.reshape([rows, 1]));
    -(picked.reshape([rows]) * weights)
}

/// The plain form of [`ActivationBackend::cross_entropy_forward`]: each row's weighted
/// `lse − x_target` and its log-sum-exp `lse = max + ln Σ e^{x − max}`.
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

/// The plain form of [`ActivationBackend::cross_entropy_backward`]:
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

/// The plain form of [`ActivationBackend::rms_norm`]: `x / rms ⊙ w` per row.
///
/// A division, not a multiplication by `recip`: Burn's NdArray computes an f32 `recip` with the
/// approximate SIMD instruction (≈ 1e-4 relative error) once tensors are large.
pub fn rms_norm<B: Backend>(x: Tensor<B, 2>, weight: Tensor<B, 1>, epsilon: f64) -> Tensor<B, 2> {
    let rms = (x.clone().square().mean_dim(1) + epsilon).sqrt();
    x / rms * weight.unsqueeze::<2>()
}

/// The plain form of [`ActivationBackend::rms_norm_backward`]:
/// `∂x = (∂y⊙w − x̂ mean(∂y⊙w⊙x̂)) / rms` and `∂w = Σ_rows ∂y⊙x̂`, with `x̂ = x / rms`.
pub fn rms_norm_backward<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 1>,
    grad: Tensor<B, 2>,
    epsilon: f64,
) -> (Tensor<B, 2>, Tensor<B, 1>) {
    let d = weight.dims()[0];
    let rms = (x.clone().square().mean_dim(1) + epsilon).sqrt();
    let normed = x / rms.clone();
    let weighted = grad.clone() * weight.unsqueeze::<2>();
    let along_row = (weighted.clone() * normed.clone()).mean_dim(1);
    let x_grad = (weighted - normed.clone() * along_row) / rms;
    let weight_grad = (grad * normed).sum_dim(0).reshape([d]);
    (x_grad, weight_grad)
}

/// The plain form of [`ActivationBackend::rotary`]: `s (x ⊙ cos + (x P) ⊙ sin)`.
///
/// Every operand is contiguous and `x P` is one small matrix product, where slicing the pairs
/// apart would make each elementwise operation walk strided views; the tables are one
/// `[seq·heads·d_h]` row shared by every batch row, a broadcast CPU backends vectorise.
pub fn rotary<B: ActivationBackend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    scale: f64,
) -> Tensor<B, 4> {
    turn_pairs(x, cos, sin, quarter_turn, scale, false)
}

/// The plain form of [`ActivationBackend::rotary_backward`]:
/// `s (∂y ⊙ cos − (∂y P) ⊙ sin)`.
pub fn rotary_backward<B: ActivationBackend>(
    grad: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    quarter_turn: Tensor<B, 2>,
    scale: f64,
) -> Tensor<B, 4> {
    turn_pairs(grad, cos, sin, quarter_turn, scale, true)
}

/// `s (x ⊙ cos ± (x P) ⊙ sin)`: the rotation by each position's angle, or back.
fn turn_pairs<B: ActivationBackend>(
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

/// The plain form of [`ActivationBackend::swap_heads`]: Burn's view.
pub fn swap_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    x.swap_dims(1, 2)
}

/// The plain form of [`ActivationBackend::matmul`]: Burn's `matmul`.
pub fn matmul<B: Backend, const D: usize>(lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
    lhs.matmul(rhs)
}

/// The plain form of [`ActivationBackend::causal_softmax_backward`]:
/// `y ⊙ (∂y − Σ_k y_k ∂y_k)` per row (zero where `y` is).
pub fn causal_softmax_backward<B: Backend, const D: usize>(
    probabilities: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> Tensor<B, D> {
    let along_row = (probabilities.clone() * grad.clone()).sum_dim(D - 1);
    probabilities * (grad - along_row)
}

/// `SiLU(x) = x·σ(x)`, with σ from [`sigmoid`].
pub fn silu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clone() * sigmoid(x)
}

/// `σ(x) = 1 / (1 + e^{−x})` in the tensor's own precision.
///
/// In f32, Burn's `sigmoid`: one exponential per element, and a backward pass `σ(1 − σ)·g` that
/// is finite for every finite `x` (on Flex, the `tanh` it replaces took 15% of a training step;
/// docs/notebook/cpu-speed.md). Burn's default `sigmoid` (NdArray's) rounds through f32 whatever the
/// float type, so other precisions use the identity `σ(x) = (1 + tanh(x/2))/2`, which stays in
/// the backend's precision and, unlike `1 / (1 + e^{−x})`, has a finite gradient everywhere.
pub fn sigmoid<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match x.dtype() {
        DType::F32 => activation::sigmoid(x),
        _ => (x * 0.5).tanh() * 0.5 + 0.5,
    }
}
