//! Studies as data: one TOML file per study under `experiments/` with a grid of axes and named
//! presets; expansion into runs, command-line overrides and `--shard i/n` partitioning.
//!
//! A run's config is built in layers: the paper defaults ([`RunConfig::default`]), the preset's
//! fields, the grid point, the preset's per-depth step budget, then the command-line fields.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::{Table, Value};

use crate::config::RunConfig;
use crate::error::{Result, TrainError};
pub mod overrides;
pub mod paper;
pub mod placement;
pub mod sweep;

use overrides::merge;
pub use overrides::{Overrides, load_run_config, parse_assignment, parse_value};

/// The studies shipped in `experiments/`, embedded at build time.
pub const BUILTIN_STUDIES: &[(&str, &str)] = &[
    ("depth", include_str!("../../experiments/depth.toml")),
    ("seeds", include_str!("../../experiments/seeds.toml")),
    ("width", include_str!("../../experiments/width.toml")),
    ("bpe", include_str!("../../experiments/bpe.toml")),
    ("domains", include_str!("../../experiments/domains.toml")),
    ("blocks", include_str!("../../experiments/blocks.toml")),
    (
        "ablations",
        include_str!("../../experiments/ablations.toml"),
    ),
];

/// Axes in expansion order, outermost first: seeds outermost so that a sweep stopped early has
/// complete seeds; method innermost so that the two methods of a pair run back to back.
const AXIS_ORDER: &[&str] = &[
    "model_seed",
    "dataset",
    "layers",
    "blocks",
    "d_model",
    "method",
];

/// A named preset of a study.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// What the preset is for.
    #[serde(default)]
    pub description: String,
    /// Run-config fields (the `[presets.<name>.run]` table).
    #[serde(default, rename = "run")]
    pub fields: Table,
    /// Grid axes the preset replaces.
    #[serde(default)]
    pub grid: BTreeMap<String, Vec<Value>>,
    /// Step budget by depth (keys are layer counts), applied unless `steps` is overridden.
    #[serde(default)]
    pub steps_by_layers: BTreeMap<String, usize>,
}

/// A study definition.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Study {
    /// Short name (`depth`, …); set from the file name.
    #[serde(default)]
    pub name: String,
    /// Title shown in the report.
    pub title: String,
    /// The paper's table this study reproduces.
    pub paper_table: String,
    /// A paragraph for the report.
    pub description: String,
    /// Preset used when none is named.
    pub default_preset: String,
    /// The grid: each axis a run-config field with its values.
    pub grid: BTreeMap<String, Vec<Value>>,
    /// Presets by name.
    pub presets: BTreeMap<String, Preset>,
    /// The files of the paper's published values this study compares with ([`paper`]),
    /// relative to the study file.
    #[serde(default)]
    pub paper_values: Vec<String>,
    /// The folder of the study file, for a study given by its path (`None`: built in).
    #[serde(skip)]
    pub source_dir: Option<std::path::PathBuf>,
}

impl Study {
    /// The paper's tables this study names, parsed.
    pub fn paper_tables(&self) -> Result<Vec<paper::PaperTable>> {
        self.paper_values
            .iter()
            .map(|file| paper::load_paper_table(file, self.source_dir.as_deref()))
            .collect()
    }
}

/// Loads a built-in study by name, or a study file when `name` ends in `.toml`.
pub fn load_study(name: &str) -> Result<Study> {
    if name.ends_with(".toml") {
        let path = Path::new(name);
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or(name);
        let mut study = parse_study(stem, &text)?;
        study.source_dir = Some(path.parent().unwrap_or(Path::new(".")).to_path_buf());
        return Ok(study);
    }
    let (_, text) = BUILTIN_STUDIES
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| {
            let names: Vec<_> = BUILTIN_STUDIES.iter().map(|(n, _)| *n).collect();
            TrainError::Config(format!(
                "unknown study `{name}`; choose one of: {} (or give a path to a study .toml file)",
                names.join(", ")
            ))
        })?;
    parse_study(name, text)
}

/// Parses a study definition.
pub fn parse_study(name: &str, text: &str) -> Result<Study> {
    let mut study: Study = toml::from_str(text).map_err(|e| {
        TrainError::Config(format!("study `{name}` is not a valid study file: {e}"))
    })?;
    study.name = name.to_string();
    if !study.presets.contains_key(&study.default_preset) {
        return Err(TrainError::Config(format!(
            "study `{name}`: default preset `{}` is not defined",
            study.default_preset
        )));
    }
    Ok(study)
}

/// One run of a study.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRun {
    /// Directory name under `runs/<study>/`.
    pub name: String,
    /// Grid values other than method and seed, e.g. `layers=12` (the report's setting).
    pub setting: Vec<(String, String)>,
    /// The complete config.
    pub config: RunConfig,
}

impl PlannedRun {
    /// The setting as one label, e.g. `12L` or `sotu 24L N=6`.
    pub fn setting_label(&self) -> String {
        setting_label(&self.setting)
    }
}

