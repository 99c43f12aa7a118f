//! The depth router (eq:routingweights): a learned query scores every slot of a source bank
//! through an RMS-normalised key, and the read is the softmax-weighted mixture of the slots.
//!
//! Two paths compute the same read. [`DepthRouter::forward`] is the reference: it follows the
//! equation literally, normalising every slot into a key at every read site. [`DepthRouter::
//! forward_fused`] runs the routing operator of [`crate::ops::routing`]: it factors the key norm
//! out of the dot product — `qᵀ RMSNorm(s) = (q ⊙ w)ᵀ s / RMS_ε(s)` — so it never forms a
//! normalised key, uses each source's mean square computed once (shared through [`Source`] by
//! every later read site and by RMS matching), and its own backward pass keeps no `[batch, seq,
//! d]` tensor per slot. `tests/core/fused.rs` checks that the two agree in values and gradients.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{ElementConversion, Tensor, backend::Backend};

use crate::config::DetailBias;
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::ops::routing::read::{ReadBias, ReadNorm, ReadQuery};
use crate::ops::{HaaresBackend, SlotRows};
use crate::source_bank::{SlotKind, Source, SourceBank, rows};

/// Configuration of a [`DepthRouter`].
#[derive(Config, Debug)]
pub struct DepthRouterConfig {
    /// Hidden width d.
    pub d_model: usize,
    /// Bias of detail slots; `None` for a router that never sees one (Block AttnRes, final
    /// readout).
    #[config(default = "None")]
    pub detail_bias: Option<DetailBias>,
    /// ε of the key RMSNorm. Default: 1e-6 (docs/decisions.md, decision 2).
    #[config(default = 1e-6)]
    pub norm_epsilon: f64,
}

impl DepthRouterConfig {
    /// A router with a zero query (uniform weights over equally biased slots), a key norm with unit
    /// weight, and the detail bias at its initial value.
    pub fn init<B: Backend>(&self, device: &B::Device) -> DepthRouter<B> {
        let (learned, fixed) = match self.detail_bias {
            Some(DetailBias::Learned { init }) => (
                Some(Param::from_tensor(Tensor::full([1], init, device))),
                None,
            ),
            Some(DetailBias::Fixed { value }) => (None, Some(value)),
            None => (None, None),
        };
        DepthRouter {
            query: Param::from_tensor(Tensor::zeros([self.d_model], device)),
            key_norm: RmsNormConfig::new(self.d_model)
                .with_epsilon(self.norm_epsilon)
                .init(device),
            detail_bias: learned,
            fixed_detail_bias: fixed,
        }
    }
}

/// A read site's router: `z_s = qᵀ RMSNorm(s) + b_s`, `α = softmax(z)`, `h̃ = Σ_s α_s s`
/// (eq:routingweights). The mixture replaces the hidden state; it is not added to a stream.
#[derive(Module, Debug)]
pub struct DepthRouter<B: Backend> {
    /// The query `q ∈ ℝ^d`, zero-initialised.
    pub query: Param<Tensor<B, 1>>,
    /// Affine RMSNorm producing the keys (docs/decisions.md, decision 2; no 1/√d scaling).
    pub key_norm: RmsNorm<B>,
    /// Learned detail bias `[1]`, shared by the site's visible detail slots.
    pub detail_bias: Option<Param<Tensor<B, 1>>>,
    /// Fixed detail bias (fixed-bias ablations).
    pub fixed_detail_bias: Option<f64>,
}

/// A router's read: the mixture and the softmax weights that formed it.
#[derive(Debug, Clone)]
pub struct RouterOutput<B: Backend> {
    /// `h̃ = Σ_s α_s s`, shape `[batch, seq, d]`.
    pub mixture: Tensor<B, 3>,
    /// `α`, shape `[batch, seq, S]`, in the bank's slot order.
    pub weights: Tensor<B, 3>,
}

impl<B: HaaresBackend> DepthRouter<B> {
    /// Routes over a bank (eq:routingweights).
    ///
    /// # Shapes
    /// - every slot of `bank`: `[batch, seq, d]`
    /// - output mixture: `[batch, seq, d]`; weights: `[batch, seq, S]`
    pub fn forward(&self, bank: &SourceBank<B>) -> RouterOutput<B> {
        let weights = softmax(self.scores(bank), 2);
        let mixture = mix(bank.sources(), &weights);
        RouterOutput { mixture, weights }
    }

    /// The logits `z_s = qᵀ RMSNorm(s) + b_s` of every slot.
    ///
    /// # Shapes
    /// - output: `[batch, seq, S]`
    pub fn scores(&self, bank: &SourceBank<B>) -> Tensor<B, 3> {
        let query = self.query.val().unsqueeze::<3>();
        let scores = bank
            .sources()
            .iter()
            .zip(bank.kinds())
            .map(|(source, kind)| {
                let score = (self.key_norm.forward(source.value()) * query.clone()).sum_dim(2);
                match kind {
                    SlotKind::Detail => self.add_detail_bias(score),
                    SlotKind::Embedding | SlotKind::Cumulative => score,
                }
            })
            .collect();
        Tensor::cat(scores, 2)
    }
}

impl<B: Backend> DepthRouter<B> {
    /// The bias `b` this router adds to detail slots, learned or fixed; `None` for a router
    /// without one (Block AttnRes, the final readout). Reads a learned bias back from the device.
    pub fn detail_bias_value(&self) -> Option<f64> {
        match (&self.detail_bias, self.fixed_detail_bias) {
            (Some(bias), _) => Some(bias.val().into_scalar().elem::<f64>()),
            (None, fixed) => fixed,
        }
    }

