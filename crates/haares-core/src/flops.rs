//! Analytic FLOPs per training token (tab:cost's "FLOP inc." column), counted operation by
//! operation from the same event walk the model performs, beside the source and parameter counts
//! of [`crate::analysis`].
//!
//! # Convention
//! - A multiply–add is 2 FLOPs; every other elementwise operation (add, multiply, square, exp,
//!   reciprocal square root, compare) is 1 FLOP. Reductions count one FLOP per element.
//! - Training = forward + backward = 3 × forward (the backward of every operation is counted as
//!   twice its forward, the usual convention for model FLOPs).
//! - Attention scores and the attention-weighted sum are counted over the full context `T`
//!   (`4·d·T` per token and layer), as in PaLM's model-FLOPs convention and as the implementation
//!   computes them (masked, not skipped).
//! - The paper's increment counts "detail accumulation, RMS matching, and routing arithmetic"
//!   (app. time-to-target); those are the three rows that differ between Block AttnRes and HAARES
//!   here. Embedding lookups and parameter updates are not counted.

use crate::analysis::source_count;
use crate::config::DetailSource;
use crate::{ModelConfig, ResidualMethod};

/// Forward FLOPs per token, by component.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FlopCount {
    /// Attention projections (q, k, v, o) and the SwiGLU MLP's three matrices.
    pub matrices: f64,
    /// Attention scores, softmax and the weighted sum over `T` positions; RoPE.
    pub attention: f64,
    /// Pre-norms, SwiGLU's activation, residual additions/scales, the final norm.
    pub elementwise: f64,
    /// The tied head and the cross-entropy.
    pub head: f64,
    /// Depth routing: key RMSNorm, scores, softmax and mixture at every read site
    /// (eq:routingweights).
    pub routing: f64,
    /// `C ← C + u` and `D ← D ± u` (eq:update).
    pub accumulation: f64,
    /// eq:rmsmatch at every detail slot formed.
    pub rms_matching: f64,
}

impl FlopCount {
    /// Forward FLOPs per token.
    pub fn forward(&self) -> f64 {
        self.matrices
            + self.attention
            + self.elementwise
            + self.head
            + self.routing
            + self.accumulation
            + self.rms_matching
    }

    /// Training FLOPs per token: 3 × forward.
    pub fn training(&self) -> f64 {
        3.0 * self.forward()
    }

    /// The source-handling share: routing + accumulation + RMS matching.
    pub fn source_handling(&self) -> f64 {
        self.routing + self.accumulation + self.rms_matching
    }
}

/// An affine RMSNorm over `d`: square, sum, scale, weight.
fn rms_norm(d: f64) -> f64 {
    4.0 * d
}

/// eq:routingweights over `slots` sources: a key RMSNorm and a dot product per slot, the bias,
/// a softmax over the slots, and the weighted sum.
pub fn routing_flops(d: f64, slots: usize) -> f64 {
    let s = slots as f64;
    s * (rms_norm(d) + 2.0 * d) + s + 4.0 * s + 2.0 * d * s
}

/// eq:rmsmatch: two RMS values (square, sum), the clipped ratio, and the scaling of `D`.
pub fn rms_match_flops(d: f64) -> f64 {
    2.0 * (2.0 * d + 1.0) + 4.0 + d
}

/// Forward FLOPs per token of `config` at context length `seq`.
pub fn flops_per_token(config: &ModelConfig, seq: usize) -> FlopCount {
    let (d, d_ff, t) = (config.d_model as f64, config.d_ff as f64, seq as f64);
    let (layers, heads, vocab) = (
        config.n_layers as f64,
        config.n_heads as f64,
        config.vocab_size as f64,
    );
    let residual_update = match config.method {
        ResidualMethod::Standard => d,
        ResidualMethod::ReZero | ResidualMethod::LayerScale { .. } => 2.0 * d,
        // Routed methods write to accumulators instead (counted under `accumulation`).
        ResidualMethod::BlockAttnRes | ResidualMethod::Haares(_) => 0.0,
    };
    let mut count = FlopCount {
        matrices: layers * (2.0 * 4.0 * d * d + 2.0 * 3.0 * d * d_ff),
        // QKᵀ and AV (2·d·T each), softmax with scale and mask (≈ 6 per score), RoPE on q and k.
        attention: layers * (4.0 * d * t + 6.0 * heads * t + 6.0 * d),
        // Two pre-norms, SiLU (4) and the gate product per MLP unit, two residual updates; final
        // norm.
        elementwise: layers * (2.0 * rms_norm(d) + 5.0 * d_ff + 2.0 * residual_update)
            + rms_norm(d),
        // Logits, then log-softmax and the target pick.
        head: 2.0 * d * vocab + 4.0 * vocab,
        ..FlopCount::default()
    };
    if config.method.is_routed() {
        add_source_handling(config, d, &mut count);
    }
    count
}

/// Walks the events as the model does: a read over eq:sourceset, a write (eq:update), and the
/// detail slots formed along the way; then the final readout over `{e, C_1 … C_N}`.
fn add_source_handling(config: &ModelConfig, d: f64, count: &mut FlopCount) {
    let options = config.method.haares_options();
    let with_detail = options.is_some();
    let matches_rms =
        options.is_some_and(|o| o.rms_match && o.detail != DetailSource::DuplicatedCumulative);
    let m = config.events_per_block();
    for block in 1..=config.blocks {
        for r in 1..=m {
            count.routing += routing_flops(d, source_count(with_detail, block, r));
            if matches_rms && r > 1 {
                // The active block's detail slot is formed afresh at every read that sees it.
                count.rms_matching += rms_match_flops(d);
            }
            if r > 1 {
                // C ← C + u, and D ← D ± u where a detail is tracked (the first write is a copy).
                count.accumulation += if with_detail { 2.0 * d } else { d };
            }
        }
        if matches_rms && block < config.blocks {
            // The completed pair's detail, matched once and cached (the last block's is never
            // read).
            count.rms_matching += rms_match_flops(d);
        }
    }
    count.routing += routing_flops(d, config.blocks + 1);
}

/// The HAARES increment over Block AttnRes in training FLOPs, as a fraction.
pub fn increment(haares: &FlopCount, block: &FlopCount) -> f64 {
    haares.training() / block.training() - 1.0
}
