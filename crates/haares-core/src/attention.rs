//! Causal multi-head self-attention of the backbone (App. A): bias-free Q, K, V and output
//! projections, RoPE on queries and keys, softmax(QKᵀ/√d_h)V under a causal mask.

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Tensor, backend::Backend};

use crate::activation_ops::ActivationBackend;
use crate::mlp::{linear_no_bias, project};
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

impl<B: ActivationBackend> CausalSelfAttention<B> {
    /// Attends causally over an already normalised input.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d]`
    /// - output: `[batch, seq, d]`
    pub fn forward(&self, x: Tensor<B, 3>, rope: &RotaryTable<B>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = x.dims();
        let head_dim = d_model / self.n_heads;
        // RoPE runs on each projection's own `[batch, seq, heads, d_h]` layout, which is
        // contiguous; only then are the heads moved in front of the positions.
        let rows = x.reshape([batch * seq, d_model]);
        let heads = |projection: &Linear<B>| {
            project(projection, rows.clone()).reshape([batch, seq, self.n_heads, head_dim])
        };
        let query = rope.apply(heads(&self.wq), 1.0 / (head_dim as f64).sqrt());
        let key = rope.apply(heads(&self.wk), 1.0);
        let context = causal_attention(
            B::swap_heads(query),
            B::swap_heads(key),
            B::swap_heads(heads(&self.wv)),
        );
        let context = B::swap_heads(context).reshape([batch * seq, d_model]);
        project(&self.wo, context).reshape([batch, seq, d_model])
    }
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
pub fn causal_attention<B: ActivationBackend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let probabilities = B::causal_softmax(B::matmul_transposed_rhs(query, key));
    B::matmul(probabilities, value)
}
