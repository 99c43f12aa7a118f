//! The analytic commands: the paper's source-count table (tab:sourcecounts), parameter counts
//! (tab:modelconfig) and training FLOPs per token (tab:cost, [`flops_table`]), as markdown
//! tables; nothing is run.

pub mod flops_table;

use std::fmt::Write as _;

use haares_core::ResidualMethod;
use haares_core::analysis::{parameter_count, source_count_summary};
use haares_core::{ModelConfig, ModelFamily};

use crate::Result;

/// tab:sourcecounts for `layers` at each block count: average and maximum intermediate-read slots
/// of Block AttnRes and HAARES, and the final router's slots (N + 1 in both).
pub fn sources_table(layers: usize, blocks: &[usize]) -> Result<String> {
    let mut out = format!(
        "Intermediate-read source counts at {layers} layers (the final router excluded from the average)\n\n\
         | N | events per block | Block AttnRes average | Block AttnRes maximum | HAARES average | HAARES maximum | final router |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for &n in blocks {
        let block = source_count_summary(false, layers, n)?;
        let haares = source_count_summary(true, layers, n)?;
        let _ = writeln!(
            out,
            "| {n} | {} | {:.2} | {} | {:.2} | {} | {} |",
            2 * layers / n,
            block.average,
            block.maximum,
            haares.average,
            haares.maximum,
            haares.final_readout
        );
    }
    Ok(out)
}

/// Parameter counts for every family × depth × method at one vocabulary size.
pub fn params_table(
    families: &[ModelFamily],
    layers: &[usize],
    vocab: usize,
    methods: &[ResidualMethod],
) -> Result<String> {
    let mut out = format!(
        "Parameters at vocabulary {vocab}. \"Matrices\" is attention + MLP weights, the quantity of the \
         paper's character-model figures; \"total\" is every trainable tensor.\n\n\
         | family | layers | method | matrices | embedding | norms | routers | residual scales | total |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    for family in families {
        for &l in layers {
            for &method in methods {
                let config: ModelConfig = family.config(l, vocab, method);
                config.validate()?;
                let count = parameter_count(&config);
                let _ = writeln!(
                    out,
                    "| {family:?} | {l} | {} | {} | {} | {} | {} | {} | {} |",
                    method.label(),
                    thousands(count.weight_matrices()),
                    thousands(count.embedding),
                    thousands(count.norms),
                    thousands(count.routers),
                    thousands(count.residual_scales),
                    thousands(count.total())
                );
            }
        }
    }
    Ok(out)
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
