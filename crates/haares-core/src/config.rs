//! Model configuration: the backbone (App. A, tab:reprobackbone), the model families
//! (tab:modelconfig) and the residual method with every ablation of tab:basisablation.

use burn::config::Config;
use serde::{Deserialize, Serialize};

use crate::error::HaaresError;

/// Where the second slot of each HAARES block pair comes from (tab:basisablation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum DetailSource {
    /// The paper's half split: `D = E − F` with signs `+1` for `r ≤ k = ⌈m/2⌉`, `−1` after
    /// (eq:segments, eq:bases, eq:partial).
    HalfSplit,
    /// Fixed random signs `s_{n,r} ∈ {±1}` drawn once from `seed` (NOTES decision 6); see
    /// [`crate::accumulator::random_signs`] for the generator.
    RandomSigns {
        /// Seed of the sign generator; the paper's record does not give one, ours defaults to 0.
        seed: u64,
    },
    /// Duplicated `C×2` control: the extra slot holds the cumulative value itself and keeps the
    /// learned detail bias (NOTES decision 7, eq:duplicate).
    DuplicatedCumulative,
}

/// How the router biases detail slots (eq:routingweights, eq:initialmass).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum DetailBias {
    /// One learned scalar per read site, shared by its visible detail slots.
    Learned {
        /// Initial value; the paper uses −2.
        init: f64,
    },
    /// A constant, not trained (the fixed-bias ablations use 0, −2 and −4).
    Fixed {
        /// The constant bias.
        value: f64,
    },
}

impl DetailBias {
    /// The bias value at initialisation.
    pub fn initial_value(&self) -> f64 {
        match *self {
            Self::Learned { init } => init,
            Self::Fixed { value } => value,
        }
    }
}

/// Options of HAARES; [`HaaresOptions::paper`] is the full method, the other constructors are the
/// paper's ablations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HaaresOptions {
    /// Source of the detail slot.
    pub detail: DetailSource,
    /// Whether the detail is RMS-matched to the cumulative source (eq:rmsmatch).
    pub rms_match: bool,
    /// Clip bound γ of eq:rmsmatch (paper: 4).
    pub rms_gamma: f64,
    /// ε of eq:rmsmatch (paper: 1e-6).
    pub rms_epsilon: f64,
    /// Routing bias of detail slots.
    pub detail_bias: DetailBias,
}

impl HaaresOptions {
    /// The full method: half split, RMS matching with γ = 4, ε = 1e-6, learned bias from −2.
    pub fn paper() -> Self {
        Self {
            detail: DetailSource::HalfSplit,
            rms_match: true,
            rms_gamma: 4.0,
            rms_epsilon: 1e-6,
            detail_bias: DetailBias::Learned { init: -2.0 },
        }
    }
    /// Ablation "Duplicated C×2".
    pub fn duplicated_cumulative() -> Self {
        Self {
            detail: DetailSource::DuplicatedCumulative,
            ..Self::paper()
        }
    }
    /// Ablation "Random-sign detail" with the given sign seed.
    pub fn random_signs(seed: u64) -> Self {
        Self {
            detail: DetailSource::RandomSigns { seed },
            ..Self::paper()
        }
    }
    /// Ablation "Fixed detail bias `value`" (paper: 0, −2, −4).
    pub fn fixed_detail_bias(value: f64) -> Self {
        Self {
            detail_bias: DetailBias::Fixed { value },
            ..Self::paper()
        }
    }
    /// Ablation "HAARES without RMS match".
    pub fn without_rms_match() -> Self {
        Self {
            rms_match: false,
            ..Self::paper()
        }
    }
}

impl Default for HaaresOptions {
    fn default() -> Self {
        Self::paper()
    }
}

/// The residual connection of the backbone: one config enum for every method of the paper.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ResidualMethod {
    /// Ordinary PreNorm residual: `h ← h + f(Norm(h))`.
    Standard,
    /// `h ← h + g·f(Norm(h))` with a zero-initialised scalar gate per sublayer (NOTES decision 4).
    ReZero,
    /// `h ← h + λ ⊙ f(Norm(h))` with a per-channel scale; `init: None` uses the paper's
    /// depth rule (see [`layer_scale_init`]).
    LayerScale {
        /// Initial scale, or `None` for the depth rule.
        init: Option<f64>,
    },
    /// Block Attention Residuals: HAARES's read rule with every detail slot removed.
    BlockAttnRes,
    /// HAARES with the given options.
    Haares(HaaresOptions),
}

