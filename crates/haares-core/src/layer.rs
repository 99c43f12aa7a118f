//! One Transformer layer: two residual events, attention (event 2i) then MLP (event 2i+1), each
//! `u = f(Norm(x))` (eq:sublayer). What each reads and what becomes of its output is the model's
//! [`ResidualStream`](crate::stream::ResidualStream)'s.

use burn::module::Module;
use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::attention::{CausalSelfAttention, CausalSelfAttentionConfig};
use crate::config::ModelConfig;
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::ops::HaaresBackend;
use crate::rotary::RotaryTable;
use crate::swiglu::{SwiGluMlp, SwiGluMlpConfig};

/// Which sublayer a residual event runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sublayer {
    /// Causal self-attention (even events).
    Attention,
    /// SwiGLU MLP (odd events).
    Mlp,
}

impl Sublayer {
    /// The sublayer of residual event `event` (0-based): layer i's attention is event 2i, its MLP
    /// event 2i+1.
    pub fn of_event(event: usize) -> Self {
        if event.is_multiple_of(2) {
            Self::Attention
        } else {
            Self::Mlp
        }
    }
}

/// A Transformer layer: its two sublayers and their PreNorms.
#[derive(Module, Debug)]
pub struct Layer<B: Backend> {
    /// PreNorm of the attention input.
    pub attn_norm: RmsNorm<B>,
    /// The attention sublayer.
    pub attn: CausalSelfAttention<B>,
    /// PreNorm of the MLP input.
    pub mlp_norm: RmsNorm<B>,
    /// The MLP sublayer.
    pub mlp: SwiGluMlp<B>,
}

impl<B: Backend> Layer<B> {
    /// Builds a layer for `config` (assumed validated). Its read sites' parameters (routers,
    /// gates, scales) are the model's [`ResidualStream`](crate::stream::ResidualStream)'s.
    pub fn new(config: &ModelConfig, device: &B::Device) -> Self {
        let norm = || {
            RmsNormConfig::new(config.d_model)
                .with_epsilon(config.norm_epsilon)
                .init(device)
        };
        Self {
            attn_norm: norm(),
            attn: CausalSelfAttentionConfig::new(config.d_model)
                .with_n_heads(config.n_heads)
                .with_init_std(config.init_std)
                .init(device),
            mlp_norm: norm(),
            mlp: SwiGluMlpConfig::new(config.d_model, config.d_ff)
                .with_init_std(config.init_std)
                .init(device),
        }
    }
}

impl<B: HaaresBackend> Layer<B> {
    /// eq:sublayer: `u = f(Norm(x))` for the given sublayer.
    ///
    /// # Shapes
    /// - input: `[batch, seq, d]`
    /// - output: `[batch, seq, d]`
    pub fn sublayer(
        &self,
        sublayer: Sublayer,
        input: Tensor<B, 3>,
        rope: &RotaryTable<B>,
    ) -> Tensor<B, 3> {
        self.transform(sublayer, self.norm(sublayer).forward(input), rope)
    }

    /// The PreNorm of a sublayer's input: `Norm` of eq:sublayer.
    pub fn norm(&self, sublayer: Sublayer) -> &RmsNorm<B> {
        match sublayer {
            Sublayer::Attention => &self.attn_norm,
            Sublayer::Mlp => &self.mlp_norm,
        }
    }

    /// `f` of eq:sublayer on an input already normalised by [`norm`](Self::norm) (the routed
    /// methods' reads normalise their mixture in the read, [`DepthRouter::forward_fused_normed`](crate::router::DepthRouter::forward_fused_normed)).
    ///
    /// # Shapes
    /// - normed, output: `[batch, seq, d]`
    pub fn transform(
        &self,
        sublayer: Sublayer,
        normed: Tensor<B, 3>,
        rope: &RotaryTable<B>,
    ) -> Tensor<B, 3> {
        match sublayer {
            Sublayer::Attention => self.attn.forward(normed, rope),
            Sublayer::Mlp => self.mlp.forward(normed),
        }
    }
}
