//! The HAARES Transformer and its baselines: embedding, 2L residual events read and written
//! through the configured residual method's [`ResidualStream`], the final readout (eq:final),
//! final RMSNorm and the tied head.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Initializer};
use burn::tensor::{ElementConversion, Int, Tensor, backend::Backend};

use crate::config::ModelConfig;
use crate::error::{HaaresError, Result};
use crate::layer::{Layer, Sublayer};
use crate::materialise::materialise;
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::ops::HaaresBackend;
use crate::rotary::RotaryTable;
use crate::router::DepthRouter;
use crate::stream::{ResidualStream, ResidualStreamConfig};
use crate::telemetry::{ReadSite, RoutingTrace};

impl ModelConfig {
    /// Builds a model with the paper's initialisation: Linear and embedding weights N(0, σ²),
    /// norm weights one, router queries zero, detail biases at their initial value, ReZero gates
    /// zero, LayerScale at its initial scale. Weights are drawn from the backend's global RNG
    /// (seed it with `B::seed`).
    ///
    /// Every parameter is materialised before returning. Burn initialises parameters lazily, and
    /// a clone of a not-yet-initialised parameter draws its own independent values; materialising
    /// makes clones of the returned model share its weights, as users expect.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<HaaresModel<B>> {
        let model = self.init_lazy(device)?;
        materialise(&model);
        Ok(model)
    }

    /// [`init`](Self::init) without materialising: for callers that replace every parameter.
    pub(crate) fn init_lazy<B: Backend>(&self, device: &B::Device) -> Result<HaaresModel<B>> {
        self.validate()?;
        Ok(HaaresModel {
            embed: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: self.init_std,
                })
                .init(device),
            layers: (0..self.n_layers)
                .map(|_| Layer::new(self, device))
                .collect(),
            final_norm: RmsNormConfig::new(self.d_model)
                .with_epsilon(self.norm_epsilon)
                .init(device),
            stream: self.stream_config().init(device)?,
            rope: RotaryTable::new(
                self.head_dim(),
                self.n_heads,
                self.max_seq_len,
                self.rope_base,
                device,
            ),
            config: self.clone(),
        })
    }

    /// The residual stream of this model: its 2L events, N blocks, method and routing path.
    pub fn stream_config(&self) -> ResidualStreamConfig {
        ResidualStreamConfig::new(self.d_model, self.events(), self.blocks)
            .with_method(self.method)
            .with_norm_epsilon(self.norm_epsilon)
            .with_routing(self.routing)
            .with_layer_scale_depth(Some(self.n_layers))
    }
}

/// A decoder-only causal PreNorm Transformer (App. A) whose residual method is one of the paper's:
/// Standard, ReZero, LayerScale, Block AttnRes or HAARES with any of its ablations.
#[derive(Module, Debug)]
pub struct HaaresModel<B: Backend> {
    /// Token embedding `[V, d]`, tied to the output head.
    pub embed: Embedding<B>,
    /// The L layers.
    pub layers: Vec<Layer<B>>,
    /// RMSNorm before the tied head (docs/decisions.md, decision 3).
    pub final_norm: RmsNorm<B>,
    /// The residual method's parameters and protocol: the 2L read sites' routers and the final
    /// router (routed methods), the ReZero gates or LayerScale scales.
    pub stream: ResidualStream<B>,
    /// Shared RoPE table (not a parameter).
    pub rope: RotaryTable<B>,
    /// The configuration the model was built from.
    #[module(skip)]
    pub config: ModelConfig,
}

impl<B: Backend> HaaresModel<B> {
    /// The router of a read site: event `2i` reads through layer i's attention router, `2i + 1`
    /// through its MLP router; `None` for unrouted methods or an event past the last layer.
    pub fn router_at(&self, site: ReadSite) -> Option<&DepthRouter<B>> {
        self.stream.router_at(site)
    }
}

impl<B: HaaresBackend> HaaresModel<B> {
    /// Next-token logits for a batch of token ids, after checking the batch: rank-2 shape,
    /// sequence length at most `max_seq_len`, every id below `vocab_size`.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - output: `[batch, seq, vocab]`
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>> {
        self.check_tokens(&tokens)?;
        Ok(self.run(tokens, None))
    }

