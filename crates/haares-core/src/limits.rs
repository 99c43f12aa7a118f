//! Upper bounds on a model's sizes, checked by
//! [`ModelConfig::validate`](crate::ModelConfig::validate) before anything is allocated, and the
//! check that the blocks partition the residual events, which the stream's validation shares.
//!
//! A model file carries its config as metadata, and a config that lies (a million layers, a
//! vocabulary of 2^30) would otherwise cost its memory before any check could compare it with the
//! file's tensors. Each bound is far above every published model of its kind, so that no real
//! model is refused, and low enough that a config at the bounds fails its check against the file
//! before it costs more than the file itself (docs/decisions.md, "Model files are untrusted").

/// Most layers L: DeepNet (Wang et al., 2022) trained 1,000-layer Transformers, the deepest
/// published; the paper's deepest model has 48.
pub const MAX_LAYERS: usize = 1024;

/// Widest hidden width d: about twice the widest published dense Transformer (PaLM 540B,
/// d = 18,432); the paper's widest is 768.
pub const MAX_WIDTH: usize = 32_768;

/// Widest SwiGLU inner width d_ff: about twice PaLM 540B's 73,728.
pub const MAX_FF_WIDTH: usize = 1 << 17;

/// Most attention heads: ten times the most published (GPT-3's 96, PaLM's 48).
pub const MAX_HEADS: usize = 1024;

/// Largest vocabulary: eight times the largest published tokenisers (about 256k entries); the
/// paper's is 4,096.
pub const MAX_VOCAB: usize = 1 << 21;

/// Longest context `max_seq_len`: 2^20 tokens, eight times the 128k of long-context models.
pub const MAX_CONTEXT: usize = 1 << 20;

/// Most entries of one RoPE table, `max_seq_len · d` (a model keeps two, cos and sin, which a
/// model file does not hold): 2^26, 256 MiB each in f32 (e.g. a 2,048-wide model with a 32k
/// context). The context is the one size a file's tensors do not pin down, so it is this product
/// that bounds what a lying config can cost beyond the file.
pub const MAX_ROTARY_TABLE: usize = 1 << 26;

/// Refuses a block count that does not divide the events (docs/decisions.md, decision 12);
/// `events_name` is how the message writes the event count (`2L`, `T`).
pub(crate) fn check_partition(
    events: usize,
    blocks: usize,
    events_name: &str,
) -> crate::Result<()> {
    if events.is_multiple_of(blocks) {
        return Ok(());
    }
    let divisors: Vec<usize> = (1..=events).filter(|n| events.is_multiple_of(*n)).collect();
    Err(crate::HaaresError::config(
        "blocks",
        format!(
            "N = {blocks} does not divide the {events_name} = {events} residual events; uneven \
             partitions are refused (docs/decisions.md, decision 12). Valid block counts: \
             {divisors:?}"
        ),
    ))
}
