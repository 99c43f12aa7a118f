//! The `real-run` stage: `haares-train train` on the embedded corpus twice, once uninterrupted
//! and once killed (SIGKILL) after its first checkpoint and resumed; their logged losses must
//! agree, the loss must fall, and `eval` and `sample` must work on the resumed run.

use std::path::{Path, PathBuf};

use haares_train::run::metrics::{MetricsLine, read_metrics};
use serde_json::json;

use super::StageStatus;
use super::process::Exit;
use super::stage::{Outcome, Stage, status_of};

/// Largest difference between the two runs' logged losses, relative to the loss, that still
/// counts as the same run: float noise (and a GPU's non-deterministic reductions) stays orders
/// below it, a resume that loses or repeats a step, a batch or the optimizer state does not.
pub const RESUME_TOLERANCE: f64 = 1e-3;

pub(super) fn real_run(stage: &Stage) -> Result<Outcome, String> {
    let run = RealRun::new(stage);
    let (whole, resumed) = (
        run.root.join("uninterrupted"),
        run.root.join("killed-and-resumed"),
    );
    let killed_at = match run.train_twice(&whole, &resumed)? {
        Ok(killed_at) => killed_at,
        Err(failed) => return Ok(failed),
    };
    let (a, b) = (metrics(&whole)?, metrics(&resumed)?);
    let comparison = compare(&a, &b);
    let used = run.use_model(&resumed)?;
    let train_losses: Vec<f64> = b.iter().filter_map(|l| l.train_loss).collect();
    let checks = Checks {
        first: train_losses.first().copied(),
        last: train_losses.last().copied(),
        killed_at,
        comparison,
    };
    let sizes = &stage.spec.profile.real_run;
    let setup = format!(
        "HAARES, {} layers, {} steps ({}), checkpoint every {} steps, on the embedded corpus.",
        sizes.layers,
        sizes.steps,
        sizes.sets.join(", "),
        sizes.checkpoint_every,
    );
    Ok(checks.outcome(&setup, used))
}

/// The stage's commands: `haares-train` with the stage's backend and folders.
struct RealRun<'a> {
    stage: &'a Stage<'a>,
    root: PathBuf,
    /// The options every command takes.
    common: Vec<String>,
}

impl<'a> RealRun<'a> {
    fn new(stage: &'a Stage<'a>) -> Self {
        let root = stage.spec.out.join("real-run");
        let common = stage.train_options(&root);
        Self {
            stage,
            root,
            common,
        }
    }

    /// `train` into `run_dir` at the profile's sizes.
    fn train_args(&self, run_dir: &Path) -> Vec<String> {
        let sizes = &self.stage.spec.profile.real_run;
        let mut args: Vec<String> = vec![
            "train".into(),
            "--run-dir".into(),
            run_dir.display().to_string(),
            "--study".into(),
            "depth".into(),
            "--layers".into(),
            sizes.layers.to_string(),
            "--methods".into(),
            "haares".into(),
            "--steps".into(),
            sizes.steps.to_string(),
        ];
        let every = sizes.checkpoint_every;
        let sets = [
            format!("checkpoint_every={every}"),
            format!("eval_every={every}"),
        ];
        for set in sets
            .iter()
            .map(String::as_str)
            .chain(sizes.sets.iter().copied())
        {
            args.extend(["--set".into(), set.into()]);
        }
        args.extend(self.common.iter().cloned());
        args
    }

    /// Trains `whole` uninterrupted, then `resumed` killed after its first checkpoint and
    /// resumed. Returns the step of the checkpoint it was killed with, or the stage's failure.
    fn train_twice(
        &self,
        whole: &Path,
        resumed: &Path,
    ) -> Result<Result<Option<usize>, Outcome>, String> {
        let (spec, every) = (
            self.stage.spec,
            self.stage.spec.profile.real_run.checkpoint_every,
        );
        let finished = self.stage.run(&spec.train_bin, &self.train_args(whole))?;
        if status_of(&finished) != StageStatus::Passed {
            return Ok(Err(failed_at(
                "the uninterrupted run",
                status_of(&finished),
            )));
        }
        let state = resumed.join("checkpoint").join("state.json");
        let killed = self
            .stage
            .run_until(&spec.train_bin, &self.train_args(resumed), &|| {
                checkpoint_step(&state).is_some_and(|step| step >= every)
            })?;
        let killed_at = checkpoint_step(&state);
        match killed.exit {
            Exit::Stopped => {}
            Exit::Success => {
                return Ok(Err(Outcome::failed(
                    "the run finished before it could be killed: raise the profile's steps",
                )));
            }
            _ => return Ok(Err(failed_at("the run to be killed", status_of(&killed)))),
        }
        let finished = self.stage.run(&spec.train_bin, &self.train_args(resumed))?;
        if status_of(&finished) != StageStatus::Passed {
            return Ok(Err(failed_at("the resumed run", status_of(&finished))));
        }
        Ok(Ok(killed_at))
    }

