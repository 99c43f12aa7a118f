//! Model configuration: the backbone (App. A, tab:reprobackbone) and the model families
//! (tab:modelconfig); the residual method with every ablation of tab:basisablation is
//! [`crate::method`]'s.

use burn::config::Config;
use serde::{Deserialize, Serialize};

use crate::error::HaaresError;
use crate::limits::{
    MAX_CONTEXT, MAX_FF_WIDTH, MAX_HEADS, MAX_LAYERS, MAX_ROTARY_TABLE, MAX_VOCAB, MAX_WIDTH,
};
pub use crate::method::{
    DetailBias, DetailSource, HaaresOptions, ResidualMethod, layer_scale_init,
};
pub use crate::ops::RoutingPath;

/// Configuration of a [`HaaresModel`](crate::HaaresModel). Defaults are the paper's backbone
/// (tab:reprobackbone); sizes come from a [`ModelFamily`] or are given directly.
#[derive(Config, Debug, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size (256 for the character pipeline, 4096 for BPE).
    pub vocab_size: usize,
    /// Hidden width d.
    pub d_model: usize,
    /// SwiGLU inner width d_ff.
    pub d_ff: usize,
    /// Number of Transformer layers L (2L residual events).
    pub n_layers: usize,
    /// Attention heads. Default: 8.
    #[config(default = 8)]
    pub n_heads: usize,
    /// Block count N; must divide 2L. Default: 4. Ignored by unrouted methods.
    #[config(default = 4)]
    pub blocks: usize,
    /// Length of the cached RoPE table: the longest sequence the model accepts. Default: 2048.
    #[config(default = 2048)]
    pub max_seq_len: usize,
    /// RoPE base. Default: 10,000.
    #[config(default = 10000.0)]
    pub rope_base: f64,
    /// ε of every affine RMSNorm. Default: 1e-6 (Burn's own RmsNorm defaults to 1e-5).
    #[config(default = 1e-6)]
    pub norm_epsilon: f64,
    /// Standard deviation of the N(0, σ²) Linear and embedding initialisation. Default: 0.02.
    #[config(default = 0.02)]
    pub init_std: f64,
    /// The residual method. Default: full HAARES.
    #[config(default = "ResidualMethod::Haares(HaaresOptions::paper())")]
    pub method: ResidualMethod,
    /// How the depth routers are computed; results agree to float rounding. Default: `Auto`.
    #[config(default = "RoutingPath::Auto")]
    pub routing: RoutingPath,
}

impl ModelConfig {
    /// Number of residual events, 2L.
    pub fn events(&self) -> usize {
        2 * self.n_layers
    }
    /// Events per block, m = 2L / N.
    pub fn events_per_block(&self) -> usize {
        self.events() / self.blocks.max(1)
    }
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Checks that this configuration describes a valid model; the error names the field and
    /// says how to fix it.
    pub fn validate(&self) -> crate::Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_ff", self.d_ff),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("blocks", self.blocks),
            ("max_seq_len", self.max_seq_len),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(HaaresError::config(field, "must be at least 1"));
        }
        self.check_limits()?;
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(HaaresError::config(
                "n_heads",
                format!(
                    "d_model = {} is not divisible by n_heads = {}; choose a width that is a multiple of the head count",
                    self.d_model, self.n_heads
                ),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(HaaresError::config(
                "d_model",
                format!(
                    "head width d_model / n_heads = {} is odd; RoPE rotates pairs of dimensions and needs it even",
                    self.head_dim()
                ),
            ));
        }
        if self.method.is_routed() {
            crate::limits::check_partition(self.events(), self.blocks, "2L")?;
        }
        for (field, value) in [
            ("norm_epsilon", self.norm_epsilon),
            ("rope_base", self.rope_base),
            ("init_std", self.init_std),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(HaaresError::config(
                    field,
                    format!("must be a positive finite number, got {value}"),
                ));
            }
        }
        self.method.validate()
    }

    /// Refuses a config beyond any bound of [`crate::limits`]; the error names the field, its
    /// bound and the reason.
    fn check_limits(&self) -> crate::Result<()> {
        let bounds = [
            (
                "n_layers",
                self.n_layers,
                MAX_LAYERS,
                "deeper than any published Transformer",
            ),
            (
                "d_model",
                self.d_model,
                MAX_WIDTH,
                "wider than any published Transformer",
            ),
            (
                "d_ff",
                self.d_ff,
                MAX_FF_WIDTH,
                "wider than any published MLP",
            ),
            (
                "n_heads",
                self.n_heads,
                MAX_HEADS,
                "more heads than any published Transformer",
            ),
            (
                "vocab_size",
                self.vocab_size,
                MAX_VOCAB,
                "larger than any published vocabulary",
            ),
            (
                "max_seq_len",
                self.max_seq_len,
                MAX_CONTEXT,
                "longer than any published context",
            ),
        ];
        for (field, value, bound, reason) in bounds {
            if value > bound {
                return Err(HaaresError::config(
                    field,
                    format!(
                        "{value} is above the bound of {bound} ({reason}; haares_core::limits). A model \
                     file whose config says so is damaged or was not written for this model"
                    ),
                ));
            }
        }
        let table = self.max_seq_len.saturating_mul(self.d_model);
        if table > MAX_ROTARY_TABLE {
            return Err(HaaresError::config(
                "max_seq_len",
                format!(
                    "the RoPE tables would hold max_seq_len · d_model = {} · {} = {table} entries each, \
                 above the bound of {MAX_ROTARY_TABLE} (haares_core::limits::MAX_ROTARY_TABLE); \
                 choose a shorter max_seq_len",
                    self.max_seq_len, self.d_model
                ),
            ));
        }
        Ok(())
    }
}

/// The paper's model families (tab:modelconfig): context 512, 8 heads, N = 4 by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelFamily {
    /// d = 128, d_ff = 1024 (≈ 22.0M at 48 layers).
    Small,
    /// d = 512, d_ff = 2048 (≈ 201.3M at 48 layers; 203.4M with the 4096-entry BPE vocabulary).
    Medium,
    /// d = 768, d_ff = 3072 (≈ 453.0M at 48 layers).
    Large,
}

impl ModelFamily {
    /// `(d_model, d_ff)` of the family.
    pub fn widths(self) -> (usize, usize) {
        match self {
            Self::Small => (128, 1024),
            Self::Medium => (512, 2048),
            Self::Large => (768, 3072),
        }
    }
    /// The family's configuration at the given depth, vocabulary and method (N = 4).
    pub fn config(self, n_layers: usize, vocab_size: usize, method: ResidualMethod) -> ModelConfig {
        let (d_model, d_ff) = self.widths();
        ModelConfig::new(vocab_size, d_model, d_ff, n_layers).with_method(method)
    }
}
