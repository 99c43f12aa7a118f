//! Per-run logs as JSON lines — training and validation metrics (`metrics.jsonl`), routing
//! statistics per validation pass (`routing.jsonl`) — and the process's peak memory.

use std::io::Write;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use haares_core::RoutingStatistics;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError, write_atomically};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsLine {
    /// Step after which the line was written (1-based: step 1 is the first update).
    pub step: usize,
    /// Mean training loss over the steps since the previous training line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_loss: Option<f64>,
    /// Global gradient norm before clipping at this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// Validation loss of a full pass at this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Target tokens per second of training (validation excluded) since the previous line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Training seconds since step 0, across resumptions.
    pub elapsed_s: f64,
    /// Peak resident memory of the process in bytes, where the platform reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
}

/// A line of a run's JSON-lines log, tagged with the step after which it was written.
pub trait StepLine: Serialize + serde::de::DeserializeOwned {
    /// The line's step.
    fn step(&self) -> usize;
}

impl StepLine for MetricsLine {
    fn step(&self) -> usize {
        self.step
    }
}

/// One line of `routing.jsonl`: the routing statistics over the validation tokens of one
/// validation pass (routed methods only; see `docs/experiments.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingLine {
    /// Step of the validation pass.
    pub step: usize,
    /// Its validation loss.
    pub val_loss: f64,
    /// Per read site statistics over the pass's real target positions.
    #[serde(flatten)]
    pub routing: RoutingStatistics,
}

impl StepLine for RoutingLine {
    fn step(&self) -> usize {
        self.step
    }
}

/// Appends lines to a run's JSON-lines log (`metrics.jsonl`, `routing.jsonl`).
pub struct StepLog<T> {
    path: PathBuf,
    file: std::fs::File,
    line: PhantomData<T>,
}

/// The log of `metrics.jsonl`.
pub type MetricsLog = StepLog<MetricsLine>;

impl<T: StepLine> StepLog<T> {
    /// Opens `path` for appending after keeping only the lines with `step ≤ keep_through` (the
    /// lines a resumed run will not write again). Unparseable lines are an error, not dropped.
    pub fn open(path: &Path, keep_through: usize) -> Result<Self> {
        let kept = read_lines::<T>(path)?
            .into_iter()
            .filter(|line| line.step() <= keep_through)
            .map(|line| serde_json::to_string(&line).expect("log lines serialise") + "\n")
            .collect::<String>();
        write_atomically(path, kept.as_bytes())?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| TrainError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            line: PhantomData,
        })
    }

    /// Appends one line and flushes it.
    pub fn write(&mut self, line: &T) -> Result<()> {
        let text = serde_json::to_string(line).expect("log lines serialise") + "\n";
        self.file
            .write_all(text.as_bytes())
            .and_then(|_| self.file.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }
}

/// Every line of a `metrics.jsonl` (empty when the file does not exist).
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsLine>> {
    read_lines(path)
}

/// Every line of a `routing.jsonl` (empty when the file does not exist).
pub fn read_routing(path: &Path) -> Result<Vec<RoutingLine>> {
    read_lines(path)
}

/// Every line of a JSON-lines log (empty when the file does not exist).
pub fn read_lines<T: StepLine>(path: &Path) -> Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io(path, e)),
    };
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| {
                TrainError::Checkpoint(format!(
                    "{}:{}: not a line of this log: {e}; delete the file or restore it from a backup",
                    path.display(),
                    i + 1
                ))
            })
        })
        .collect()
}

/// Peak resident set size of this process (Linux `VmHWM`), or `None` elsewhere.
pub fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
