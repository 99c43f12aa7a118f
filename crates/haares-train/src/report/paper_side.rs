//! The paper's published values (`experiments/paper/`, [`crate::study::paper`]) matched to a
//! report's runs. A run's counterpart is the study's `paper` preset run at the same setting (the
//! same grid values besides method and seed); a paper cell belongs to that setting when its
//! dataset, width, depth, block count and tokeniser are the counterpart's. Every field in which a
//! run differs from its counterpart (steps, width, dataset, seeds, …) is collected, so that the
//! report can say at which scale it compares.

use std::collections::BTreeMap;

use crate::RunConfig;
use crate::error::Result;
use crate::report::evidence::Evidence;
use crate::report::results::{BASELINE, Finished};
use crate::study::paper::{PaperCell, PaperTable};
use crate::study::{Overrides, PlannedRun, Study};

/// The fields left out of the scale comparison: method and seed are matched run by run, and the
/// others do not change what a run learns. Depth and block count stay in it: as grid values they
/// are equal through the setting, and a `--set blocks=…` over the study's fixed value must show.
const NOT_SCALE: &[&str] = &[
    "method",
    "model_seed",
    "checkpoint_every",
    "log_every",
    "routing",
];

/// One field in which the runs differ from the paper's.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleDifference {
    /// The config field (`optimizer.lr` for a nested one), or `model_seed` for the seeds.
    pub field: String,
    /// Our values, distinct, in run order.
    pub ours: Vec<String>,
    /// The paper's values at the same settings, distinct.
    pub paper: Vec<String>,
}

/// The paper's values for one study's report.
#[derive(Debug, Clone)]
pub struct PaperSide {
    /// The study's tables (`paper_values`).
    pub tables: Vec<PaperTable>,
    /// The `paper` preset's config at each of our settings that it has, by our setting label.
    settings: BTreeMap<String, RunConfig>,
    /// Our settings without a counterpart (a dataset or depth the paper did not train).
    pub unmatched: Vec<String>,
    /// Where our runs' settings differ from the paper's.
    pub scale: Vec<ScaleDifference>,
}

impl PaperSide {
    /// The paper's side of `study`'s report over its planned `runs` and the `finished` ones;
    /// `None` when the study names no paper tables or has no `paper` preset to match with.
    pub fn new(study: &Study, runs: &[PlannedRun], finished: &[Finished]) -> Result<Option<Self>> {
        let tables = study.paper_tables()?;
        if tables.is_empty() || !study.presets.contains_key("paper") {
            return Ok(None);
        }
        let paper_runs = study.plan(Some("paper"), &Overrides::default())?;
        let (mut settings, mut unmatched) = (BTreeMap::new(), Vec::new());
        let mut compared: Vec<(&RunConfig, &RunConfig)> = Vec::new();
        for run in runs {
            let label = run.setting_label();
            let in_paper: Vec<&PlannedRun> = paper_runs
                .iter()
                .filter(|p| p.setting == run.setting)
                .collect();
            let Some(first) = in_paper.first() else {
                if !unmatched.contains(&label) {
                    unmatched.push(label);
                }
                continue;
            };
            settings
                .entry(label)
                .or_insert_with(|| first.config.clone());
            let ran = finished
                .iter()
                .any(|f| f.run_dir.ends_with(&run.name) && f.summary.config == run.config);
            if ran {
                let twin = in_paper
                    .iter()
                    .find(|p| {
                        p.config.method == run.config.method
                            && p.config.model_seed == run.config.model_seed
                    })
                    .unwrap_or(first);
                compared.push((&run.config, &twin.config));
            }
        }
        let mut scale = scale_differences(&compared);
        let seeds = |runs: &mut dyn Iterator<Item = &RunConfig>| {
            let mut seeds: Vec<u64> = runs.map(|c| c.model_seed).collect();
            seeds.sort_unstable();
            seeds.dedup();
            seeds
        };
        let ours = seeds(&mut finished.iter().map(|f| &f.summary.config));
        let paper = seeds(&mut paper_runs.iter().map(|p| &p.config));
        if ours != paper {
            scale.push(ScaleDifference {
                field: "model_seed".into(),
                ours: ours.iter().map(u64::to_string).collect(),
                paper: paper.iter().map(u64::to_string).collect(),
            });
        }
        Ok(Some(Self {
            tables,
            settings,
            unmatched,
            scale,
        }))
    }

