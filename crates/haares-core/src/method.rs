//! The residual method of the backbone, with every ablation of tab:basisablation, and its one
//! name: [`ResidualMethod`] parses and prints the spelling used on the command line, in study
//! files, run directories and reports (`block-attnres`, `haares-fixed-bias=-2`, …).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::HaaresError;

/// Where the second slot of each HAARES block pair comes from (tab:basisablation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum DetailSource {
    /// The paper's half split: `D = E − F` with signs `+1` for `r ≤ k = ⌈m/2⌉`, `−1` after
    /// (eq:segments, eq:bases, eq:partial).
    HalfSplit,
    /// Fixed random signs `s_{n,r} ∈ {±1}` drawn once from `seed` (docs/decisions.md, decision 6);
    /// see [`crate::accumulator::random_signs`] for the generator.
    RandomSigns {
        /// Seed of the sign generator; the paper's record does not give one, ours defaults to 0.
        seed: u64,
    },
    /// Duplicated `C×2` control: the extra slot holds the cumulative value itself and keeps the
    /// learned detail bias (docs/decisions.md, decision 7, eq:duplicate).
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
    /// Whether the bias is a trained parameter (stored in a model file), not a constant.
    pub fn is_learned(&self) -> bool {
        matches!(self, Self::Learned { .. })
    }

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
    /// `h ← h + g·f(Norm(h))` with a zero-initialised scalar gate per sublayer (docs/decisions.md,
    /// decision 4).
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
}

/// The paper's LayerScale initial value for a depth of `n_layers` (tab:reprobackbone: 0.1, 1e-5,
/// 1e-6 at 12, 24, 48 layers), extended to every depth as 0.1 for L ≤ 18, 1e-5 for L ≤ 24 and 1e-6
/// above (docs/decisions.md, decision 4).
pub fn layer_scale_init(n_layers: usize) -> f64 {
    match n_layers {
        0..=18 => 0.1,
        19..=24 => 1e-5,
        _ => 1e-6,
    }
}

/// One name of every method [`ResidualMethod::from_str`] reads, in report order (baselines first,
/// HAARES last). The fixed-bias and random-sign ablations take any value after `=`.
pub const METHOD_NAMES: &[&str] = &[
    "standard",
    "rezero",
    "layerscale",
    "block-attnres",
    "haares-duplicated-c",
    "haares-random-signs",
    "haares-fixed-bias=0",
    "haares-fixed-bias=-2",
    "haares-fixed-bias=-4",
    "haares-no-rms-match",
    "haares",
];

/// HAARES options that are none of the paper's variants have no name; they print as this and do
/// not parse (a library user builds them in code).
const CUSTOM_HAARES: &str = "haares-custom";

impl ResidualMethod {
    /// Checks the method's own settings; the error names the field.
    pub fn validate(&self) -> crate::Result<()> {
        if let ResidualMethod::Haares(options) = self {
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
        if let ResidualMethod::LayerScale { init: Some(init) } = *self
            && !init.is_finite()
        {
            return Err(HaaresError::config(
                "method.init",
                format!("LayerScale init must be finite, got {init}"),
            ));
        }
        Ok(())
    }

    /// The method's name, as [`fmt::Display`] prints it and [`FromStr`] reads it.
    pub fn name(&self) -> String {
        self.to_string()
    }

    /// The paper's label for the method (its tables' row names): `Block AttnRes`, `Fixed detail
    /// bias -2`, ….
    pub fn label(&self) -> String {
        let haares = |options: &HaaresOptions| match HaaresVariant::of(options) {
            Some(HaaresVariant::Paper) => "HAARES".to_string(),
            Some(HaaresVariant::DuplicatedC) => "Duplicated C×2".into(),
            Some(HaaresVariant::RandomSigns(_)) => "Random-sign detail".into(),
            Some(HaaresVariant::FixedBias(value)) => format!("Fixed detail bias {value}"),
            Some(HaaresVariant::NoRmsMatch) => "HAARES without RMS match".into(),
            None => "HAARES (custom options)".into(),
        };
        match self {
            Self::Standard => "Standard Residual".into(),
            Self::ReZero => "ReZero".into(),
            Self::LayerScale { init: None } => "LayerScale".into(),
            Self::LayerScale { init: Some(init) } => format!("LayerScale {init}"),
            Self::BlockAttnRes => "Block AttnRes".into(),
            Self::Haares(options) => haares(options),
        }
    }

    /// The method's place in reports: its [`METHOD_NAMES`] entry (values aside); custom HAARES
    /// options after every named method.
    pub fn report_rank(&self) -> usize {
        let name = self.name();
        let head = |name: &str| name.split('=').next().unwrap_or_default().to_string();
        METHOD_NAMES
            .iter()
            .position(|m| head(m) == head(&name))
            .unwrap_or(METHOD_NAMES.len())
    }
}

/// The report label of a method name; a name that does not parse is its own label.
pub fn method_label(name: &str) -> String {
    name.parse::<ResidualMethod>()
        .map_or_else(|_| name.to_string(), |method| method.label())
}

/// The report rank of a method name ([`ResidualMethod::report_rank`]); names that do not parse
/// come last.
pub fn method_rank(name: &str) -> usize {
    name.parse::<ResidualMethod>()
        .map_or(METHOD_NAMES.len() + 1, |method| method.report_rank())
}

/// The named HAARES variants: the paper's method and its ablations.
#[derive(Debug, Clone, Copy, PartialEq)]
enum HaaresVariant {
    Paper,
    DuplicatedC,
    RandomSigns(u64),
    FixedBias(f64),
    NoRmsMatch,
}

impl HaaresVariant {
    /// Which named variant `options` are, if any.
    fn of(options: &HaaresOptions) -> Option<Self> {
        let named = |variant: Self| (variant.options() == *options).then_some(variant);
        match (options.detail, options.detail_bias) {
            (DetailSource::RandomSigns { seed }, _) => named(Self::RandomSigns(seed)),
            (_, DetailBias::Fixed { value }) => named(Self::FixedBias(value)),
            (DetailSource::DuplicatedCumulative, _) => named(Self::DuplicatedC),
            _ if !options.rms_match => named(Self::NoRmsMatch),
            _ => named(Self::Paper),
        }
    }

