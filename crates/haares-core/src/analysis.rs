//! The paper's analytic quantities: source counts (sec:complexity, eq:avgsource,
//! tab:sourcecounts), the initial detail mass (eq:initialmass), exact parameter counts
//! (tab:modelconfig) and the break-even step count (eq:breakeven).
//!
//! Counts are enumerated from the source-bank rule, not taken from the closed forms, so that the
//! closed forms can be checked against them.

use serde::{Deserialize, Serialize};

use crate::config::{DetailBias, ModelConfig, ResidualMethod};
use crate::error::HaaresError;

/// Number of intermediate-read slots before event `r` (1-based) of block `n` (1-based):
/// `S_Block(n, r) = n + 1_{r>1}` and `S_HAARES(n, r) = 2n − 1 + 2·1_{r>1}` (sec:complexity),
/// enumerated from eq:sourceset: the embedding, one slot (Block) or two (HAARES) per completed
/// block, and the active block's slots once it has a written output.
pub fn source_count(with_detail: bool, block: usize, r: usize) -> usize {
    let slots_per_block = if with_detail { 2 } else { 1 };
    let completed = block.saturating_sub(1);
    let active = if r > 1 { slots_per_block } else { 0 };
    1 + slots_per_block * completed + active
}

/// Average and maximum intermediate-read source counts of a depth and partition (tab:sourcecounts).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SourceCountSummary {
    /// Mean slot count over the 2L intermediate reads (the final readout excluded).
    pub average: f64,
    /// Largest slot count of an intermediate read.
    pub maximum: usize,
    /// Slots of the final readout, `N + 1` for both methods (eq:final).
    pub final_readout: usize,
}

/// Enumerates [`source_count`] over every event of an `n_layers`-deep model in `blocks` blocks.
/// Refuses partitions where `blocks` does not divide `2L` (docs/decisions.md, decision 12).
pub fn source_count_summary(
    with_detail: bool,
    n_layers: usize,
    blocks: usize,
) -> crate::Result<SourceCountSummary> {
    let events = 2 * n_layers;
    if blocks == 0 || events == 0 || !events.is_multiple_of(blocks) {
        return Err(HaaresError::config(
            "blocks",
            format!("N = {blocks} must divide 2L = {events} (docs/decisions.md, decision 12)"),
        ));
    }
    let events_per_block = events / blocks;
    let counts: Vec<usize> = (1..=blocks)
        .flat_map(|block| (1..=events_per_block).map(move |r| source_count(with_detail, block, r)))
        .collect();
    Ok(SourceCountSummary {
        average: counts.iter().sum::<usize>() as f64 / counts.len() as f64,
        maximum: counts.iter().copied().max().unwrap_or(0),
        final_readout: blocks + 1,
    })
}

/// eq:avgsource in closed form: `(N+3)/2 − 1/m` (Block AttnRes) or `N + 2 − 2/m` (HAARES).
pub fn average_source_count_closed_form(
    with_detail: bool,
    blocks: usize,
    events_per_block: usize,
) -> f64 {
    let (n, m) = (blocks as f64, events_per_block as f64);
    if with_detail {
        n + 2.0 - 2.0 / m
    } else {
        (n + 3.0) / 2.0 - 1.0 / m
    }
}

/// eq:initialmass: the aggregate detail weight at zero queries, `h·e^b / (c + h·e^b)`, for `c`
/// embedding/cumulative slots and `h` detail slots sharing bias `b` (the paper: b = −2).
pub fn initial_detail_mass(cumulative_slots: usize, detail_slots: usize, detail_bias: f64) -> f64 {
    let detail = detail_slots as f64 * detail_bias.exp();
    detail / (cumulative_slots as f64 + detail)
}

/// eq:initialmass at event `r` of block `n` (both 1-based) of a HAARES model: the slot counts come
/// from eq:sourceset. The first active read (n = 1, r = 2) gives ≈ 6.3%, an active read in the last
/// of four blocks ≈ 9.8%.
pub fn initial_detail_mass_at(block: usize, r: usize, detail_bias: f64) -> f64 {
    let total = source_count(true, block, r);
    let detail_slots = (total - 1) / 2;
    initial_detail_mass(total - detail_slots, detail_slots, detail_bias)
}

/// An exact parameter count, split by component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParameterCount {
    /// Tied embedding / head, `V·d`.
    pub embedding: usize,
    /// Attention projections, `L·4d²`.
    pub attention: usize,
    /// SwiGLU projections, `L·3·d·d_ff`.
    pub mlp: usize,
    /// RMSNorm weights: two per layer and the final norm, `(2L + 1)·d`.
    pub norms: usize,
    /// Router queries, key-norm weights and learned detail biases, final router included.
    pub routers: usize,
    /// ReZero gates (`2L`) or LayerScale scales (`2L·d`).
    pub residual_scales: usize,
}

impl ParameterCount {
    /// Every trainable parameter.
    pub fn total(&self) -> usize {
        self.embedding
            + self.attention
            + self.mlp
            + self.norms
            + self.routers
            + self.residual_scales
    }
    /// The attention and MLP weight matrices alone. The paper's 48-layer figures for the
    /// character models (≈ 22.0M, 201.3M, 453.0M) are this quantity; its BPE figure (≈ 203.4M)
    /// adds the 4096-entry embedding (see `docs/deviations.md`).
    pub fn weight_matrices(&self) -> usize {
        self.attention + self.mlp
    }
}

/// Counts the parameters of `config` without building the model.
pub fn parameter_count(config: &ModelConfig) -> ParameterCount {
    let (d, layers, sites) = (config.d_model, config.n_layers, 2 * config.n_layers);
    let learned_bias = match config.method {
        ResidualMethod::Haares(options) => {
            matches!(options.detail_bias, DetailBias::Learned { .. }) as usize
        }
        _ => 0,
    };
    let router = 2 * d;
    let routers = if config.method.is_routed() {
        sites * (router + learned_bias) + router
    } else {
        0
    };
    let residual_scales = match config.method {
        ResidualMethod::ReZero => sites,
        ResidualMethod::LayerScale { .. } => sites * d,
        _ => 0,
    };
    ParameterCount {
        embedding: config.vocab_size * d,
        attention: layers * 4 * d * d,
        mlp: layers * 3 * d * config.d_ff,
        norms: (2 * layers + 1) * d,
        routers,
        residual_scales,
    }
}

/// eq:breakeven: HAARES finishes sooner than a `baseline_steps` Block AttnRes run iff it reaches
/// the target in fewer than `baseline_steps · v_H / v_B` steps; returns that threshold.
pub fn break_even_steps(baseline_steps: f64, haares_throughput: f64, block_throughput: f64) -> f64 {
    baseline_steps * haares_throughput / block_throughput
}
