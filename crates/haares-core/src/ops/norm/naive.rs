//! The plain tensor-operation forms of affine RMSNorm: the reference for every kernel and graph
//! node of [`super`].

use burn::tensor::{Tensor, backend::Backend};

/// The plain form of [`NormBackend::rms_norm`](super::NormBackend::rms_norm): `x / rms ⊙ w` per
/// row.
///
/// A division, not a multiplication by `recip`: Burn's NdArray computes an f32 `recip` with the
/// approximate SIMD instruction (≈ 1e-4 relative error) once tensors are large.
pub fn rms_norm<B: Backend>(x: Tensor<B, 2>, weight: Tensor<B, 1>, epsilon: f64) -> Tensor<B, 2> {
    let rms = (x.clone().square().mean_dim(1) + epsilon).sqrt();
    x / rms * weight.unsqueeze::<2>()
}

/// The plain form of [`NormBackend::rms_norm_backward`](super::NormBackend::rms_norm_backward):
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
