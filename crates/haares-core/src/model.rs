//! The HAARES Transformer and its baselines: embedding, 2L residual events read through the
//! configured residual method, the final readout (eq:final), final RMSNorm and the tied head.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Embedding, EmbeddingConfig, Initializer};
use burn::tensor::{ElementConversion, Int, Tensor, backend::Backend};

use crate::accumulator::{BlockAccumulator, detail_signs};
use crate::config::{DetailSource, ModelConfig, RoutingPath};
use crate::error::{HaaresError, Result};
use crate::layer::{Layer, Sublayer};
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::ops::{HaaresBackend, RmsMatching};
use crate::rms_match::{rms_match, rms_match_source};
use crate::rope::RotaryTable;
use crate::router::{DepthRouter, DepthRouterConfig, RouterOutput};
use crate::source_bank::{Source, SourceBank, rows};
use crate::telemetry::{ReadSite, RoutingTrace, SiteTrace, SlotId};

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
        model.visit(&mut Materialise);
        Ok(model)
    }

    /// [`init`](Self::init) without materialising: for callers that replace every parameter.
    pub(crate) fn init_lazy<B: Backend>(&self, device: &B::Device) -> Result<HaaresModel<B>> {
        self.validate()?;
        let final_router = self.method.is_routed().then(|| {
            DepthRouterConfig::new(self.d_model)
                .with_norm_epsilon(self.norm_epsilon)
                .init(device)
        });
        let signs = match self.method.haares_options() {
            Some(options) => detail_signs(options.detail, self.blocks, self.events_per_block()),
            None => Vec::new(),
        };
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
            final_router,
            rope: RotaryTable::new(
                self.head_dim(),
                self.n_heads,
                self.max_seq_len,
                self.rope_base,
                device,
            ),
            config: self.clone(),
            signs,
        })
    }
}

/// Touches every float parameter so that its lazy initialiser runs in place.
struct Materialise;

impl<B: Backend> ModuleVisitor<B> for Materialise {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        param.val();
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
    /// Router of the final readout over `{e, C_1 … C_N}` (routed methods only).
    pub final_router: Option<DepthRouter<B>>,
    /// Shared RoPE table (not a parameter).
    pub rope: RotaryTable<B>,
    /// The configuration the model was built from.
    #[module(skip)]
    pub config: ModelConfig,
    /// Detail signs `s_{n,r}`, `[block][event]` (HAARES variants only).
    #[module(skip)]
    pub signs: Vec<Vec<f64>>,
}

impl<B: Backend> HaaresModel<B> {
    /// The router of a read site: event `2i` reads through layer i's attention router, `2i + 1`
    /// through its MLP router; `None` for unrouted methods or an event past the last layer.
    pub fn router_at(&self, site: ReadSite) -> Option<&DepthRouter<B>> {
        match site {
            ReadSite::Event { event } => self
                .layers
                .get(event / 2)?
                .router(Sublayer::of_event(event)),
            ReadSite::Final => self.final_router.as_ref(),
        }
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
        let embedding = self.embed.forward(tokens);
        let normed = if self.config.method.is_routed() {
            self.routed_hidden(embedding, trace)
        } else {
            self.final_norm.forward(self.additive_hidden(embedding))
        };
        self.tied_head(normed)
    }

    /// Standard, ReZero and LayerScale: `h ← h + scale · f(Norm(h))` over all 2L events.
    fn additive_hidden(&self, embedding: Tensor<B, 3>) -> Tensor<B, 3> {
        (0..self.config.events()).fold(embedding, |hidden, event| {
            let layer = &self.layers[event / 2];
            let sublayer = Sublayer::of_event(event);
            let output = layer.sublayer(sublayer, hidden.clone(), &self.rope);
            layer.residual_update(sublayer, hidden, output)
        })
    }