    /// Like [`forward`](Self::forward), and also returns the routing weights of every read site
    /// (empty for unrouted methods).
    pub fn forward_with_trace(
        &self,
        tokens: Tensor<B, 2, Int>,
    ) -> Result<(Tensor<B, 3>, RoutingTrace<B>)> {
        self.check_tokens(&tokens)?;
        let mut trace = RoutingTrace::default();
        let logits = self.run(tokens, Some(&mut trace));
        Ok((logits, trace))
    }

    /// [`forward`](Self::forward) without the input checks, for hot loops whose data pipeline
    /// already guarantees valid ids (the range check reads the batch back from the device).
    pub fn forward_unchecked(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.run(tokens, None)
    }

    /// [`forward_with_trace`](Self::forward_with_trace) without the input checks (see
    /// [`forward_unchecked`](Self::forward_unchecked)).
    pub fn forward_with_trace_unchecked(
        &self,
        tokens: Tensor<B, 2, Int>,
    ) -> (Tensor<B, 3>, RoutingTrace<B>) {
        let mut trace = RoutingTrace::default();
        let logits = self.run(tokens, Some(&mut trace));
        (logits, trace)
    }

    /// Validates a token batch: shape, length and id range.
    pub fn check_tokens(&self, tokens: &Tensor<B, 2, Int>) -> Result<()> {
        let [batch, seq] = tokens.dims();
        if batch == 0 || seq == 0 {
            return Err(HaaresError::InvalidInput(format!(
                "token batch of shape [{batch}, {seq}] is empty; pass at least one token"
            )));
        }
        if seq > self.config.max_seq_len {
            return Err(HaaresError::InvalidInput(format!(
                "sequence length {seq} exceeds the RoPE cache of {} positions; shorten the sequence or raise `max_seq_len`",
                self.config.max_seq_len
            )));
        }
        let min: i64 = tokens.clone().min().into_scalar().elem();
        let max: i64 = tokens.clone().max().into_scalar().elem();
        if min < 0 || max >= self.config.vocab_size as i64 {
            return Err(HaaresError::InvalidInput(format!(
                "token ids span [{min}, {max}] but the vocabulary has {} entries (valid ids 0..={}); check the tokenizer matches the model",
                self.config.vocab_size,
                self.config.vocab_size - 1
            )));
        }
        Ok(())
    }

    fn run(&self, tokens: Tensor<B, 2, Int>, trace: Option<&mut RoutingTrace<B>>) -> Tensor<B, 3> {
        self.hidden(self.embed.forward(tokens), trace)
            .map(|normed| self.tied_head(normed))
            .expect("the model walks its stream in order, from an embedding of its own width")
    }

    /// eq:sublayer for every layer, attention (event 2i) then MLP (event 2i + 1), each reading
    /// its input through the residual stream and writing its output back; then the final
    /// readout through the final norm (Algorithm alg:haares and eq:final for the routed methods).
    fn hidden(
        &self,
        embedding: Tensor<B, 3>,
        trace: Option<&mut RoutingTrace<B>>,
    ) -> Result<Tensor<B, 3>> {
        let mut state = self.stream.start(embedding, trace)?;
        for (i, layer) in self.layers.iter().enumerate() {
            for (event, sublayer) in [(2 * i, Sublayer::Attention), (2 * i + 1, Sublayer::Mlp)] {
                let normed = state.read_normed(event, layer.norm(sublayer))?;
                state.write(event, layer.transform(sublayer, normed, &self.rope))?;
            }
        }
        state.finish_normed(&self.final_norm)
    }

    /// The tied language-model head: logits `= h Eᵀ`.
    fn tied_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = hidden.dims();
        let weight = self.embed.weight.val();
        let vocab = weight.dims()[0];
        B::matmul_transposed_rhs(hidden.reshape([batch * seq, d_model]), weight)
            .reshape([batch, seq, vocab])
    }
}
