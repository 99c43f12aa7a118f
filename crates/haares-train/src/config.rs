//! One run's complete configuration.

use haares_core::{ModelConfig, ResidualMethod, RoutingPath};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Result, TrainError};
use crate::run::optim::AdamWSettings;

/// Which tokeniser a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// Characters: 4 specials + the most frequent training characters (at most 256 ids).
    Char,
    /// Byte-level BPE with 4096 entries, chunk-level 95/5 split (docs/decisions.md, decision 10).
    Bpe,
}

/// Everything that determines a run's result. Defaults are the paper's (tab:reprotrain,
/// tab:modelconfig medium family); presets and overrides change fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Registry dataset name (`sotu` is the embedded corpus).
    pub dataset: String,
    /// Tokeniser.
    pub tokenizer: TokenizerKind,
    /// Residual method, by its name ([`ResidualMethod`]'s `FromStr`: `block-attnres`, `haares`,
    /// …).
    #[serde(deserialize_with = "method_name")]
    pub method: String,
    /// Layers L.
    pub layers: usize,
    /// Blocks N (must divide 2L).
    pub blocks: usize,
    /// Hidden width d.
    pub d_model: usize,
    /// SwiGLU inner width.
    pub d_ff: usize,
    /// Attention heads.
    pub heads: usize,
    /// Positions trained on per chunk (≤ 512; the first `seq_len` of each prepared chunk).
    pub seq_len: usize,
    /// Sequences per step.
    pub batch_size: usize,
    /// Training steps.
    pub steps: usize,
    /// A validation pass every this many steps (and at the last step).
    pub eval_every: usize,
    /// A checkpoint every this many steps (and at the last step).
    pub checkpoint_every: usize,
    /// A metrics line every this many steps (mean train loss over the interval).
    pub log_every: usize,
    /// Chunks of the validation split per pass (the first ones, in file order); `None` = all.
    pub val_chunks: Option<usize>,
    /// Model-initialisation seed.
    pub model_seed: u64,
    /// Data-order seed.
    pub data_seed: u64,
    /// Optimizer settings.
    pub optimizer: AdamWSettings,
    /// Router implementation: `auto` (default), `reference` or `fused`; results agree to float
    /// rounding (`--set routing=reference` forces the literal equation).
    pub routing: RoutingPath,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            dataset: "openwebtext".into(),
            tokenizer: TokenizerKind::Char,
            method: "haares".into(),
            layers: 48,
            blocks: 4,
            d_model: 512,
            d_ff: 2048,
            heads: 8,
            seq_len: 512,
            batch_size: 16,
            steps: 30_000,
            eval_every: 2_000,
            checkpoint_every: 2_000,
            log_every: 10,
            val_chunks: None,
            model_seed: 42,
            data_seed: 42,
            optimizer: AdamWSettings::default(),
            routing: RoutingPath::Auto,
        }
    }
}

impl RunConfig {
    /// The model config for a vocabulary of `vocab_size` ids, validated.
    pub fn model_config(&self, vocab_size: usize) -> Result<ModelConfig> {
        let method = self.method.parse::<ResidualMethod>()?;
        let config = ModelConfig::new(vocab_size, self.d_model, self.d_ff, self.layers)
            .with_n_heads(self.heads)
            .with_blocks(self.blocks)
            .with_method(method)
            .with_routing(self.routing);
        config.validate()?;
        Ok(config)
    }

    /// Checks the fields the model config does not cover.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("steps", self.steps),
            ("batch_size", self.batch_size),
            ("seq_len", self.seq_len),
            ("eval_every", self.eval_every),
            ("checkpoint_every", self.checkpoint_every),
            ("log_every", self.log_every),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(TrainError::Config(format!("`{field}` must be at least 1")));
            }
        }
        if self.seq_len > haares_data::chunking::CHUNK_LEN - 1 {
            return Err(TrainError::Config(format!(
                "`seq_len` is {} but prepared chunks hold {} positions; choose seq_len ≤ {}",
                self.seq_len,
                haares_data::chunking::CHUNK_LEN - 1,
                haares_data::chunking::CHUNK_LEN - 1
            )));
        }
        if !self.checkpoint_every.is_multiple_of(self.log_every) {
            return Err(TrainError::Config(format!(
                "`checkpoint_every` ({}) must be a multiple of `log_every` ({}) so that a resumed \
                 run logs the same intervals as an uninterrupted one",
                self.checkpoint_every, self.log_every
            )));
        }
        if self.val_chunks == Some(0) {
            return Err(TrainError::Config(
                "`val_chunks` must be at least 1 (leave it out for a full validation pass)".into(),
            ));
        }
        let o = &self.optimizer;
        let finite = o.lr.is_finite() && o.lr > 0.0 && o.weight_decay >= 0.0 && o.epsilon > 0.0;
        let betas = (0.0..1.0).contains(&o.beta1) && (0.0..1.0).contains(&o.beta2);
        if !finite || !betas || o.clip_norm.is_some_and(|c| c.is_nan() || c <= 0.0) {
            return Err(TrainError::Config(format!(
                "optimizer settings out of range: {o:?} (lr > 0, 0 ≤ β < 1, ε > 0, decay ≥ 0, clip > 0)"
            )));
        }
        self.method.parse::<ResidualMethod>()?;
        // Vocabulary does not change validity; check the shape now with a stand-in.
        self.model_config(256).map(|_| ())
    }

    /// Target tokens per step (positions × sequences; pads included).
    pub fn tokens_per_step(&self) -> usize {
        self.batch_size * self.seq_len
    }
}

/// Reads a method name in its one spelling ([`ResidualMethod`]'s): a name an earlier version
/// wrote (`block_attnres`) reads as today's (`block-attnres`). A name that is no method stays as
/// written, for [`RunConfig::validate`] to refuse with the list of names.
fn method_name<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<String, D::Error> {
    let name = String::deserialize(deserializer)?;
    Ok(name
        .parse::<ResidualMethod>()
        .map_or(name, |method| method.name()))
}

#[cfg(test)]
mod tests {
    use super::RunConfig;

    #[test]
    fn a_method_name_an_earlier_version_wrote_reads_in_todays_spelling() {
        let old: RunConfig =
            serde_json::from_value(serde_json::json!({ "method": "block_attnres" })).unwrap();
        assert_eq!(old.method, "block-attnres");
        assert_eq!(
            old,
            RunConfig {
                method: "block-attnres".into(),
                ..RunConfig::default()
            }
        );
        let valued: RunConfig =
            serde_json::from_value(serde_json::json!({ "method": "haares-fixed-bias=-2.0" }))
                .unwrap();
        assert_eq!(valued.method, "haares-fixed-bias=-2");
    }

    #[test]
    fn an_unknown_method_stays_as_written_and_is_refused_by_validate() {
        let config: RunConfig =
            serde_json::from_value(serde_json::json!({ "method": "resnet" })).unwrap();
        assert_eq!(config.method, "resnet");
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("unknown method `resnet`"), "{error}");
    }
}