    /// Block AttnRes and HAARES (Algorithm alg:haares for every block, then eq:final): each event
    /// reads the bank of eq:sourceset, its output is written to the active accumulators
    /// (eq:update), and completed pairs are cached at block boundaries. Returns the final
    /// readout through the final norm (each read takes the norm that follows it).
    fn routed_hidden(
        &self,
        embedding: Tensor<B, 3>,
        mut trace: Option<&mut RoutingTrace<B>>,
    ) -> Tensor<B, 3> {
        let events_per_block = self.config.events_per_block();
        let [batch, seq, _] = embedding.dims();
        let embedding = self.source(embedding);
        let mut completed: Vec<SourcePair<B>> = Vec::with_capacity(self.config.blocks);
        let mut active = self.accumulator();
        for event in 0..self.config.events() {
            let (block, r) = (event / events_per_block, event % events_per_block + 1);
            let active_pair = self.active_pair(&active, true, [batch, seq]);
            let bank = source_set(&embedding, &completed, active_pair);
            let layer = &self.layers[event / 2];
            let sublayer = Sublayer::of_event(event);
            let router = layer
                .router(sublayer)
                .expect("routed methods build a router per read site");
            let read = self.read(router, &bank, layer.norm(sublayer));
            if let Some(trace) = trace.as_deref_mut() {
                trace.sites.push(SiteTrace {
                    site: ReadSite::Event { event },
                    slots: SlotId::name_bank(bank.kinds(), block, r - 1),
                    weights: read.weights,
                });
            }
            let output = layer.transform(sublayer, read.mixture, &self.rope);
            match self.signs.get(block) {
                Some(signs) => active.write(rows(output), signs[r - 1]),
                None => active.write_cumulative(rows(output)),
            }
            if r == events_per_block {
                // The last block's detail is never read: the final readout is cumulative-only.
                let with_detail = block + 1 < self.config.blocks;
                let pair = self
                    .active_pair(&active, with_detail, [batch, seq])
                    .expect("a completed block holds m ≥ 1 writes");
                completed.push(pair);
                active = self.accumulator();
            }
        }
        self.final_readout(embedding, completed, trace)
    }

    /// eq:final: a separate router over `{e, C_1 … C_N}` only — never a detail slot — and the
    /// final norm.
    fn final_readout(
        &self,
        embedding: Source<B>,
        completed: Vec<SourcePair<B>>,
        trace: Option<&mut RoutingTrace<B>>,
    ) -> Tensor<B, 3> {
        let mut bank = SourceBank::from_embedding(embedding);
        for (cumulative, _) in completed {
            bank.push_source_pair(cumulative, None);
        }
        let final_router = self
            .final_router
            .as_ref()
            .expect("routed methods build a final router");
        let read = self.read(final_router, &bank, &self.final_norm);
        if let Some(trace) = trace {
            trace.sites.push(SiteTrace {
                site: ReadSite::Final,
                slots: SlotId::name_bank(bank.kinds(), self.config.blocks, 0),
                weights: read.weights,
            });
        }
        read.mixture
    }

    /// Whether the configured routing path is the fused one.
    fn fused(&self) -> bool {
        self.config.routing.resolve::<B>() == RoutingPath::Fused
    }

    /// One router read on the configured path, its mixture put through `norm`, the RMSNorm that
    /// reads it next: in the read itself on the fused path
    /// ([`DepthRouter::forward_fused_normed`]), after it on the reference path.
    fn read(
        &self,
        router: &DepthRouter<B>,
        bank: &SourceBank<B>,
        norm: &RmsNorm<B>,
    ) -> RouterOutput<B> {
        if self.fused() {
            return router.forward_fused_normed(bank, norm);
        }
        let read = router.forward(bank);
        RouterOutput {
            mixture: norm.forward(read.mixture),
            weights: read.weights,
        }
    }

    /// An empty accumulator: on the fused path one that keeps each sum's mean square for the
    /// sources made from it, and the detail's RMS-matching multiplier where the detail is read
    /// matched; on the reference path one that forms none.
    fn accumulator(&self) -> BlockAccumulator<B, 2> {
        let matching = self
            .config
            .method
            .haares_options()
            .filter(|options| {
                options.rms_match && options.detail != DetailSource::DuplicatedCumulative
            })
            .map(|options| RmsMatching {
                gamma: options.rms_gamma,
                epsilon: options.rms_epsilon,
            });
        match (self.fused(), matching) {
            (true, Some(matching)) => BlockAccumulator::matching_details(matching),
            (true, None) => BlockAccumulator::forming_mean_squares(),
            (false, _) => BlockAccumulator::new(),
        }
    }

