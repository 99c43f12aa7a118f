//! A small decoder whose sublayers are not haares's: an RWKV-style token shift, Burn's own
//! `MultiHeadAttention` and a GELU MLP, each behind Burn's `LayerNorm`, three residual events per
//! layer, read and written through a haares [`ResidualStream`]. The stream is the only haares
//! part; any method of the paper runs it.
//!
//! `tests/core/stream.rs` checks this model against a hand-written loop of eq:sourceset.

use burn::config::Config;
use burn::module::Module;
use burn::nn::attention::{
    MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, generate_autoregressive_mask,
};
use burn::nn::{
    Embedding, EmbeddingConfig, Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::tensor::{Int, Tensor, backend::Backend};
use haares_core::{
    HaaresBackend, ResidualMethod, ResidualStream, ResidualStreamConfig, RoutingPath, RoutingTrace,
    materialise,
};

/// Residual events per layer: token shift, attention, MLP.
pub const SUBLAYERS: usize = 3;

/// Configuration of a [`ForeignDecoder`].
#[derive(Config, Debug)]
pub struct ForeignDecoderConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width d. Default: 64.
    #[config(default = 64)]
    pub d_model: usize,
    /// Layers L (3L residual events). Default: 3.
    #[config(default = 3)]
    pub n_layers: usize,
    /// Attention heads. Default: 4.
    #[config(default = 4)]
    pub n_heads: usize,
    /// Block count N of the routed methods. Default: 3 (blocks of m = 3 events at 3 layers).
    #[config(default = 3)]
    pub blocks: usize,
    /// The residual method. Default: HAARES.
    #[config(default = "ResidualMethod::haares()")]
    pub method: ResidualMethod,
    /// The routing path. Default: `Auto`.
    #[config(default = "RoutingPath::Auto")]
    pub routing: RoutingPath,
}

impl ForeignDecoderConfig {
    /// Builds the decoder, with Burn's default initialisation for its own modules, every
    /// parameter materialised so that clones share it.
    pub fn init<B: Backend>(&self, device: &B::Device) -> haares_core::Result<ForeignDecoder<B>> {
        let d = self.d_model;
        let stream = ResidualStreamConfig::new(d, SUBLAYERS * self.n_layers, self.blocks)
            .with_method(self.method)
            .with_routing(self.routing)
            .with_layer_scale_depth(Some(self.n_layers))
            .init(device)?;
        let layer = || ForeignLayer {
            norms: (0..SUBLAYERS)
                .map(|_| LayerNormConfig::new(d).init(device))
                .collect(),
            shift: LinearConfig::new(2 * d, d).init(device),
            attention: MultiHeadAttentionConfig::new(d, self.n_heads)
                .with_dropout(0.0)
                .init(device),
            up: LinearConfig::new(d, 4 * d).init(device),
            down: LinearConfig::new(4 * d, d).init(device),
            gelu: Gelu::new(),
        };
        let decoder = ForeignDecoder {
            embed: EmbeddingConfig::new(self.vocab_size, d).init(device),
            layers: (0..self.n_layers).map(|_| layer()).collect(),
            final_norm: LayerNormConfig::new(d).init(device),
            head: LinearConfig::new(d, self.vocab_size).init(device),
            stream,
        };
        // Burn draws lazily, and a clone of an undrawn parameter draws again on its own.
        materialise(&decoder);
        Ok(decoder)
    }
}

/// One layer: three sublayers, each with its own PreNorm.
#[derive(Module, Debug)]
pub struct ForeignLayer<B: Backend> {
    /// The PreNorm of each sublayer.
    pub norms: Vec<LayerNorm<B>>,
    /// Token shift: `W [x_t; x_{t−1}]`.
    pub shift: Linear<B>,
    /// Burn's causal multi-head attention.
    pub attention: MultiHeadAttention<B>,
    /// The MLP's expansion.
    pub up: Linear<B>,
    /// The MLP's projection back.
    pub down: Linear<B>,
    gelu: Gelu,
}

impl<B: Backend> ForeignLayer<B> {
    /// Sublayer `k` (0 token shift, 1 attention, 2 MLP) on its input, PreNorm included:
    /// `u = f_k(LayerNorm_k(x))`.
    ///
    /// # Shapes
    /// - input, output: `[batch, seq, d]`
    pub fn sublayer(&self, k: usize, input: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = self.norms[k].forward(input);
        match k {
            0 => self.token_shift(x),
            1 => {
                let [batch, seq, _] = x.dims();
                let mask = generate_autoregressive_mask(batch, seq, &x.device());
                self.attention
                    .forward(MhaInput::self_attn(x).mask_attn(mask))
                    .context
            }
            _ => self.down.forward(self.gelu.forward(self.up.forward(x))),
        }
    }

    /// Each token mixed with its predecessor (zeros before the first), as RWKV's token shift.
    fn token_shift(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, d] = x.dims();
        let before = Tensor::zeros([batch, 1, d], &x.device());
        let previous = match seq {
            1 => before,
            _ => Tensor::cat(vec![before, x.clone().narrow(1, 0, seq - 1)], 1),
        };
        self.shift.forward(Tensor::cat(vec![x, previous], 2))
    }
}

/// The decoder: embedding, L layers of three sublayers through the residual stream, LayerNorm and
/// an untied head.
#[derive(Module, Debug)]
pub struct ForeignDecoder<B: Backend> {
    /// Token embedding.
    pub embed: Embedding<B>,
    /// The layers.
    pub layers: Vec<ForeignLayer<B>>,
    /// The norm before the head.
    pub final_norm: LayerNorm<B>,
    /// The output head.
    pub head: Linear<B>,
    /// The residual method: what each sublayer reads, what its output is added to.
    pub stream: ResidualStream<B>,
}

impl<B: HaaresBackend> ForeignDecoder<B> {
    /// Next-token logits, and the routing weights of every read site into `trace` if given.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - output: `[batch, seq, vocab]`
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        trace: Option<&mut RoutingTrace<B>>,
    ) -> haares_core::Result<Tensor<B, 3>> {
        let mut stream = self.stream.start(self.embed.forward(tokens), trace)?;
        for (i, layer) in self.layers.iter().enumerate() {
            for k in 0..SUBLAYERS {
                let event = SUBLAYERS * i + k;
                let input = stream.read(event)?;
                stream.write(event, layer.sublayer(k, input))?;
            }
        }
        let hidden = stream.finish()?;
        Ok(self.head.forward(self.final_norm.forward(hidden)))
    }
}