    /// The `paper` preset's config at our `setting`.
    pub fn paper_config(&self, setting: &str) -> Option<&RunConfig> {
        self.settings.get(setting)
    }

    /// Whether our runs are at the paper's settings in every field that changes a result.
    pub fn at_paper_scale(&self) -> bool {
        self.scale.is_empty()
    }

    /// The cells of our `setting`, with their table's label.
    fn cells(&self, setting: &str) -> impl Iterator<Item = (&str, &PaperCell)> {
        let config = self.settings.get(setting);
        self.tables.iter().flat_map(move |t| {
            t.cells
                .iter()
                .filter(move |c| config.is_some_and(|config| cell_in(c, config)))
                .map(move |c| (t.label.as_str(), c))
        })
    }

    /// The paper's best loss of `method` and `seed` at `setting` (the first table that has it).
    pub fn seed_cell(&self, setting: &str, method: &str, seed: u64) -> Option<(&str, &PaperCell)> {
        self.cells(setting)
            .find(|(_, c)| c.method == method && c.seed == Some(seed) && c.loss.is_some())
    }

    /// The paper's mean over seeds of `method` at `setting`.
    pub fn mean_cell(&self, setting: &str, method: &str) -> Option<(&str, &PaperCell)> {
        self.cells(setting)
            .find(|(_, c)| c.method == method && c.mean && c.loss.is_some())
    }

    /// The seeds for which the paper gives `method`'s loss at `setting`, ascending.
    pub fn seeds(&self, setting: &str, method: &str) -> Vec<u64> {
        let mut seeds: Vec<u64> = self
            .cells(setting)
            .filter(|(_, c)| c.method == method && c.loss.is_some())
            .filter_map(|(_, c)| c.seed)
            .collect();
        seeds.sort_unstable();
        seeds.dedup();
        seeds
    }

    /// The paper's per-seed reductions ℓ_baseline − ℓ_method at `setting`: printed ones where it
    /// prints them (tab:pairdiffs, the ablations' text), else from its per-seed losses.
    pub fn reductions(&self, setting: &str, method: &str, baseline: &str) -> Evidence {
        let mut seeds = self.seeds(setting, method);
        seeds.extend(
            self.printed_reductions(setting, method, baseline)
                .map(|(s, _)| s),
        );
        seeds.sort_unstable();
        seeds.dedup();
        let reductions = seeds
            .into_iter()
            .filter_map(|seed| {
                let printed = self
                    .printed_reductions(setting, method, baseline)
                    .find(|(s, _)| *s == seed)
                    .map(|(_, g)| g);
                let from_losses = || {
                    let loss = |m: &str| self.seed_cell(setting, m, seed).and_then(|(_, c)| c.loss);
                    Some(loss(baseline)? - loss(method)?)
                };
                printed.or_else(from_losses).map(|g| (seed, g))
            })
            .collect();
        Evidence { reductions }
    }