/// A readable label of grid values: `layers=12` → `12L`, `blocks=6` → `N=6`.
pub fn setting_label(setting: &[(String, String)]) -> String {
    if setting.is_empty() {
        return "all".into();
    }
    setting
        .iter()
        .map(|(key, value)| match key.as_str() {
            "layers" => format!("{value}L"),
            "blocks" => format!("N={value}"),
            "d_model" => format!("d={value}"),
            "dataset" => value.clone(),
            _ => format!("{key}={value}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Study {
    /// Every run of the study under `preset` with `overrides`, in execution order.
    pub fn plan(&self, preset: Option<&str>, overrides: &Overrides) -> Result<Vec<PlannedRun>> {
        let preset_name = preset.unwrap_or(&self.default_preset);
        let preset = self.presets.get(preset_name).ok_or_else(|| {
            TrainError::Config(format!(
                "study `{}` has no preset `{preset_name}`; choose one of: {}",
                self.name,
                self.presets.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let mut axes = self.grid.clone();
        axes.extend(preset.grid.clone());
        axes.extend(overrides.axes.clone());
        for key in overrides.fields.keys() {
            axes.remove(key);
        }
        // An empty axis would plan no run at all; say which one and where it was given.
        if let Some((axis, _)) = axes.iter().find(|(_, values)| values.is_empty()) {
            let source = if overrides.axes.contains_key(axis) {
                "the command line".to_string()
            } else if preset.grid.contains_key(axis) {
                format!("preset `{preset_name}`'s grid")
            } else {
                format!("study `{}`'s grid", self.name)
            };
            return Err(TrainError::Config(format!(
                "{source} gives the axis `{axis}` no values; give it at least one (`{axis} = [...]`) \
                 or remove it"
            )));
        }
        let mut order: Vec<&String> = axes.keys().collect();
        order.sort_by_key(|k| AXIS_ORDER.iter().position(|a| a == k).unwrap_or(usize::MAX));

        let mut runs = Vec::new();
        let mut point = vec![0usize; order.len()];
        loop {
            let values: Vec<(String, Value)> = order
                .iter()
                .zip(&point)
                .map(|(key, &i)| ((*key).clone(), axes[*key][i].clone()))
                .collect();
            runs.push(self.build_run(preset, &values, overrides)?);
            // Odometer increment, innermost (last) axis fastest.
            let mut axis = order.len();
            loop {
                if axis == 0 {
                    return finish(runs);
                }
                axis -= 1;
                point[axis] += 1;
                if point[axis] < axes[order[axis]].len() {
                    break;
                }
                point[axis] = 0;
            }
        }
    }

    fn build_run(
        &self,
        preset: &Preset,
        values: &[(String, Value)],
        overrides: &Overrides,
    ) -> Result<PlannedRun> {
        let mut table = Value::try_from(RunConfig::default())
            .ok()
            .and_then(|v| v.as_table().cloned())
            .expect("the default config is a table");
        merge(&mut table, &preset.fields);
        for (key, value) in values {
            table.insert(key.clone(), value.clone());
        }
        if !overrides.fields.contains_key("steps")
            && let Some(Value::Integer(layers)) = table.get("layers")
            && let Some(steps) = preset.steps_by_layers.get(&layers.to_string())
        {
            table.insert("steps".into(), Value::Integer(*steps as i64));
        }
        merge(&mut table, &overrides.fields);
        let config: RunConfig = Value::Table(table)
            .try_into()
            .map_err(|e| TrainError::Config(format!("study `{}`: {e}", self.name)))?;
        config.validate()?;
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let name = values
            .iter()
            .map(|(key, value)| match key.as_str() {
                "layers" => format!("L{}", text(value)),
                "blocks" => format!("N{}", text(value)),
                "d_model" => format!("d{}", text(value)),
                "model_seed" => format!("s{}", text(value)),
                "method" | "dataset" => text(value),
                _ => format!("{key}{}", text(value)),
            })
            .collect::<Vec<_>>()
            .join("-");
        let setting = values
            .iter()
            .filter(|(key, _)| key != "method" && key != "model_seed")
            .map(|(key, value)| (key.clone(), text(value)))
            .collect();
        Ok(PlannedRun {
            name: sanitize(&name),
            setting,
            config,
        })
    }
}

fn finish(runs: Vec<PlannedRun>) -> Result<Vec<PlannedRun>> {
    let mut names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(TrainError::Config(format!(
            "two runs share the name `{}`; make grid values distinct",
            pair[0]
        )));
    }
    Ok(runs)
}

/// A file-name-safe version of a run name (`=` and `/` and spaces become `_`).
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Parses `--shard i/n` (0 ≤ i < n).
pub fn parse_shard(text: &str) -> Result<(usize, usize)> {
    let bad = || {
        TrainError::Config(format!(
            "`--shard {text}` must be i/n with 0 ≤ i < n, e.g. --shard 0/4 (a Slurm array passes $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"
        ))
    };
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let (i, n) = (
        i.trim().parse::<usize>().map_err(|_| bad())?,
        n.trim().parse::<usize>().map_err(|_| bad())?,
    );
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// The runs of shard `i` of `n`: every n-th run starting at the i-th.
pub fn shard_runs(runs: Vec<PlannedRun>, (i, n): (usize, usize)) -> Vec<PlannedRun> {
    runs.into_iter()
        .enumerate()
        .filter(|(k, _)| k % n == i)
        .map(|(_, r)| r)
        .collect()
}
