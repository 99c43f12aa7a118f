//! A stage of the GPU check as every stage runs: its commands under the stage's deadline, logged,
//! and what it reports ([`super::stages`] runs the stages, [`super::real_run`] is one of them).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

use super::process::{Exit, Finished, run_logged};
use super::{CheckSpec, StageStatus};

/// What a stage reports.
pub struct Outcome {
    pub(super) status: StageStatus,
    pub(super) results: Value,
    pub(super) markdown: String,
}

impl Outcome {
    /// A stage that cannot run on this check's backend, and why.
    pub(super) fn skipped(why: impl Into<String>) -> Self {
        let why = why.into();
        Self {
            markdown: format!("Skipped: {why}.\n"),
            status: StageStatus::Skipped(why),
            results: Value::Null,
        }
    }

    /// A stage that failed before it measured anything.
    pub(super) fn failed(why: impl Into<String>) -> Self {
        let why = why.into();
        Self {
            markdown: format!("Failed: {why}.\n"),
            status: StageStatus::Failed(why),
            results: Value::Null,
        }
    }
}

/// A running stage: the check, the stage's deadline and log.
pub(super) struct Stage<'a> {
    pub(super) spec: &'a CheckSpec,
    pub(super) deadline: Instant,
    pub(super) log: &'a Path,
    pub(super) name: &'a str,
}

/// A finished command's status: passed, failed with its exit, or timed out.
pub(super) fn status_of(finished: &Finished) -> StageStatus {
    match &finished.exit {
        Exit::Success => StageStatus::Passed,
        Exit::TimedOut => StageStatus::TimedOut,
        Exit::Failed(status) => StageStatus::Failed(format!("exited with {status}; see the log")),
        Exit::Stopped => StageStatus::Failed("stopped".into()),
    }
}

impl Stage<'_> {
    /// The options every `haares-train` command of a stage takes: its backend, and its runs, data
    /// and cache folders under `root`, offline and quiet.
    pub(super) fn train_options(&self, root: &Path) -> Vec<String> {
        [
            "--backend",
            self.spec.backend.name(),
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
        .to_vec()
    }

    /// Runs `program` under the stage's deadline, logged.
    pub(super) fn run(&self, program: &Path, args: &[String]) -> Result<Finished, String> {
        self.run_until(program, args, &|| false)
    }

    /// [`Self::run`], killed early once `stop_when` holds.
    pub(super) fn run_until(
        &self,
        program: &Path,
        args: &[String],
        stop_when: &dyn Fn() -> bool,
    ) -> Result<Finished, String> {
        let mut command = Command::new(program);
        command.args(args);
        run_logged(command, self.deadline, self.log, self.name, stop_when)
    }
}
