//! Causal multi-head self-attention of the backbone (App. A): bias-free Q, K, V and output
//! projections, RoPE on queries and keys, softmax(QKᵀ/√d_h)V under a causal mask.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, RotaryEncoding, RotaryEncodingConfig};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Tensor, backend::Backend};

use crate::mlp::linear_no_bias;

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
        CausalSelfAttention { wq: linear(), wk: linear(), wv: linear(), wo: linear(), n_heads: self.n_heads }
    }
}

/// The rotary table shared by every layer: interleaved pairs `(2i, 2i+1)` of each head rotated by
/// `pos · base^(−2i/d_h)` (NOTES decision 5), cached for `max_seq_len` positions.
pub fn rotary_table<B: Backend>(head_dim: usize, max_seq_len: usize, base: f64, device: &B::Device) -> RotaryEncoding<B> {
    RotaryEncodingConfig::new(max_seq_len, head_dim).with_theta(base as f32).init(device)
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
    pub fn forward(&self, x: Tensor<B, 3>, rope: &RotaryEncoding<B>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = x.dims();
        let head_dim = d_model / self.n_heads;
        let heads = |projection: &Linear<B>| {
            projection.forward(x.clone()).reshape([batch, seq, self.n_heads, head_dim]).swap_dims(1, 2)
        };
        let query = rope.forward(heads(&self.wq));
        let key = rope.forward(heads(&self.wk));
        let value = heads(&self.wv);
        let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
        let context = attention(query, key, value, None, None, options);
        self.wo.forward(context.swap_dims(1, 2).reshape([batch, seq, d_model]))
    }
}
