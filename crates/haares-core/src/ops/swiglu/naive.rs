//! The plain tensor-operation forms of SwiGLU: the reference for every loop, kernel and graph
//! node of [`super`], with the sigmoid and SiLU they are built from.

use burn::tensor::activation;
use burn::tensor::{DType, Tensor, backend::Backend};

use super::SwigluBackend;
use crate::ops::projections::naive::unpack_gate_up;

/// The plain form of [`SwigluBackend::swiglu`]: `SiLU(gate) ⊙ up`.
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    silu(gate) * up
}

/// The plain form of [`SwigluBackend::swiglu_backward`]:
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

/// The plain form of [`SwigluBackend::swiglu_packed`]:
/// [`swiglu`](SwigluBackend::swiglu) of the two halves.
pub fn swiglu_packed<B: SwigluBackend>(gate_up: Tensor<B, 2>) -> Tensor<B, 2> {
    let [gate, up] = unpack_gate_up(gate_up);
    B::swiglu(gate, up)
}

/// The plain form of
/// [`SwigluBackend::swiglu_packed_backward`]:
/// SwiGLU's two gradients, joined as the halves they belong to.
pub fn swiglu_packed_backward<B: SwigluBackend>(
    gate_up: Tensor<B, 2>,
    grad: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let [gate, up] = unpack_gate_up(gate_up);
    let (gate_grad, up_grad) = B::swiglu_backward(gate, up, grad);
    Tensor::cat(vec![gate_grad, up_grad], 1)
}

/// `SiLU(x) = x·σ(x)`, with σ from [`sigmoid`].
pub fn silu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clone() * sigmoid(x)
}

/// `σ(x) = 1 / (1 + e^{−x})` in the tensor's own precision.
///
/// In f32, Burn's `sigmoid`: one exponential per element, and a backward pass `σ(1 − σ)·g` that is
/// finite for every finite `x` (on Flex, the `tanh` it replaces took 15% of a training step;
/// docs/notebook/cpu-speed.md). Burn's default `sigmoid` (NdArray's) rounds through f32 whatever
/// the float type, so other precisions use the identity `σ(x) = (1 + tanh(x/2))/2`, which stays in
/// the backend's precision and, unlike `1 / (1 + e^{−x})`, has a finite gradient everywhere.
pub fn sigmoid<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match x.dtype() {
        DType::F32 => activation::sigmoid(x),
        _ => (x * 0.5).tanh() * 0.5 + 0.5,
    }
}
