//! The paper's published values as data: each table a TOML file of `experiments/paper/`
//! transcribed once from the paper, a cell per value with its setting (dataset, width, depth,
//! blocks, tokeniser, method, seed), so that a report can put the paper's number beside its own.
//! A study names its files (`paper_values`), relative to the study file; the built-in studies'
//! files are embedded in the binary as the studies are. `tests/train/paper.rs` checks the
//! transcription wherever the paper gives a number twice.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Result, TrainError};

/// The built-in tables, by their path relative to `experiments/`.
pub const BUILTIN_PAPER_TABLES: &[(&str, &str)] = &[
    (
        "paper/tab-depthsweep.toml",
        include_str!("../../experiments/paper/tab-depthsweep.toml"),
    ),
    (
        "paper/tab-201m.toml",
        include_str!("../../experiments/paper/tab-201m.toml"),
    ),
    (
        "paper/tab-453m.toml",
        include_str!("../../experiments/paper/tab-453m.toml"),
    ),
    (
        "paper/tab-bpe.toml",
        include_str!("../../experiments/paper/tab-bpe.toml"),
    ),
    (
        "paper/tab-pairdiffs.toml",
        include_str!("../../experiments/paper/tab-pairdiffs.toml"),
    ),
    (
        "paper/tab-crossdomain.toml",
        include_str!("../../experiments/paper/tab-crossdomain.toml"),
    ),
    (
        "paper/tab-blockablation.toml",
        include_str!("../../experiments/paper/tab-blockablation.toml"),
    ),
    (
        "paper/tab-basisablation.toml",
        include_str!("../../experiments/paper/tab-basisablation.toml"),
    ),
    (
        "paper/tab-timetotarget.toml",
        include_str!("../../experiments/paper/tab-timetotarget.toml"),
    ),
    (
        "paper/tab-cost.toml",
        include_str!("../../experiments/paper/tab-cost.toml"),
    ),
];

/// One published table.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperTable {
    /// The paper's label (`tab:201m`).
    pub label: String,
    /// Its values, in the file's order.
    pub cells: Vec<PaperCell>,
}

/// One published value (or the values of one cell: a loss and its perplexity) and its setting.
/// A setting field the cell leaves out is the file's (the fields given once at its top).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaperCell {
    /// The dataset's registry name.
    pub dataset: Option<String>,
    /// Hidden width d.
    pub d_model: Option<usize>,
    /// Depth L.
    pub layers: Option<usize>,
    /// Block count N.
    pub blocks: Option<usize>,
    /// `bpe` for the BPE runs; absent for characters.
    pub tokenizer: Option<String>,
    /// The method's name (`haares_core::method::METHOD_NAMES`).
    pub method: String,
    /// The model seed; `None` for a mean over seeds.
    pub seed: Option<u64>,
    /// Marks a mean over seeds in the file, so that a forgotten `seed` is an error, not a mean.
    #[serde(default)]
    pub mean: bool,
    /// Best validation loss (for a mean row: the mean over seeds).
    pub loss: Option<f64>,
    /// Perplexity (for a mean row: the mean of the per-seed perplexities, as the paper reports).
    pub perplexity: Option<f64>,
    /// Sample standard deviation of the seeds' losses (mean rows).
    pub sd: Option<f64>,
    /// HAARES's mean loss minus Block AttnRes's at the same setting (negative favours HAARES).
    pub delta: Option<f64>,
    /// The paired reduction ℓ_baseline − ℓ_method (positive favours the method).
    pub reduction: Option<f64>,
    /// The method a reduction is measured from.
    #[serde(default = "block_attnres")]
    pub baseline: String,
    /// Whether the perplexity is the paper's own correction of a reported value.
    #[serde(default)]
    pub corrected: bool,
    /// tab:timetotarget: the same-seed Block AttnRes best loss the method is to reach.
    pub target: Option<f64>,
    /// tab:timetotarget: the first validation-grid step at which it does.
    pub step: Option<u64>,
    /// tab:timetotarget: the method's validation loss at that step.
    pub crossing_loss: Option<f64>,
    /// tab:timetotarget: the estimated hours to that step.
    pub hours: Option<f64>,
    /// tab:timetotarget: the fraction of the baseline's full-budget time saved.
    pub time_saved: Option<f64>,
    /// tab:cost: peak allocated memory, GB.
    pub memory_gb: Option<f64>,
    /// tab:cost: throughput from step zero, thousands of tokens per second.
    pub ktokens_per_s: Option<f64>,
    /// tab:cost: step time, seconds (8192 tokens / throughput).
    pub step_s: Option<f64>,
    /// tab:cost: the peak-memory increase over Block AttnRes, as a fraction.
    pub memory_increase: Option<f64>,
    /// tab:cost: the step-time increase over Block AttnRes, as a fraction.
    pub time_increase: Option<f64>,
    /// tab:cost: the analytic FLOP increase over Block AttnRes, as a fraction.
    pub flop_increase: Option<f64>,
}

impl PaperCell {
    /// Whether the cell holds a value that belongs to a seed or to a mean over seeds (tab:cost's
    /// measurements belong to neither).
    fn is_per_seed(&self) -> bool {
        self.loss.is_some()
            || self.perplexity.is_some()
            || self.sd.is_some()
            || self.delta.is_some()
            || self.reduction.is_some()
            || self.target.is_some()
            || self.step.is_some()
    }
}

fn block_attnres() -> String {
    "block-attnres".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    label: String,
    dataset: Option<String>,
    d_model: Option<usize>,
    layers: Option<usize>,
    blocks: Option<usize>,
    tokenizer: Option<String>,
    cells: Vec<PaperCell>,
}

/// Parses one table file; `name` is what errors call it.
pub fn parse_paper_table(name: &str, text: &str) -> Result<PaperTable> {
    let raw: RawTable = toml::from_str(text).map_err(|e| {
        TrainError::Config(format!(
            "{name} is not a valid table of the paper's values: {e}"
        ))
    })?;
    let mut cells = raw.cells;
    for (i, cell) in cells.iter_mut().enumerate() {
        if (cell.mean && cell.seed.is_some())
            || (cell.is_per_seed() && cell.mean == cell.seed.is_some())
        {
            return Err(TrainError::Config(format!(
                "{name}: cell {} ({}) must have either a `seed` or `mean = true`",
                i + 1,
                cell.method
            )));
        }
        cell.dataset = cell.dataset.take().or_else(|| raw.dataset.clone());
        cell.d_model = cell.d_model.or(raw.d_model);
        cell.layers = cell.layers.or(raw.layers);
        cell.blocks = cell.blocks.or(raw.blocks);
        cell.tokenizer = cell.tokenizer.take().or_else(|| raw.tokenizer.clone());
    }
    Ok(PaperTable {
        label: raw.label,
        cells,
    })
}

/// The table at `file` (a path relative to `experiments/` for a built-in study, `dir` `None`;
/// relative to the study file's folder `dir` for a study given by its path).
pub fn load_paper_table(file: &str, dir: Option<&Path>) -> Result<PaperTable> {
    let Some(dir) = dir else {
        let (_, text) = BUILTIN_PAPER_TABLES
            .iter()
            .find(|(name, _)| *name == file)
            .ok_or_else(|| {
                TrainError::Config(format!(
                    "no built-in table of the paper's values at `{file}`; the built-in ones: {}",
                    BUILTIN_PAPER_TABLES
                        .iter()
                        .map(|(name, _)| *name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        return parse_paper_table(file, text);
    };
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io(&path, e))?;
    parse_paper_table(&path.display().to_string(), &text)
}
