//! What a model file must hold for its config, known from the config alone: every parameter's
//! checkpoint name and PyTorch-layout shape (docs/checkpoint-format.md), and the check of a file's
//! tensors against them that runs before any model is allocated.

use std::collections::HashMap;

use crate::config::ModelConfig;
use crate::error::{HaaresError, Result};

impl ModelConfig {
    /// Every parameter's checkpoint name and PyTorch-layout shape, in the order of
    /// [`HaaresModel::visit_named_params`](crate::HaaresModel::visit_named_params), from the config
    /// alone: nothing is allocated. Call it on a validated config (its bounds keep the list short).
    pub fn checkpoint_layout(&self) -> Vec<(String, Vec<usize>)> {
        let (d, d_ff) = (self.d_model, self.d_ff);
        let routed = self.method.is_routed();
        let learned_bias = self
            .method
            .haares_options()
            .is_some_and(|options| options.detail_bias.is_learned());
        let (gates, scales) = match self.method {
            crate::ResidualMethod::ReZero => (true, false),
            crate::ResidualMethod::LayerScale { .. } => (false, true),
            _ => (false, false),
        };
        let mut layout = vec![
            ("embed.weight".to_string(), vec![self.vocab_size, d]),
            ("final_norm.weight".to_string(), vec![d]),
        ];
        for i in 0..self.n_layers {
            let mut push = |suffix: &str, shape: Vec<usize>| {
                layout.push((format!("layers.{i}.{suffix}"), shape));
            };
            push("attn_norm.weight", vec![d]);
            push("mlp_norm.weight", vec![d]);
            for projection in ["wq", "wk", "wv", "wo"] {
                push(&format!("attn.{projection}.weight"), vec![d, d]);
            }
            push("mlp.w_gate.weight", vec![d_ff, d]);
            push("mlp.w_up.weight", vec![d_ff, d]);
            push("mlp.w_down.weight", vec![d, d_ff]);
            for site in ["attn_router", "mlp_router"].into_iter().filter(|_| routed) {
                push(&format!("{site}.query"), vec![d]);
                push(&format!("{site}.key_norm.weight"), vec![d]);
                if learned_bias {
                    push(&format!("{site}.detail_bias"), vec![1]);
                }
            }
            for (present, suffixes, shape) in [
                (gates, ["attn_gate", "mlp_gate"], 1),
                (scales, ["attn_scale", "mlp_scale"], d),
            ] {
                for suffix in suffixes.into_iter().filter(|_| present) {
                    push(suffix, vec![shape]);
                }
            }
        }
        if routed {
            layout.push(("final_router.query".to_string(), vec![d]));
            layout.push(("final_router.key_norm.weight".to_string(), vec![d]));
        }
        layout
    }

    /// The parameters no loss reaches, so that a backward pass gives them no gradient: with a
    /// learned detail bias, the bias of the first read site (layer 0's attention). That site
    /// reads the source set of eq:sourceset before any write, `{e}` alone, so its bias is added
    /// to no score. Every other parameter of [`checkpoint_layout`](Self::checkpoint_layout)
    /// receives a gradient from every backward pass, and a trainer may take a missing one as lost.
    pub fn parameters_without_gradient(&self) -> Vec<String> {
        let learned_bias = self
            .method
            .haares_options()
            .is_some_and(|options| options.detail_bias.is_learned());
        match learned_bias {
            true => vec!["layers.0.attn_router.detail_bias".to_string()],
            false => Vec::new(),
        }
    }
}

/// Checks a file's tensors, by name and shape, against what `config` implies, before anything is
/// allocated. `bytes_per_value` is the size of one value in the file (for the message).
///
/// The error gives the parameter counts where they differ (what the config implies and what the
/// file holds, with their bytes), then the first disagreement in the model's visiting order: a
/// tensor the file lacks, a shape unlike the config's, or a tensor no model of the config has.
pub fn check_layout(
    config: &ModelConfig,
    file: &HashMap<&str, &[usize]>,
    bytes_per_value: usize,
) -> Result<()> {
    let expected = config.checkpoint_layout();
    let count = |shapes: &mut dyn Iterator<Item = &[usize]>| -> u128 {
        shapes
            .map(|shape| shape.iter().map(|&n| n as u128).product::<u128>())
            .sum()
    };
    let implied = count(&mut expected.iter().map(|(_, shape)| shape.as_slice()));
    let held = count(&mut file.values().copied());
    let disagreement = first_disagreement(config, &expected, file);
    let Some(disagreement) = disagreement else {
        return Ok(());
    };
    let mismatch = match implied == held {
        true => String::new(),
        false => format!(
            "the config in its metadata implies {implied} parameters ({}) but the file holds \
             {held} ({}); ",
            human_bytes(implied * bytes_per_value as u128),
            human_bytes(held * bytes_per_value as u128),
        ),
    };
    Err(HaaresError::Checkpoint(format!(
        "the file does not match its own config: {mismatch}{disagreement}"
    )))
}

fn first_disagreement(
    config: &ModelConfig,
    expected: &[(String, Vec<usize>)],
    file: &HashMap<&str, &[usize]>,
) -> Option<String> {
    for (name, shape) in expected {
        match file.get(name.as_str()) {
            None => {
                return Some(format!(
                    "tensor `{name}` is missing (the config implies shape {shape:?})"
                ));
            }
            Some(held) if *held != shape.as_slice() => {
                return Some(format!(
                    "tensor `{name}`: the config implies shape {shape:?}, the file holds {held:?}"
                ));
            }
            Some(_) => {}
        }
    }
    let names: std::collections::HashSet<&str> =
        expected.iter().map(|(name, _)| name.as_str()).collect();
    let extra = file.keys().filter(|name| !names.contains(*name)).min()?;
    Some(format!(
        "tensor `{extra}` is not a parameter of a `{}` model of this config; was the file written \
         for another method or size?",
        config.method
    ))
}

/// Bytes in decimal units, three significant figures: `1.07 GB`.
fn human_bytes(bytes: u128) -> String {
    let units = ["bytes", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} bytes"),
        _ => format!("{value:.3} {}", units[unit]),
    }
}
