//! The SwiGLU MLP of the backbone (App. A): `W_down (SiLU(W_gate x) ⊙ W_up x)`, bias-free.

use crate::ops::HaaresBackend;
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::{Tensor, backend::Backend};

/// Configuration of a [`SwiGluMlp`].
#[derive(Config, Debug)]
pub struct SwiGluMlpConfig {
    /// Hidden width d.
    pub d_model: usize,
    /// Inner width d_ff.
    pub d_ff: usize,
    /// Standard deviation of the N(0, σ²) weight initialisation. Default: 0.02.
    #[config(default = 0.02)]
    pub init_std: f64,
}

impl SwiGluMlpConfig {
    /// The three projections, initialised N(0, σ²).
    pub fn init<B: Backend>(&self, device: &B::Device) -> SwiGluMlp<B> {
        let linear = |d_in, d_out| linear_no_bias(d_in, d_out, self.init_std, device);
        SwiGluMlp {
            w_gate: linear(self.d_model, self.d_ff),
            w_up: linear(self.d_model, self.d_ff),
            w_down: linear(self.d_ff, self.d_model),
        }
    }
}

/// A bias-free Linear layer initialised N(0, σ²); Burn stores its weight as `[d_in, d_out]`.
pub(crate) fn linear_no_bias<B: Backend>(
    d_in: usize,
    d_out: usize,
    std: f64,
    device: &B::Device,
) -> Linear<B> {
    LinearConfig::new(d_in, d_out)
        .with_bias(false)
        .with_initializer(Initializer::Normal { mean: 0.0, std })
        .init(device)
}

/// `x W (+ b)` by `layer` for token rows `x`, one product
/// ([`MatmulBackend::matmul`](crate::ops::MatmulBackend::matmul)).
///
/// The model's projections take `[batch·seq, d]` rows, reshaped once per sublayer: a single
/// product (where Burn's `Linear` multiplies `[batch, seq, d]` batch row by batch row, and sums
/// its weight's gradient over them afterwards), and on NdArray, which copies a reshape of a tensor
/// held elsewhere, one copy of the input where a reshape per projection would make three.
///
/// # Shapes
/// - x: `[tokens, d_in]`
/// - output: `[tokens, d_out]`
pub fn project<B: HaaresBackend>(layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let product = B::matmul(x, layer.weight.val());
    match &layer.bias {
        Some(bias) => product + bias.val().unsqueeze::<2>(),
        None => product,
    }
}

/// The weights of bias-free projections of one input, to multiply side by side
/// ([`ProjectionBackend::projections`](crate::ops::ProjectionBackend::projections)), where the
/// backend `packs` them (docs/decisions.md, decision 23); `None` keeps the separate products.
pub(crate) fn packable<B: Backend>(
    layers: &[&Linear<B>],
    packs: bool,
) -> Option<Vec<Tensor<B, 2>>> {
    let bias_free = layers.iter().all(|layer| layer.bias.is_none());
    (packs && bias_free).then(|| layers.iter().map(|layer| layer.weight.val()).collect())
}

/// SwiGLU feed-forward block (the MLP sublayer f of eq:sublayer for odd events).
#[derive(Module, Debug)]
pub struct SwiGluMlp<B: Backend> {
    /// Gate projection `d → d_ff`.
    pub w_gate: Linear<B>,
    /// Up projection `d → d_ff`.
    pub w_up: Linear<B>,
    /// Down projection `d_ff → d`.
    pub w_down: Linear<B>,
}

impl<B: HaaresBackend> SwiGluMlp<B> {
    /// Applies the MLP to an already normalised input, the gated product as one operation
    /// ([`SwigluBackend::swiglu`](crate::ops::SwigluBackend::swiglu)).
    ///
    /// # Shapes
    /// - x: `[batch, seq, d]`
    /// - output: `[batch, seq, d]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = x.dims();
        let rows = x.reshape([batch * seq, d_model]);
        if let Some(weights) = packable(&[&self.w_gate, &self.w_up], B::packs_projections()) {
            let gated = B::swiglu_packed(B::projections(rows, weights));
            return project(&self.w_down, gated).reshape([batch, seq, d_model]);
        }
        let gated = B::swiglu(
            project(&self.w_gate, rows.clone()),
            project(&self.w_up, rows),
        );
        project(&self.w_down, gated).reshape([batch, seq, d_model])
    }
}
