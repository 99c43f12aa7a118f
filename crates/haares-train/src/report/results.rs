//! The report's shared ground: finished runs, paired comparisons and their statistics — what
//! [`crate::report`], [`crate::report::tables`] and the figures all read, so that the report
//! modules import in one direction (report → tables and figures → results).

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::run::summary::{RunSummary, finished_summary};
use crate::study::PlannedRun;

/// The baseline every paired reduction is taken against.
pub const BASELINE: &str = "block-attnres";

/// A finished run with its place in the study.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The report's setting label (e.g. `12L`).
    pub setting: String,
    /// Method name.
    pub method: String,
    /// Model seed.
    pub seed: u64,
    /// The run's summary.
    pub summary: RunSummary,
    /// The run's directory.
    pub run_dir: PathBuf,
}

/// Mean and sample standard deviation (`None` below two values).
pub fn mean_sd(values: &[f64]) -> (f64, Option<f64>) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = (values.len() >= 2)
        .then(|| (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
    (mean, sd)
}

/// The paper's reductions of one setting and method against Block AttnRes, drawn beside ours in
/// `figures/paired-effect.svg`.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperMarks {
    /// Our setting label.
    pub setting: String,
    /// Method name.
    pub method: String,
    /// The paper's per-seed reductions (none where it prints means only).
    pub seeds: Vec<f64>,
    /// The paper's mean reduction.
    pub mean: Option<f64>,
}

/// One paired comparison of a method with the baseline at one setting and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// Setting label.
    pub setting: String,
    /// Model seed.
    pub seed: u64,
    /// The compared method.
    pub method: String,
    /// ℓ*_Block.
    pub baseline_loss: f64,
    /// ℓ*_M.
    pub method_loss: f64,
}

impl Pair {
    /// g = ℓ*_Block − ℓ*_M (eq:endpoint); positive favours the method.
    pub fn reduction(&self) -> f64 {
        self.baseline_loss - self.method_loss
    }
}

/// Every (setting, seed, method ≠ baseline) with both runs finished, in report order.
pub fn pairs(finished: &[Finished]) -> Vec<Pair> {
    let mut out = Vec::new();
    for base in finished.iter().filter(|f| f.method == BASELINE) {
        for other in finished
            .iter()
            .filter(|f| f.method != BASELINE && f.setting == base.setting && f.seed == base.seed)
        {
            out.push(Pair {
                setting: base.setting.clone(),
                seed: base.seed,
                method: other.method.clone(),
                baseline_loss: base.summary.best_val_loss,
                method_loss: other.summary.best_val_loss,
            });
        }
    }
    out
}

/// tab:timetotarget for one seed: the first grid step at which the method reaches the baseline's
/// best loss, and the times implied by each run's measured throughput.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeToTarget {
    /// The baseline's best loss (the target).
    pub target: f64,
    /// First grid step with loss ≤ target, and that loss.
    pub first: Option<(usize, f64)>,
    /// Baseline time for its full budget, seconds: steps × tokens/step / v_B.
    pub baseline_seconds: f64,
    /// Method time to the first crossing, seconds: K × tokens/step / v_M.
    pub method_seconds: Option<f64>,
    /// Throughput ratio v_M / v_B: the largest K_M / K_B that still saves time (eq:breakeven).
    pub break_even_ratio: f64,
}

/// Time to target of `method` against `baseline` (same setting and seed).
pub fn time_to_target(baseline: &RunSummary, method: &RunSummary) -> TimeToTarget {
    let target = baseline.best_val_loss;
    let first = method
        .val_curve
        .iter()
        .copied()
        .find(|(_, loss)| *loss <= target);
    let tokens = |s: &RunSummary| s.config.tokens_per_step() as f64;
    TimeToTarget {
        target,
        first,
        baseline_seconds: baseline.steps as f64 * tokens(baseline) / baseline.tokens_per_s,
        method_seconds: first.map(|(step, _)| step as f64 * tokens(method) / method.tokens_per_s),
        break_even_ratio: method.tokens_per_s / baseline.tokens_per_s,
    }
}

/// Loads the finished runs among `runs` from `study_dir`.
pub fn collect(runs: &[PlannedRun], study_dir: &Path) -> Result<(Vec<Finished>, Vec<String>)> {
    let (mut finished, mut missing) = (Vec::new(), Vec::new());
    for run in runs {
        let run_dir = study_dir.join(&run.name);
        match finished_summary(&run_dir)? {
            Some(summary) if summary.config == run.config => finished.push(Finished {
                setting: run.setting_label(),
                method: run.config.method.clone(),
                seed: run.config.model_seed,
                summary,
                run_dir,
            }),
            _ => missing.push(run.name.clone()),
        }
    }
    Ok((finished, missing))
}