    /// A source for the bank: on the fused path its mean square is computed here, once, and shared
    /// by every read site that sees it.
    fn source(&self, value: Tensor<B, 3>) -> Source<B> {
        match self.fused() {
            true => Source::with_mean_square(value),
            false => Source::plain(value),
        }
    }

    /// A source made from one of the accumulator's sums, `[batch·seq, d]` token rows: on the
    /// fused path the rows themselves with the mean square formed with the sum where there is one
    /// ([`Source::from_rows`]), on the reference path the `[batch, seq, d]` value.
    fn accumulated_source(
        &self,
        sum: &Tensor<B, 2>,
        mean_square: Option<&Tensor<B, 2>>,
        batch_seq: [usize; 2],
    ) -> Source<B> {
        match self.fused() {
            true => Source::from_rows(sum.clone(), batch_seq, mean_square.cloned()),
            false => Source::plain(tokens_to_sequence(sum.clone(), batch_seq)),
        }
    }

    /// The active block's pair `(C^{(r−1)}, slot 2)` once it holds a write, where slot 2 is `D̂`
    /// (eq:rmsmatch), raw `D` without RMS matching, `C` itself for the duplicated-`C` control,
    /// and absent for Block AttnRes.
    fn active_pair(
        &self,
        active: &BlockAccumulator<B, 2>,
        with_detail: bool,
        batch_seq: [usize; 2],
    ) -> Option<SourcePair<B>> {
        let cumulative = self.accumulated_source(
            active.cumulative()?,
            active.cumulative_mean_square(),
            batch_seq,
        );
        let (Some(options), true) = (self.config.method.haares_options(), with_detail) else {
            return Some((cumulative, None));
        };
        let Some(raw) = active
            .detail()
            .filter(|_| options.detail != DetailSource::DuplicatedCumulative)
        else {
            return Some((cumulative.clone(), Some(cumulative)));
        };
        // An early-half detail is the cumulative tensor itself: its source (rows, mean square)
        // is shared rather than derived again.
        let detail_source = || match active.detail_is_cumulative() {
            true => cumulative.clone(),
            false => self.accumulated_source(raw, active.detail_mean_square(), batch_seq),
        };
        let detail = if !options.rms_match {
            detail_source()
        } else if let Some((multiplier, mean_square)) = active.matched_detail() {
            let per_token = |column: &Tensor<B, 2>| tokens_to_sequence(column.clone(), batch_seq);
            detail_source().rescaled(per_token(multiplier), per_token(mean_square))
        } else if self.fused() {
            rms_match_source(
                detail_source(),
                cumulative.mean_square(),
                options.rms_gamma,
                options.rms_epsilon,
            )
        } else {
            let matched = rms_match(
                raw.clone(),
                active.cumulative()?.clone(),
                options.rms_gamma,
                options.rms_epsilon,
            );
            Source::plain(tokens_to_sequence(matched, batch_seq))
        };
        Some((cumulative, Some(detail)))
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

/// `[batch·seq, w]` token rows as `[batch, seq, w]`.
fn tokens_to_sequence<B: Backend>(rows: Tensor<B, 2>, [batch, seq]: [usize; 2]) -> Tensor<B, 3> {
    let width = rows.dims()[1];
    rows.reshape([batch, seq, width])
}

/// A block's cumulative source and, for HAARES, its detail source.
type SourcePair<B> = (Source<B>, Option<Source<B>>);

/// eq:sourceset: the embedding, every completed pair `(C_i, D̂_i)`, and the active pair once the
/// active block has a written output (`r > 1`). Block AttnRes pairs have no detail slot.
fn source_set<B: Backend>(
    embedding: &Source<B>,
    completed: &[SourcePair<B>],
    active: Option<SourcePair<B>>,
) -> SourceBank<B> {
    let mut bank = SourceBank::from_embedding(embedding.clone());
    for (cumulative, detail) in completed.iter().cloned().chain(active) {
        bank.push_source_pair(cumulative, detail);
    }
    bank
}
