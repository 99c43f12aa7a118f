//! What a finished run leaves behind: its summary, `summary.json` in the run directory, which the
//! learner writes when the budget is done ([`crate::run::learner`]) and the sweep and the report
//! read back.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::config::RunConfig;
use crate::error::{Result, TrainError};

/// What a finished run leaves in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run's config.
    pub config: RunConfig,
    /// Vocabulary size of the tokeniser.
    pub vocab_size: usize,
    /// Trainable parameters (every tensor).
    pub parameters: usize,
    /// Steps trained.
    pub steps: usize,
    /// Best validation loss on the grid (eq:endpoint).
    pub best_val_loss: f64,
    /// Step of the best validation loss.
    pub best_step: usize,
    /// Every validation pass, `(step, loss)`.
    pub val_curve: Vec<(usize, f64)>,
    /// Training target tokens per second from step 0 (startup included, validation excluded).
    pub tokens_per_s: f64,
    /// Training seconds.
    pub train_seconds: f64,
    /// The backend that ran it.
    pub backend: String,
    /// The devices it trained on, as the backend names them (one, or the replicas of a
    /// data-parallel run); empty in summaries written before they were recorded.
    #[serde(default)]
    pub devices: Vec<String>,
    /// The kernels of its matrix products (on CUDA the process's provider,
    /// [`haares_core::ops::matmul::ProductProvider`]): not part of the run's configuration, so a
    /// run resumed under another records the last. Empty in summaries written before it was
    /// recorded.
    #[serde(default)]
    pub products: String,
}

/// The summary file of a finished run.
pub fn summary_path(run_dir: &Path) -> PathBuf {
    run_dir.join("summary.json")
}

/// The summary of a finished run in `run_dir`, if there is one.
pub fn finished_summary(run_dir: &Path) -> Result<Option<RunSummary>> {
    let path = summary_path(run_dir);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            TrainError::Checkpoint(format!("`{}` is not a run summary: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TrainError::io(&path, e)),
    }
}
