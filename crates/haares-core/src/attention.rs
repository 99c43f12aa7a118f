//! Causal multi-head self-attention of the backbone (App. A): bias-free Q, K, V and output
//! projections, RoPE on queries and keys, softmax(QKᵀ/√d_h)V under a causal mask.

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Tensor, backend::Backend};

use crate::ops::HaaresBackend;
use crate::rotary::RotaryTable;
use crate::swiglu::{linear_no_bias, packable, project};

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

impl<B: HaaresBackend> CausalSelfAttention<B> {
    /// Attends causally over an already normalised input.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d]`
    /// - output: `[batch, seq, d]`
    pub fn forward(&self, x: Tensor<B, 3>, rope: &RotaryTable<B>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = x.dims();
        let head_dim = d_model / self.n_heads;
        let rows = x.reshape([batch * seq, d_model]);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let projections = [&self.wq, &self.wk, &self.wv];
        // On the GPU backends Q, K and V are one product, which RoPE and attention read in place
        // (docs/decisions.md, decision 23).
        if let Some(weights) = packable(&projections, B::packs_projections()) {
            let qkv =
                B::projections(rows, weights).reshape([batch, seq, 3 * self.n_heads, head_dim]);
            let (cos, sin, turn) = rope.tables();
            let context = B::causal_attention_packed(qkv, cos, sin, turn, scale);
            return project(&self.wo, context.reshape([batch * seq, d_model]))
                .reshape([batch, seq, d_model]);
        }
        // RoPE and attention take each projection's own `[batch, seq, heads, d_h]` layout, which
        // is contiguous; the plain attention moves the heads in front of the positions itself.
        let heads = |projection: &Linear<B>| {
            project(projection, rows.clone()).reshape([batch, seq, self.n_heads, head_dim])
        };
        let query = rope.apply(heads(&self.wq), scale);
        let key = rope.apply(heads(&self.wk), 1.0);
        let context =
            B::causal_attention(query, key, heads(&self.wv)).reshape([batch * seq, d_model]);
        project(&self.wo, context).reshape([batch, seq, d_model])
    }
}