    /// The detail bias as a read takes it: `b` and the bank's detail slots, or `None` when the
    /// bank has no detail slot or the router no bias.
    fn read_bias(&self, bank: &SourceBank<B>) -> Option<ReadBias<B>> {
        let slots: Vec<bool> = bank
            .kinds()
            .iter()
            .map(|kind| *kind == SlotKind::Detail)
            .collect();
        if !slots.contains(&true) {
            return None;
        }
        let value = match (&self.detail_bias, self.fixed_detail_bias) {
            (Some(bias), _) => bias.val(),
            (None, Some(value)) => Tensor::from_floats([value as f32], &self.query.device()),
            (None, None) => return None,
        };
        Some(ReadBias { value, slots })
    }

    fn add_detail_bias(&self, score: Tensor<B, 3>) -> Tensor<B, 3> {
        match (&self.detail_bias, self.fixed_detail_bias) {
            (Some(bias), _) => score + bias.val().unsqueeze::<3>(),
            (None, Some(value)) => score.add_scalar(value),
            // A router configured without a detail bias treats detail slots like the others.
            (None, None) => score,
        }
    }
}

impl<B: HaaresBackend> DepthRouter<B> {
    /// The same read as [`forward`](Self::forward), through the routing operator
    /// ([`crate::ops::routing`]): scores from the factored key norm, the mixture from the sources
    /// as they are, both laid out on `[batch·seq, d]` token rows with slot-major weights.
    ///
    /// # Shapes
    /// - every slot of `bank`: `[batch, seq, d]`
    /// - output mixture: `[batch, seq, d]`; weights: `[batch, seq, S]`
    pub fn forward_fused(&self, bank: &SourceBank<B>) -> RouterOutput<B> {
        self.read_fused(bank, None)
    }

    /// [`forward_fused`](Self::forward_fused) with the mixture put through `norm`, the RMSNorm
    /// that reads it next (eq:sublayer's PreNorm, or the final norm), in the same operation
    /// ([`ReadNorm`]): the output's `mixture` is `norm(h̃)`, the same as `norm.forward` of
    /// [`forward_fused`](Self::forward_fused)'s, with the norm's launches inside the read's on
    /// the cube backends.
    ///
    /// # Shapes
    /// - every slot of `bank`: `[batch, seq, d]`
    /// - output mixture: `[batch, seq, d]`; weights: `[batch, seq, S]`
    pub fn forward_fused_normed(&self, bank: &SourceBank<B>, norm: &RmsNorm<B>) -> RouterOutput<B> {
        let norm = ReadNorm {
            gain: norm.weight.val(),
            epsilon: norm.epsilon,
        };
        self.read_fused(bank, Some(norm))
    }

    fn read_fused(&self, bank: &SourceBank<B>, norm: Option<ReadNorm<B>>) -> RouterOutput<B> {
        let [batch, seq, d_model] = bank.sources()[0].raw().dims();
        let query = ReadQuery {
            query: self.query.val(),
            key_weight: self.key_norm.weight.val(),
        };
        let (mixture, weights) = B::routing_read(
            &slot_rows(bank),
            query,
            self.read_bias(bank),
            self.key_norm.epsilon,
            norm,
        );
        let mixture = mixture.reshape([batch, seq, d_model]);
        // One slot needs no transpose, and must not get one: Burn 0.21's cube backend returns a
        // `[1, tokens]` tensor transposed and reshaped with only its first element intact
        // (found by tests/portability.rs on wgpu).
        let weights = match bank.len() {
            1 => weights.reshape([batch, seq, 1]),
            slots => weights.transpose().reshape([batch, seq, slots]),
        };
        RouterOutput { mixture, weights }
    }

    /// The logits of eq:routingweights with the key norm factored out of the dot product:
    /// `z_s = (q ⊙ w)ᵀ s / √(mean(s²) + ε) + b_s`, where `w` is the key norm's weight.
    ///
    /// # Shapes
    /// - output: `[S, batch·seq]` (slot-major)
    pub fn scores_fused(&self, bank: &SourceBank<B>) -> Tensor<B, 2> {
        self.logits_fused(&slot_rows(bank), bank)
    }

    fn logits_fused(&self, slots: &[SlotRows<B>], bank: &SourceBank<B>) -> Tensor<B, 2> {
        let folded_query = self.query.val() * self.key_norm.weight.val();
        let scores = B::routing_scores(slots, folded_query, self.key_norm.epsilon);
        match self.read_bias(bank) {
            Some(bias) => scores + bias.column(),
            None => scores,
        }
    }
}

/// The bank's sources as the routing operator takes them: token rows, per-token columns, and each
/// source's mean square (the cached one where the source carries it).
fn slot_rows<B: Backend>(bank: &SourceBank<B>) -> Vec<SlotRows<B>> {
    bank.sources()
        .iter()
        .map(|source| SlotRows {
            raw: source.rows(),
            scale: source.scale().map(|scale| rows(scale.clone())),
            mean_square: rows(source.mean_square()),
        })
        .collect()
}

/// The mixture `h̃ = Σ_s α_s s` of eq:routingweights, one slot at a time (the sources are never
/// stacked into an `[S, batch, seq, d]` tensor).
fn mix<B: Backend>(sources: &[Source<B>], weights: &Tensor<B, 3>) -> Tensor<B, 3> {
    sources
        .iter()
        .enumerate()
        .map(|(slot, source)| weights.clone().narrow(2, slot, 1) * source.value())
        .reduce(|sum, term| sum + term)
        .expect("a source bank always holds the embedding")
}
