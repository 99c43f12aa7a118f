//! The `placement` stage: one card training one run, then two runs side by side, through
//! `haares-train sweep` (`--devices 0 --runs-per-device 1` and `2` on a GPU; `--jobs 1` and `2`
//! on a CPU backend, which has no devices to place on). Each run's steady step time comes from
//! its `metrics.jsonl`; the two placements' throughputs say whether a card trains two runs of
//! this size nearly as fast as one (docs/experiments.md, "Many runs, one per GPU").

use std::path::{Path, PathBuf};

use haares_train::run::metrics::{MetricsLine, read_metrics};
use haares_train::run::summary::RunSummary;
use serde_json::json;

use super::StageStatus;
use super::stage::{Outcome, Stage, status_of};

/// The two runs (seeds) each placement trains.
const SEEDS: &str = "1,2";

pub(super) fn placement(stage: &Stage) -> Result<Outcome, String> {
    let mut measured = Vec::new();
    for per_device in [1, 2] {
        let root = stage.spec.out.join(format!("placement-{per_device}"));
        let finished = stage.run(&stage.spec.train_bin, &sweep_args(stage, &root, per_device))?;
        let status = status_of(&finished);
        if status != StageStatus::Passed {
            let what = format!("the sweep with {per_device} run(s) per device");
            return Ok(match status {
                StageStatus::Failed(why) => Outcome::failed(format!("{what}: {why}")),
                other => Outcome {
                    status: other,
                    results: serde_json::Value::Null,
                    markdown: format!("{what} ran out of time.\n"),
                },
            });
        }
        measured.push((per_device, steady_runs(&root.join("depth"))?));
    }
    Ok(outcome(stage, &measured))
}

/// `sweep depth` of two HAARES runs into `root`, `per_device` at a time on one device.
fn sweep_args(stage: &Stage, root: &Path, per_device: usize) -> Vec<String> {
    let sizes = &stage.spec.profile.placement;
    let mut args: Vec<String> = [
        "sweep",
        "depth",
        "--methods",
        "haares",
        "--seeds",
        SEEDS,
        "--layers",
        &sizes.layers.to_string(),
        "--steps",
        &sizes.steps.to_string(),
        "--set",
        &format!("log_every={}", sizes.log_every),
        "--set",
        &format!("eval_every={}", sizes.steps),
        "--set",
        &format!("checkpoint_every={}", sizes.steps),
    ]
    .map(String::from)
    .to_vec();
    for set in sizes.sets {
        args.extend(["--set".into(), set.to_string()]);
    }
    let per_device = per_device.to_string();
    let placement: &[&str] = match stage.spec.backend.is_cube() {
        false => &["--jobs", &per_device],
        true => &["--devices", "0", "--runs-per-device", &per_device],
    };
    args.extend(placement.iter().map(|a| a.to_string()));
    args.extend(stage.train_options(root));
    args
}

/// One run's steady training: its name, seconds per step and target tokens per second after its
/// first logged interval (which holds the kernels' compilation).
#[derive(Debug, Clone, serde::Serialize)]
struct SteadyRun {
    run: String,
    step_s: f64,
    tokens_per_s: f64,
}

/// Every run under `study_dir`, in name order.
fn steady_runs(study_dir: &Path) -> Result<Vec<SteadyRun>, String> {
    let entries = std::fs::read_dir(study_dir)
        .map_err(|e| format!("cannot read `{}`: {e}", study_dir.display()))?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.join("summary.json").is_file())
        .collect();
    dirs.sort();
    dirs.iter().map(|dir| steady_run(dir)).collect()
}

/// The finished run in `dir`, timed over its training lines after the first.
fn steady_run(dir: &Path) -> Result<SteadyRun, String> {
    let run = dir.file_name().unwrap_or_default().to_string_lossy();
    let lines = read_metrics(&dir.join("metrics.jsonl")).map_err(|e| e.to_string())?;
    let summary: RunSummary = std::fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .ok_or_else(|| format!("{run}: unreadable summary.json"))?;
    let step_s = steady_step_s(&lines)
        .ok_or_else(|| format!("{run}: fewer than two timed intervals in metrics.jsonl"))?;
    let tokens_per_step = (summary.config.batch_size * summary.config.seq_len) as f64;
    Ok(SteadyRun {
        run: run.to_string(),
        step_s,
        tokens_per_s: tokens_per_step / step_s,
    })
}

/// Seconds per step from the first timed training line to the last: the steps up to the first
/// line compile the kernels, the rest are the steady step.
fn steady_step_s(lines: &[MetricsLine]) -> Option<f64> {
    let mut timed = lines.iter().filter(|l| l.tokens_per_s.is_some());
    let first = timed.next()?;
    let last = timed.next_back()?;
    let steps = last.step.checked_sub(first.step).filter(|&s| s > 0)?;
    Some((last.elapsed_s - first.elapsed_s) / steps as f64)
}

/// The table of both placements and the throughput of two runs side by side against one.
fn outcome(stage: &Stage, measured: &[(usize, Vec<SteadyRun>)]) -> Outcome {
    let sizes = &stage.spec.profile.placement;
    let mut markdown = format!(
        "Two HAARES runs ({} layers, {} steps, {}), first one at a time, then side by side on \
         one device; steady step times after the first {} steps.\n\n\
         | runs at a time | run | step (s) | tokens/s |\n|---|---|---|---|\n",
        sizes.layers,
        sizes.steps,
        sizes.sets.join(", "),
        sizes.log_every
    );
    let mut throughput = Vec::new();
    for (per_device, runs) in measured {
        for run in runs {
            markdown += &format!(
                "| {per_device} | {} | {:.4} | {:.0} |\n",
                run.run, run.step_s, run.tokens_per_s
            );
        }
        // One at a time, the card's throughput is one run's; side by side, the runs' sum.
        let rates = runs.iter().map(|r| r.tokens_per_s);
        throughput.push(match per_device {
            1 => rates.sum::<f64>() / runs.len().max(1) as f64,
            _ => rates.sum::<f64>(),
        });
    }
    let gain = throughput[1] / throughput[0];
    markdown += &format!(
        "\nThe device's throughput: {:.0} tokens/s with one run, {:.0} with two side by side \
         ({gain:.2}×).\n",
        throughput[0], throughput[1]
    );
    Outcome {
        status: StageStatus::Passed,
        results: json!({
            "one_at_a_time": measured[0].1, "side_by_side": measured[1].1,
            "tokens_per_s_one": throughput[0], "tokens_per_s_two": throughput[1],
            "two_over_one": gain,
        }),
        markdown,
    }
}