    fn printed_reductions<'a>(
        &'a self,
        setting: &'a str,
        method: &'a str,
        baseline: &'a str,
    ) -> impl Iterator<Item = (u64, f64)> + 'a {
        self.cells(setting).filter_map(move |(_, c)| {
            (c.method == method && c.baseline == baseline)
                .then_some(())
                .and(c.seed.zip(c.reduction))
        })
    }

    /// The paper's mean reduction ℓ_baseline − ℓ_method at `setting`: printed (a mean reduction,
    /// or −Δ), else from its two means, else the mean of its per-seed reductions.
    pub fn mean_reduction(&self, setting: &str, method: &str, baseline: &str) -> Option<f64> {
        let printed = self.cells(setting).find_map(|(_, c)| {
            (c.method == method && c.mean && c.baseline == baseline)
                .then(|| c.reduction.or(c.delta.map(|d| -d)))
                .flatten()
        });
        let from_means = || {
            let mean = |m: &str| self.mean_cell(setting, m).and_then(|(_, c)| c.loss);
            Some(mean(baseline)? - mean(method)?)
        };
        printed
            .or_else(from_means)
            .or_else(|| self.reductions(setting, method, baseline).mean())
    }

    /// The comparisons the paper prints against another baseline than Block AttnRes at
    /// `setting` (the ablations' controls), as (method, baseline).
    pub fn other_baselines(&self, setting: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (_, c) in self.cells(setting) {
            let key = (c.method.clone(), c.baseline.clone());
            if c.reduction.is_some() && c.baseline != BASELINE && !out.contains(&key) {
                out.push(key);
            }
        }
        out
    }

    /// The paper's time-to-target cell of `seed` (or its mean row, `None`) at `setting`.
    pub fn time_to_target(&self, setting: &str, seed: Option<u64>) -> Option<&PaperCell> {
        self.cells(setting)
            .map(|(_, c)| c)
            .find(|c| c.step.is_some() && c.seed == seed && c.mean == seed.is_none())
    }
}

/// Whether `cell` is about the run `config` describes (apart from method and seed).
fn cell_in(cell: &PaperCell, config: &RunConfig) -> bool {
    let tokenizer = serde_json::to_value(config.tokenizer).ok();
    let tokenizer = tokenizer
        .as_ref()
        .and_then(|t| t.as_str())
        .unwrap_or("char");
    cell.dataset.as_deref().is_none_or(|d| d == config.dataset)
        && cell.d_model.is_none_or(|d| d == config.d_model)
        && cell.layers.is_none_or(|l| l == config.layers)
        && cell.blocks.is_none_or(|n| n == config.blocks)
        && cell.tokenizer.as_deref().unwrap_or("char") == tokenizer
}

/// The fields (nested ones as `outer.inner`) in which any (ours, paper's) pair differs, with
/// each side's distinct values.
fn scale_differences(compared: &[(&RunConfig, &RunConfig)]) -> Vec<ScaleDifference> {
    let mut out: Vec<ScaleDifference> = Vec::new();
    for (ours, paper) in compared {
        let (ours, paper) = (flatten(ours), flatten(paper));
        for (field, value) in &ours {
            let theirs = paper.get(field).cloned().unwrap_or_else(|| "–".into());
            if NOT_SCALE.contains(&field.as_str()) || *value == theirs {
                continue;
            }
            let index = match out.iter().position(|d| &d.field == field) {
                Some(i) => i,
                None => {
                    out.push(ScaleDifference {
                        field: field.clone(),
                        ours: Vec::new(),
                        paper: Vec::new(),
                    });
                    out.len() - 1
                }
            };
            let difference = &mut out[index];
            if !difference.ours.contains(value) {
                difference.ours.push(value.clone());
            }
            if !difference.paper.contains(&theirs) {
                difference.paper.push(theirs);
            }
        }
    }
    out
}

/// A config as `field → value`, nested tables' fields as `outer.inner`.
fn flatten(config: &RunConfig) -> BTreeMap<String, String> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, inner) in map {
                    let name = match prefix {
                        "" => key.clone(),
                        _ => format!("{prefix}.{key}"),
                    };
                    walk(&name, inner, out);
                }
            }
            serde_json::Value::String(s) => {
                out.insert(prefix.to_string(), s.clone());
            }
            serde_json::Value::Null => {
                out.insert(prefix.to_string(), "all".into());
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(value) = serde_json::to_value(config) {
        walk("", &value, &mut out);
    }
    out
}
