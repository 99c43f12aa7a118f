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
#[derive(Debug, Clone, PartialEq)]
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
    /// The method a reduction is measured from: Block AttnRes unless the cell names another.
    pub baseline: String,
    /// Whether the perplexity is the paper's own correction of a reported value.
    pub corrected: bool,
}

/// The setting fields a file gives once for all its cells, and a cell may override.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Setting {
    dataset: Option<String>,
    d_model: Option<usize>,
    layers: Option<usize>,
    blocks: Option<usize>,
    tokenizer: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    label: String,
    #[serde(flatten)]
    setting: Setting,
    cells: Vec<RawCell>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCell {
    #[serde(flatten)]
    setting: Setting,
    method: String,
    seed: Option<u64>,
    #[serde(default)]
    mean: bool,
    loss: Option<f64>,
    perplexity: Option<f64>,
    sd: Option<f64>,
    delta: Option<f64>,
    reduction: Option<f64>,
    baseline: Option<String>,
    #[serde(default)]
    corrected: bool,
}

/// Parses one table file; `name` is what errors call it.
pub fn parse_paper_table(name: &str, text: &str) -> Result<PaperTable> {
    let raw: RawTable = toml::from_str(text).map_err(|e| {
        TrainError::Config(format!(
            "{name} is not a valid table of the paper's values: {e}"
        ))
    })?;
    let cells = raw
        .cells
        .into_iter()
        .enumerate()
        .map(|(i, cell)| {
            if cell.mean == cell.seed.is_some() {
                return Err(TrainError::Config(format!(
                    "{name}: cell {} ({}) must have either a `seed` or `mean = true`",
                    i + 1,
                    cell.method
                )));
            }
            let file = &raw.setting;
            Ok(PaperCell {
                dataset: cell.setting.dataset.or_else(|| file.dataset.clone()),
                d_model: cell.setting.d_model.or(file.d_model),
                layers: cell.setting.layers.or(file.layers),
                blocks: cell.setting.blocks.or(file.blocks),
                tokenizer: cell.setting.tokenizer.or_else(|| file.tokenizer.clone()),
                method: cell.method,
                seed: cell.seed,
                loss: cell.loss,
                perplexity: cell.perplexity,
                sd: cell.sd,
                delta: cell.delta,
                reduction: cell.reduction,
                baseline: cell.baseline.unwrap_or_else(|| "block-attnres".into()),
                corrected: cell.corrected,
            })
        })
        .collect::<Result<_>>()?;
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