impl ResidualMethod {
    /// Full HAARES as in the paper.
    pub fn haares() -> Self {
        Self::Haares(HaaresOptions::paper())
    }
    /// Whether sublayer inputs are read through a depth router (Block AttnRes and HAARES).
    pub fn is_routed(&self) -> bool {
        matches!(self, Self::BlockAttnRes | Self::Haares(_))
    }
    /// The HAARES options, if this is a HAARES variant.
    pub fn haares_options(&self) -> Option<&HaaresOptions> {
        match self {
            Self::Haares(options) => Some(options),
            _ => None,
        }
    }
    /// A short stable name, used in run names and reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::ReZero => "rezero",
            Self::LayerScale { .. } => "layerscale",
            Self::BlockAttnRes => "block_attnres",
            Self::Haares(options) => match (options.detail, options.rms_match, options.detail_bias)
            {
                (DetailSource::DuplicatedCumulative, ..) => "haares_duplicated_c",
                (DetailSource::RandomSigns { .. }, ..) => "haares_random_signs",
                (_, _, DetailBias::Fixed { .. }) => "haares_fixed_bias",
                (_, false, _) => "haares_no_rms_match",
                _ => "haares",
            },
        }
    }
}

/// The paper's LayerScale initial value for a depth of `n_layers` (tab:reprobackbone: 0.1, 1e-5,
/// 1e-6 at 12, 24, 48 layers; NOTES decision 4 extends it to 0.1 for L ≤ 18, 1e-5 for L ≤ 24,
/// 1e-6 above).
pub fn layer_scale_init(n_layers: usize) -> f64 {
    match n_layers {
        0..=18 => 0.1,
        19..=24 => 1e-5,
        _ => 1e-6,
    }
}

/// Which implementation of the depth router reads the source banks. Both compute
/// eq:routingweights; they differ in rounding only (see [`crate::router`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutingPath {
    /// The backend's own choice (see [`RoutingPath::resolve`]): the fused path where it was
    /// measured faster and passes its checks, the reference path elsewhere.
    #[default]
    Auto,
    /// The literal equation: every slot normalised into a key at every read site.
    Reference,
    /// The routing operator ([`crate::routing_ops`]): key norm folded into the query, each
    /// source's mean square computed once and shared, its own backward pass, and CubeCL kernels
    /// on the cube backends.
    Fused,
}

impl RoutingPath {
    /// The path this one stands for on backend `B`: `Auto` becomes
    /// [`RoutingBackend::auto_routing`](crate::RoutingBackend::auto_routing) — the fused path on
    /// the CPU backends and on CUDA, where it was faster in every measurement and passes every
    /// check, and the reference path on wgpu, whose kernels have not been timed on a GPU
    /// (docs/benchmarks.md).
    pub fn resolve<B: crate::RoutingBackend>(self) -> Self {
        match self {
            Self::Auto => B::auto_routing(),
            explicit => explicit,
        }
    }
}

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
        if self.method.is_routed() && !self.events().is_multiple_of(self.blocks) {
            let divisors: Vec<usize> = (1..=self.events())
                .filter(|n| self.events().is_multiple_of(*n))
                .collect();
            return Err(HaaresError::config(
                "blocks",
                format!(
                    "N = {} does not divide the 2L = {} residual events; uneven partitions are refused (NOTES decision 12). Valid block counts: {divisors:?}",
                    self.blocks,
                    self.events()
                ),
            ));
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
        if let ResidualMethod::Haares(options) = &self.method {
            if !(options.rms_gamma.is_finite() && options.rms_gamma >= 1.0) {
                return Err(HaaresError::config(
                    "method.rms_gamma",
                    format!("the clip bound γ must be ≥ 1, got {}", options.rms_gamma),
                ));
            }
            if !(options.rms_epsilon.is_finite() && options.rms_epsilon > 0.0) {
                return Err(HaaresError::config(
                    "method.rms_epsilon",
                    format!("must be positive, got {}", options.rms_epsilon),
                ));
            }
            if !options.detail_bias.initial_value().is_finite() {
                return Err(HaaresError::config(
                    "method.detail_bias",
                    "must be finite; mask detail slots by choosing BlockAttnRes instead",
                ));
            }
        }
        if let ResidualMethod::LayerScale { init: Some(init) } = self.method
            && !init.is_finite()
        {
            return Err(HaaresError::config(
                "method.init",
                format!("LayerScale init must be finite, got {init}"),
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