    fn options(self) -> HaaresOptions {
        match self {
            Self::Paper => HaaresOptions::paper(),
            Self::DuplicatedC => HaaresOptions::duplicated_cumulative(),
            Self::RandomSigns(seed) => HaaresOptions::random_signs(seed),
            Self::FixedBias(value) => HaaresOptions::fixed_detail_bias(value),
            Self::NoRmsMatch => HaaresOptions::without_rms_match(),
        }
    }
}

impl fmt::Display for ResidualMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standard => f.write_str("standard"),
            Self::ReZero => f.write_str("rezero"),
            Self::LayerScale { init: None } => f.write_str("layerscale"),
            Self::LayerScale { init: Some(init) } => write!(f, "layerscale={init}"),
            Self::BlockAttnRes => f.write_str("block-attnres"),
            Self::Haares(options) => match HaaresVariant::of(options) {
                Some(HaaresVariant::Paper) => f.write_str("haares"),
                Some(HaaresVariant::DuplicatedC) => f.write_str("haares-duplicated-c"),
                Some(HaaresVariant::RandomSigns(0)) => f.write_str("haares-random-signs"),
                Some(HaaresVariant::RandomSigns(seed)) => write!(f, "haares-random-signs={seed}"),
                Some(HaaresVariant::FixedBias(value)) => write!(f, "haares-fixed-bias={value}"),
                Some(HaaresVariant::NoRmsMatch) => f.write_str("haares-no-rms-match"),
                None => f.write_str(CUSTOM_HAARES),
            },
        }
    }
}

/// Reads a method name: `standard`, `rezero`, `layerscale[=INIT]`, `block-attnres`, `haares`,
/// and the ablations `haares-duplicated-c`, `haares-random-signs[=SEED]` (seed 0 unless named,
/// docs/decisions.md), `haares-fixed-bias=VALUE`, `haares-no-rms-match` (tab:basisablation).
/// Underscores read as hyphens, so the `block_attnres`-style names that earlier versions printed
/// still read.
impl FromStr for ResidualMethod {
    type Err = HaaresError;

    fn from_str(name: &str) -> Result<Self, HaaresError> {
        let unknown = || {
            HaaresError::config(
                "method",
                format!(
                    "unknown method `{name}`; choose one of: {} (fixed-bias and random-signs take \
                     any value, e.g. haares-fixed-bias=-3)",
                    METHOD_NAMES.join(", ")
                ),
            )
        };
        let spelled = name.replace('_', "-");
        let (head, value) = match spelled.split_once('=') {
            Some((head, value)) => (head, Some(value)),
            None => (spelled.as_str(), None),
        };
        let number = |v: &str| v.parse::<f64>().ok().filter(|v| v.is_finite());
        let haares = |variant: HaaresVariant| Some(Self::Haares(variant.options()));
        let method = match (head, value) {
            ("standard", None) => Some(Self::Standard),
            ("rezero", None) => Some(Self::ReZero),
            ("layerscale", None) => Some(Self::LayerScale { init: None }),
            ("layerscale", Some(v)) => number(v).map(|init| Self::LayerScale { init: Some(init) }),
            ("block-attnres", None) => Some(Self::BlockAttnRes),
            ("haares", None) => haares(HaaresVariant::Paper),
            ("haares-duplicated-c", None) => haares(HaaresVariant::DuplicatedC),
            ("haares-random-signs", None) => haares(HaaresVariant::RandomSigns(0)),
            ("haares-random-signs", Some(v)) => v
                .parse()
                .ok()
                .and_then(|seed| haares(HaaresVariant::RandomSigns(seed))),
            ("haares-fixed-bias", Some(v)) => {
                number(v).and_then(|value| haares(HaaresVariant::FixedBias(value)))
            }
            ("haares-no-rms-match", None) => haares(HaaresVariant::NoRmsMatch),
            _ => None,
        };
        method.ok_or_else(unknown)
    }
}
