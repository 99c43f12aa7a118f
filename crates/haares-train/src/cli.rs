//! `haares-train`'s shared command-line options: backend and locations, study overrides, devices,
//! how a model file is read.

use std::path::PathBuf;

use clap::Args;
use haares_core::LoadOptions;
use haares_train::backend::BackendKind;
use haares_train::data::DataPaths;
use haares_train::error::Result;
use haares_train::study::{Overrides, parse_assignment};

#[derive(Args)]
pub struct DeviceArgs {
    /// Train each run data-parallel on these devices: GPU indices on cuda and wgpu (e.g. 0,1,2,3),
    /// or on a CPU backend one number, the count of replicas. Default: the backend's default device.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<usize>,
}

#[derive(Args)]
pub struct ModelFileArgs {
    /// Load a model whose weights include NaN or infinity, which is refused by default (such a
    /// model evaluates to NaN).
    #[arg(long)]
    pub allow_non_finite: bool,
}

impl ModelFileArgs {
    pub fn options(&self) -> LoadOptions {
        LoadOptions {
            allow_non_finite: self.allow_non_finite,
        }
    }
}

#[derive(Args)]
pub struct Common {
    /// Backend: flex (CPU default), ndarray, wgpu, cuda (the last two need their cargo feature).
    #[arg(long, default_value = "flex")]
    pub backend: String,
    /// Where runs are written: <runs-dir>/<study>/<run>/.
    #[arg(long, default_value = "runs")]
    pub runs_dir: PathBuf,
    /// Hub cache of downloaded datasets.
    #[arg(long, default_value = "data")]
    pub data_dir: PathBuf,
    /// Prepared-token and tokeniser cache (default <runs-dir>/.cache).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Never download a dataset; fail if it is not under --data-dir.
    #[arg(long)]
    pub offline: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

impl Common {
    pub fn paths(&self) -> DataPaths {
        DataPaths {
            data_dir: self.data_dir.clone(),
            cache_dir: self
                .cache_dir
                .clone()
                .unwrap_or_else(|| self.runs_dir.join(".cache")),
            download: !self.offline,
        }
    }
    pub fn backend(&self) -> Result<BackendKind> {
        self.backend.parse()
    }
}

#[derive(Args)]
pub struct OverrideArgs {
    /// Preset of the study: cpu (default) or paper.
    #[arg(long)]
    pub preset: Option<String>,
    /// Training steps of every run.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Depths (replaces the grid's layers), e.g. 12,24.
    #[arg(long, value_delimiter = ',')]
    pub layers: Vec<usize>,
    /// Model seeds (replaces the grid's seeds), e.g. 42,123.
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Methods (replaces the grid's methods), e.g. block-attnres,haares.
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// Block counts N (replaces the grid's blocks), e.g. 4,6,8.
    #[arg(long, value_delimiter = ',')]
    pub blocks: Vec<usize>,
    /// Datasets (replaces the grid's datasets), e.g. sotu or tinystories,yelp.
    #[arg(long, value_delimiter = ',')]
    pub datasets: Vec<String>,
    /// Any run-config field, e.g. --set d_model=128 --set optimizer.lr=1e-3 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl OverrideArgs {
    pub fn overrides(&self) -> Result<Overrides> {
        let mut overrides = Overrides::default();
        if let Some(steps) = self.steps {
            overrides.set("steps", toml::Value::Integer(steps as i64))?;
        }
        let int = |v: &usize| toml::Value::Integer(*v as i64);
        let axes: [(&str, Vec<toml::Value>); 5] = [
            ("layers", self.layers.iter().map(int).collect()),
            (
                "model_seed",
                self.seeds
                    .iter()
                    .map(|s| toml::Value::Integer(*s as i64))
                    .collect(),
            ),
            (
                "method",
                self.methods
                    .iter()
                    .map(|m| toml::Value::String(m.clone()))
                    .collect(),
            ),
            ("blocks", self.blocks.iter().map(int).collect()),
            (
                "dataset",
                self.datasets
                    .iter()
                    .map(|d| toml::Value::String(d.clone()))
                    .collect(),
            ),
        ];
        for (key, values) in axes {
            if !values.is_empty() {
                overrides.set_axis(key, values)?;
            }
        }
        for assignment in &self.set {
            let (key, value) = parse_assignment(assignment)?;
            match key.split_once('.') {
                Some((table, field)) => {
                    let mut inner = match overrides.fields.remove(table) {
                        Some(toml::Value::Table(t)) => t,
                        _ => toml::Table::new(),
                    };
                    inner.insert(field.to_string(), value);
                    overrides
                        .fields
                        .insert(table.to_string(), toml::Value::Table(inner));
                }
                None => overrides.set(&key, value)?,
            }
        }
        Ok(overrides)
    }
}
