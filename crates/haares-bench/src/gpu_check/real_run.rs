//! The `real-run` stage: `haares-train train` on the embedded corpus twice, once uninterrupted
//! and once killed (SIGKILL) after its first checkpoint and resumed; their logged losses must
//! agree, the loss must fall, and `eval` and `sample` must work on the resumed run.

use std::path::{Path, PathBuf};

use haares_train::metrics::{MetricsLine, read_metrics};
use serde_json::json;

use super::StageStatus;
use super::stages::{Outcome, Stage, status_of};

/// Largest difference between the two runs' logged losses, relative to the loss, that still
/// counts as the same run: float noise (and a GPU's non-deterministic reductions) stays orders
/// below it, a resume that loses or repeats a step, a batch or the optimizer state does not.
pub const RESUME_TOLERANCE: f64 = 1e-3;

pub(super) fn real_run(stage: &Stage) -> Result<Outcome, String> {
    let spec = stage.spec;
    let sizes = &spec.profile.real_run;
    let root = spec.out.join("real-run");
    let common: Vec<String> = [
        "--backend",
        &spec.backend,
        "--runs-dir",
        &root.display().to_string(),
        "--data-dir",
        &root.join("data").display().to_string(),
        "--cache-dir",
        &root.join("cache").display().to_string(),
        "--offline",
        "--quiet",
    ]
    .map(String::from)
    .to_vec();
    let train_args = |run_dir: &Path| -> Vec<String> {
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
        for set in [
            format!("checkpoint_every={every}"),
            format!("eval_every={every}"),
        ]
        .iter()
        .map(String::as_str)
        .chain(sizes.sets.iter().copied())
        {
            args.extend(["--set".into(), set.into()]);
        }
        args.extend(common.iter().cloned());
        args
    };
    let (whole, resumed) = (root.join("uninterrupted"), root.join("killed-and-resumed"));

    let finished = stage.run(&spec.train_bin, &train_args(&whole))?;
    if status_of(&finished) != StageStatus::Passed {
        return Ok(failed_at("the uninterrupted run", status_of(&finished)));
    }
    let state = resumed.join("checkpoint").join("state.json");
    let killed = stage.run_until(&spec.train_bin, &train_args(&resumed), &|| {
        checkpoint_step(&state).is_some_and(|step| step >= sizes.checkpoint_every)
    })?;
    let killed_at = checkpoint_step(&state);
    match killed.exit {
        super::process::Exit::Stopped => {}
        super::process::Exit::Success => {
            return Ok(Outcome::failed(
                "the run finished before it could be killed: raise the profile's steps",
            ));
        }
        _ => return Ok(failed_at("the run to be killed", status_of(&killed))),
    }
    let finished = stage.run(&spec.train_bin, &train_args(&resumed))?;
    if status_of(&finished) != StageStatus::Passed {
        return Ok(failed_at("the resumed run", status_of(&finished)));
    }

    let (a, b) = (metrics(&whole)?, metrics(&resumed)?);
    let comparison = compare(&a, &b);
    let run_dir = resumed.display().to_string();
    let mut eval_args = vec!["eval".to_string(), run_dir.clone()];
    eval_args.extend(common.iter().cloned());
    let eval = stage.run(&spec.train_bin, &eval_args)?;
    let mut sample_args: Vec<String> = ["sample", &run_dir, "--tokens", "120", "--seed", "1"]
        .map(String::from)
        .to_vec();
    sample_args.extend(common.iter().cloned());
    let sample = stage.run(&spec.train_bin, &sample_args)?;

    let train_losses: Vec<f64> = b.iter().filter_map(|l| l.train_loss).collect();
    let (first, last) = (train_losses.first().copied(), train_losses.last().copied());
    let falls = matches!((first, last), (Some(f), Some(l)) if l < f);
    let matches = comparison.compared > 0 && comparison.max_relative <= RESUME_TOLERANCE;
    let eval_line = eval.stdout.trim().to_string();
    let sample_text = sample.stdout.trim().to_string();
    let status = [(status_of(&eval), "eval"), (status_of(&sample), "sample")]
        .into_iter()
        .find(|(s, _)| *s != StageStatus::Passed)
        .map(|(s, what)| match s {
            StageStatus::Failed(why) => StageStatus::Failed(format!("{what}: {why}")),
            other => other,
        })
        .unwrap_or_else(|| match (falls, matches, sample_text.is_empty()) {
            (false, _, _) => StageStatus::Failed("the training loss did not fall".into()),
            (_, false, _) => {
                StageStatus::Failed("the resumed run differs from the uninterrupted one".into())
            }
            (_, _, true) => StageStatus::Failed("sample printed no text".into()),
            _ => StageStatus::Passed,
        });
    let markdown = format!(
        "HAARES, {} layers, {} steps ({}), checkpoint every {} steps, on the embedded corpus.\n\n\
         - training loss {} → {} ({})\n\
         - killed (SIGKILL) with its checkpoint at step {}, then resumed: {} logged values \
           compared with the uninterrupted run, largest difference {:.2e} relative \
           (tolerance {RESUME_TOLERANCE:.0e}): {}\n\
         - `eval`: {eval_line}\n\
         - `sample` (120 tokens, seed 1):\n\n```\n{sample_text}\n```\n",
        sizes.layers,
        sizes.steps,
        sizes.sets.join(", "),
        sizes.checkpoint_every,
        first.map_or("–".into(), |v| format!("{v:.4}")),
        last.map_or("–".into(), |v| format!("{v:.4}")),
        if falls { "falls" } else { "does not fall" },
        killed_at.map_or("–".into(), |s| s.to_string()),
        comparison.compared,
        comparison.max_relative,
        if matches { "matches" } else { "DIFFERS" },
    );
    Ok(Outcome {
        status,
        results: json!({
            "first_train_loss": first, "last_train_loss": last, "loss_falls": falls,
            "killed_at_step": killed_at, "compared_values": comparison.compared,
            "max_relative_difference": comparison.max_relative, "resume_matches": matches,
            "eval": eval_line, "sample": sample_text,
        }),
        markdown,
    })
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
