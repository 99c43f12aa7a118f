//! The depth router (eq:routingweights): a learned query scores every slot of a source bank
//! through an RMS-normalised key, and the read is the softmax-weighted mixture of the slots.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{Tensor, backend::Backend};

use crate::config::DetailBias;
use crate::norm::{RmsNorm, RmsNormConfig};
use crate::source_bank::{SlotKind, SourceBank};

/// Configuration of a [`DepthRouter`].
#[derive(Config, Debug)]
pub struct DepthRouterConfig {
    /// Hidden width d.
    pub d_model: usize,
    /// Bias of detail slots; `None` for a router that never sees one (Block AttnRes, final readout).
    #[config(default = "None")]
    pub detail_bias: Option<DetailBias>,
    /// ε of the key RMSNorm. Default: 1e-6 (NOTES decision 2).
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
    /// Affine RMSNorm producing the keys (NOTES decision 2; no 1/√d scaling).
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

impl<B: Backend> DepthRouter<B> {
    /// Routes over a bank (eq:routingweights).
    ///
    /// # Shapes
    /// - every slot of `bank`: `[batch, seq, d]`
    /// - output mixture: `[batch, seq, d]`; weights: `[batch, seq, S]`
    pub fn forward(&self, bank: &SourceBank<B>) -> RouterOutput<B> {
        let weights = softmax(self.scores(bank), 2);
        let mixture = bank
            .values()
            .iter()
            .enumerate()
            .map(|(slot, value)| weights.clone().narrow(2, slot, 1) * value.clone())
            .reduce(|sum, term| sum + term)
            .expect("a source bank always holds the embedding");
        RouterOutput { mixture, weights }
    }

    /// The logits `z_s = qᵀ RMSNorm(s) + b_s` of every slot.
    ///
    /// # Shapes
    /// - output: `[batch, seq, S]`
    pub fn scores(&self, bank: &SourceBank<B>) -> Tensor<B, 3> {
        let query = self.query.val().unsqueeze::<3>();
        let scores = bank
            .values()
            .iter()
            .zip(bank.kinds())
            .map(|(value, kind)| {
                let score = (self.key_norm.forward(value.clone()) * query.clone()).sum_dim(2);
                match kind {
                    SlotKind::Detail => self.add_detail_bias(score),
                    SlotKind::Embedding | SlotKind::Cumulative => score,
                }
            })
            .collect();
        Tensor::cat(scores, 2)
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