    /// `eval` and `sample` on the run in `run_dir`.
    fn use_model(&self, run_dir: &Path) -> Result<Used, String> {
        let run_dir = run_dir.display().to_string();
        let with_common = |args: &[&str]| {
            let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            all.extend(self.common.iter().cloned());
            all
        };
        let train_bin = &self.stage.spec.train_bin;
        let eval = self
            .stage
            .run(train_bin, &with_common(&["eval", &run_dir]))?;
        let sample_args = ["sample", &run_dir, "--tokens", "120", "--seed", "1"];
        let sample = self.stage.run(train_bin, &with_common(&sample_args))?;
        Ok(Used {
            eval_status: status_of(&eval),
            eval_line: eval.stdout.trim().to_string(),
            sample_status: status_of(&sample),
            sample_text: sample.stdout.trim().to_string(),
        })
    }
}

/// What `eval` and `sample` did with the resumed run.
struct Used {
    eval_status: StageStatus,
    eval_line: String,
    sample_status: StageStatus,
    sample_text: String,
}

/// What the two runs showed.
struct Checks {
    first: Option<f64>,
    last: Option<f64>,
    killed_at: Option<usize>,
    comparison: Comparison,
}

impl Checks {
    /// The stage's verdict and report, `setup` its first line.
    fn outcome(&self, setup: &str, used: Used) -> Outcome {
        let (first, last, comparison) = (self.first, self.last, &self.comparison);
        let falls = matches!((first, last), (Some(f), Some(l)) if l < f);
        let matches = comparison.compared > 0 && comparison.max_relative <= RESUME_TOLERANCE;
        let status = [(&used.eval_status, "eval"), (&used.sample_status, "sample")]
            .into_iter()
            .find(|(s, _)| **s != StageStatus::Passed)
            .map(|(s, what)| match s {
                StageStatus::Failed(why) => StageStatus::Failed(format!("{what}: {why}")),
                other => other.clone(),
            })
            .unwrap_or_else(|| match (falls, matches, used.sample_text.is_empty()) {
                (false, _, _) => StageStatus::Failed("the training loss did not fall".into()),
                (_, false, _) => {
                    StageStatus::Failed("the resumed run differs from the uninterrupted one".into())
                }
                (_, _, true) => StageStatus::Failed("sample printed no text".into()),
                _ => StageStatus::Passed,
            });
        let markdown = format!(
            "{setup}\n\n\
             - training loss {} → {} ({})\n\
             - killed (SIGKILL) with its checkpoint at step {}, then resumed: {} logged values \
               compared with the uninterrupted run, largest difference {:.2e} relative \
               (tolerance {RESUME_TOLERANCE:.0e}): {}\n\
             - `eval`: {}\n\
             - `sample` (120 tokens, seed 1):\n\n```\n{}\n```\n",
            first.map_or("–".into(), |v| format!("{v:.4}")),
            last.map_or("–".into(), |v| format!("{v:.4}")),
            if falls { "falls" } else { "does not fall" },
            self.killed_at.map_or("–".into(), |s| s.to_string()),
            comparison.compared,
            comparison.max_relative,
            if matches { "matches" } else { "DIFFERS" },
            used.eval_line,
            used.sample_text,
        );
        Outcome {
            status,
            results: json!({
                "first_train_loss": first, "last_train_loss": last, "loss_falls": falls,
                "killed_at_step": self.killed_at, "compared_values": comparison.compared,
                "max_relative_difference": comparison.max_relative, "resume_matches": matches,
                "eval": used.eval_line, "sample": used.sample_text,
            }),
            markdown,
        }
    }
}

fn failed_at(what: &str, status: StageStatus) -> Outcome {
    match status {
        StageStatus::Failed(why) => Outcome::failed(format!("{what}: {why}")),
        other => Outcome {
            status: other,
            results: serde_json::Value::Null,
            markdown: format!("{what} ran out of time.\n"),
        },
    }
}

/// The step of the run's checkpoint, once one is complete.
fn checkpoint_step(state: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(state).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value["step"].as_u64().map(|s| s as usize)
}

fn metrics(run_dir: &Path) -> Result<Vec<MetricsLine>, String> {
    let path: PathBuf = run_dir.join("metrics.jsonl");
    read_metrics(&path).map_err(|e| e.to_string())
}

struct Comparison {
    compared: usize,
    max_relative: f64,
}

/// Every training and validation loss logged at the same step in both runs; a step logged in one
/// run only makes the runs differ.
fn compare(a: &[MetricsLine], b: &[MetricsLine]) -> Comparison {
    let mut comparison = Comparison {
        compared: 0,
        max_relative: 0.0,
    };
    let values = |l: &MetricsLine| [l.train_loss, l.val_loss];
    let steps_a: Vec<usize> = a.iter().map(|l| l.step).collect();
    let steps_b: Vec<usize> = b.iter().map(|l| l.step).collect();
    if steps_a != steps_b {
        comparison.max_relative = f64::INFINITY;
        return comparison;
    }
    for (x, y) in a.iter().zip(b) {
        for (u, v) in values(x).into_iter().zip(values(y)) {
            match (u, v) {
                (Some(u), Some(v)) => {
                    comparison.compared += 1;
                    let relative = (u - v).abs() / u.abs().max(1e-12);
                    comparison.max_relative = comparison.max_relative.max(relative);
                }
                (None, None) => {}
                _ => comparison.max_relative = f64::INFINITY,
            }
        }
    }
    comparison
}
