//! Affine RMSNorm with the paper's ε = 1e-6 (tab:reprobackbone).
//!
//! Burn ships `nn::RmsNorm`, but it always reduces in f32; this one reduces in the backend's
//! float type so that an f64 backend reproduces the model exactly (the reference tests need
//! 1e-9 agreement). On the fp32 training backends the two are the same computation.

use crate::ops::HaaresBackend;
use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::{Tensor, backend::Backend};

/// Configuration of an [`RmsNorm`].
#[derive(Config, Debug)]
pub struct RmsNormConfig {
    /// Width of the normalised (last) dimension.
    pub d_model: usize,
    /// ε inside the square root. Default: 1e-6 (the paper's; Burn's own default is 1e-5).
    #[config(default = 1e-6)]
    pub epsilon: f64,
}

impl RmsNormConfig {
    /// A norm with its weight initialised to ones.
    pub fn init<B: Backend>(&self, device: &B::Device) -> RmsNorm<B> {
        RmsNorm {
            weight: Param::from_tensor(Tensor::ones([self.d_model], device)),
            epsilon: self.epsilon,
        }
    }
}

/// `RMSNorm(x) = x / sqrt(mean(x²) + ε) ⊙ w`, reduced over the last (hidden) dimension at every
/// (batch, position) separately.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// The affine weight `w`, initialised to ones.
    pub weight: Param<Tensor<B, 1>>,
    /// ε inside the square root.
    pub epsilon: f64,
}

impl<B: HaaresBackend> RmsNorm<B> {
    /// Normalises `x` over its last dimension, as one operation
    /// ([`NormBackend::rms_norm`](crate::ops::NormBackend::rms_norm): one kernel per direction on
    /// the cube backends).
    ///
    /// # Shapes
    /// - x: `[..., d]`
    /// - output: `[..., d]`
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        // On the `[tokens, d]` matrix, the layout the fused router uses (see `source_bank::rows`).
        let dims = x.dims();
        let width = dims[D - 1];
        let rows = x.reshape([dims.iter().product::<usize>() / width.max(1), width]);
        B::rms_norm(rows, self.weight.val(), self.epsilon).reshape(dims)
    }
}

/// Per-token root mean square over the last dimension, `RMS(x) = sqrt(mean(x²))`, kept as a
/// size-1 last dimension so that it broadcasts against `x` (docs/decisions.md, decision 1).
///
/// # Shapes
/// - x: `[..., d]`
/// - output: `[..., 1]`
pub fn rms<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.square().mean_dim(D - 1).sqrt()
}
