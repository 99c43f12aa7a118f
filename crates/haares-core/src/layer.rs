//! One Transformer layer: two residual events, attention (event 2i) then MLP (event 2i+1), each
//! `u = f(Norm(x))` (eq:sublayer) with the read-side parameters of the configured residual method.

use burn::module::{Module, Param};
use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::attention::{CausalSelfAttention, CausalSelfAttentionConfig};
use crate::config::{ModelConfig, ResidualMethod, layer_scale_init};
use crate::mlp::{SwiGluMlp, SwiGluMlpConfig};
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::ops::HaaresBackend;
use crate::rope::RotaryTable;
use crate::router::{DepthRouter, DepthRouterConfig};

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

/// A Transformer layer with the parameters of its two read sites.
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
    /// Depth router of the attention read site (Block AttnRes, HAARES).
    pub attn_router: Option<DepthRouter<B>>,
    /// Depth router of the MLP read site (Block AttnRes, HAARES).
    pub mlp_router: Option<DepthRouter<B>>,
    /// ReZero scalar gate of the attention update `[1]`, zero-initialised.
    pub attn_gate: Option<Param<Tensor<B, 1>>>,
    /// ReZero scalar gate of the MLP update `[1]`, zero-initialised.
    pub mlp_gate: Option<Param<Tensor<B, 1>>>,
    /// LayerScale per-channel scale of the attention update `[d]`.
    pub attn_scale: Option<Param<Tensor<B, 1>>>,
    /// LayerScale per-channel scale of the MLP update `[d]`.
    pub mlp_scale: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Layer<B> {
    /// Builds a layer for `config` (assumed validated).
    pub fn new(config: &ModelConfig, device: &B::Device) -> Self {
        let norm = || {
            RmsNormConfig::new(config.d_model)
                .with_epsilon(config.norm_epsilon)
                .init(device)
        };
        let router = || {
            let detail_bias = config
                .method
                .haares_options()
                .map(|options| options.detail_bias);
            Some(
                DepthRouterConfig::new(config.d_model)
                    .with_detail_bias(detail_bias)
                    .with_norm_epsilon(config.norm_epsilon)
                    .init(device),
            )
        };
        let constant = |shape: usize, value: f64| {
            Some(Param::from_tensor(Tensor::full([shape], value, device)))
        };
        let (gates, scales, routed) = match config.method {
            ResidualMethod::Standard => (false, None, false),
            ResidualMethod::ReZero => (true, None, false),
            ResidualMethod::LayerScale { init } => (
                false,
                Some(init.unwrap_or(layer_scale_init(config.n_layers))),
                false,
            ),
            ResidualMethod::BlockAttnRes | ResidualMethod::Haares(_) => (false, None, true),
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
            attn_router: if routed { router() } else { None },
            mlp_router: if routed { router() } else { None },
            attn_gate: if gates { constant(1, 0.0) } else { None },
            mlp_gate: if gates { constant(1, 0.0) } else { None },
            attn_scale: scales.and_then(|init| constant(config.d_model, init)),
            mlp_scale: scales.and_then(|init| constant(config.d_model, init)),
        }
    }

    /// The depth router of a read site, if the method routes.
    pub fn router(&self, sublayer: Sublayer) -> Option<&DepthRouter<B>> {
        match sublayer {
            Sublayer::Attention => self.attn_router.as_ref(),
            Sublayer::Mlp => self.mlp_router.as_ref(),
        }
    }

    /// The additive update of the unrouted methods: `h + u` (Standard), `h + g·u` (ReZero) or
    /// `h + λ ⊙ u` (LayerScale) (docs/decisions.md, decision 4).
    ///
    /// # Shapes
    /// - hidden, output: `[batch, seq, d]`
    pub fn residual_update(
        &self,
        sublayer: Sublayer,
        hidden: Tensor<B, 3>,
        output: Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let (gate, scale) = match sublayer {
            Sublayer::Attention => (&self.attn_gate, &self.attn_scale),
            Sublayer::Mlp => (&self.mlp_gate, &self.mlp_scale),
        };
        match (gate, scale) {
            (Some(gate), _) => hidden + output * gate.val().unsqueeze::<3>(),
            (None, Some(scale)) => hidden + output * scale.val().unsqueeze::<3>(),
            (None, None) => hidden + output,
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
    /// methods' reads normalise their mixture in the read, [`DepthRouter::forward_fused_normed`]).
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
