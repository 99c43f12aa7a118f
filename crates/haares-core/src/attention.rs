//! Causal multi-head self-attention of the backbone (App. A): bias-free Q, K, V and output
//! projections, RoPE on queries and keys, softmax(QKᵀ/√d_h)V under a causal mask.

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Tensor, backend::Backend};

use crate::mlp::linear_no_bias;
use crate::rope::RotaryTable;

/// Configuration of a [`CausalSelfAttention`].
#[derive(Config, Debug)]
pub struct CausalSelfAttentionConfig {
    /// Hidden width d.
    pub d_model: usize,
    /// Number of heads. Default: 8.
    #[config(default = 8)]
    pub n_heads: usize,
    /// Standard deviation of the N(0, σ²) weight initialisation. Default: 0.02.
    #[config(default = 0.02)]
    pub init_std: f64,
}

impl CausalSelfAttentionConfig {
    /// The four projections, initialised N(0, σ²).
    pub fn init<B: Backend>(&self, device: &B::Device) -> CausalSelfAttention<B> {
        let linear = || linear_no_bias(self.d_model, self.d_model, self.init_std, device);
        CausalSelfAttention {
            wq: linear(),
            wk: linear(),
            wv: linear(),
            wo: linear(),
            n_heads: self.n_heads,
        }
    }
}

/// The attention sublayer f of eq:sublayer for even events.
#[derive(Module, Debug)]
pub struct CausalSelfAttention<B: Backend> {
    /// Query projection.
    pub wq: Linear<B>,
    /// Key projection.
    pub wk: Linear<B>,
    /// Value projection.
    pub wv: Linear<B>,
    /// Output projection.
    pub wo: Linear<B>,
    /// Number of heads.
    pub n_heads: usize,
}

impl<B: Backend> CausalSelfAttention<B> {
    /// Attends causally over an already normalised input.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d]`
    /// - output: `[batch, seq, d]`
    pub fn forward(&self, x: Tensor<B, 3>, rope: &RotaryTable<B>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = x.dims();
        let head_dim = d_model / self.n_heads;
        let heads = |projection: &Linear<B>| {
            projection
                .forward(x.clone())
                .reshape([batch, seq, self.n_heads, head_dim])
                .swap_dims(1, 2)
        };
        let query = rope.apply(heads(&self.wq));
        let key = rope.apply(heads(&self.wk));
        let value = heads(&self.wv);
        let options = AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        let context = attention(query, key, value, None, None, options);
        self.wo
            .forward(context.swap_dims(1, 2).reshape([batch, seq, d_model]))
    }
}
