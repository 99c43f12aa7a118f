//! The `gpu-check` command line.

use std::path::PathBuf;

use super::{CheckSpec, Profile, STAGES, run_check};

/// `haares-bench gpu-check`'s options.
#[derive(clap::Args)]
pub struct GpuCheckArgs {
    /// Backend the stages run on.
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Output folder (summary.md, summary.json, one log and result files per stage).
    #[arg(long)]
    out: PathBuf,
    /// `gpu`: the paper's sizes; `tiny`: the same stages in about 10 s on a CPU.
    #[arg(long, default_value = "gpu", value_parser = ["gpu", "tiny"])]
    profile: String,
    /// Stages to run [default: all: facts, portability, products, cost-small, cost-medium,
    /// compile-small, kernel-times, first-step, first-step-deep, real-run, placement].
    #[arg(long, value_delimiter = ',')]
    stages: Option<Vec<String>>,
    /// A stage's budget in seconds, replacing the profile's, e.g. `cost-small=200` (repeatable).
    #[arg(long = "budget", value_name = "STAGE=SECONDS")]
    budgets: Vec<String>,
    /// Training steps of the real-run stage, replacing the profile's (it is killed at its first
    /// checkpoint, so this must exceed the profile's checkpoint interval: 50 for `gpu`, 80 for
    /// `tiny`).
    #[arg(long)]
    real_run_steps: Option<usize>,
    /// The haares-train binary [default: beside this one].
    #[arg(long)]
    train_bin: Option<PathBuf>,
    /// The core's portability test binary, built with the backend's feature [default:
    /// `portability` beside this one].
    #[arg(long)]
    portability_bin: Option<PathBuf>,
    /// Portability tests run at once, each in a process of its own [default: a quarter of the
    /// CPUs, at least 1: on a cold GPU each compiles its kernels on one CPU, beside the stages'
    /// workers and PyTorch].
    #[arg(long)]
    portability_jobs: Option<usize>,
    /// The bundle's manifest.json (scripts/gpu/build.sh), copied into the summary.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// After every stage, also pack the output folder into this one as a few files: the
    /// summaries, `results.tar.gz` and the kernel cache in parts (a lent machine hands back at
    /// most 8 files).
    #[arg(long)]
    pack: Option<PathBuf>,
}

impl GpuCheckArgs {
    /// The check these options describe; binaries not given are looked for beside this one.
    pub fn spec(self) -> Result<CheckSpec, String> {
        let bench_bin =
            std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        let beside = |name: &str| bench_bin.with_file_name(name);
        let budgets = self
            .budgets
            .iter()
            .map(|b| {
                let (stage, seconds) = b.split_once('=').ok_or_else(|| {
                    format!("--budget `{b}` is not STAGE=SECONDS, e.g. --budget cost=400")
                })?;
                let seconds = seconds.parse::<u64>().map_err(|_| {
                    format!("--budget `{b}`: `{seconds}` is not a whole number of seconds")
                })?;
                Ok((stage.to_string(), seconds))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut profile = if self.profile == "tiny" {
            Profile::tiny()
        } else {
            Profile::gpu()
        };
        if let Some(steps) = self.real_run_steps {
            let every = profile.real_run.checkpoint_every;
            if steps <= every {
                return Err(format!(
                    "--real-run-steps {steps} must exceed the real run's checkpoint interval \
                     {every}: the stage kills the run at its first checkpoint and resumes it"
                ));
            }
            profile.real_run.steps = steps;
        }
        Ok(CheckSpec {
            profile,
            stages: self
                .stages
                .unwrap_or_else(|| STAGES.iter().map(|s| s.to_string()).collect()),
            budgets,
            out: self.out,
            train_bin: self.train_bin.unwrap_or_else(|| beside("haares-train")),
            portability_bin: self
                .portability_bin
                .unwrap_or_else(|| beside("portability")),
            portability_jobs: self.portability_jobs.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1))
            }),
            manifest: self.manifest,
            pack_into: self.pack,
            bench_bin,
            backend: self.backend,
        })
    }
}

/// Runs the check; an error unless every stage passed.
pub fn gpu_check(args: GpuCheckArgs) -> Result<String, String> {
    let spec = args.spec()?;
    let report = run_check(&spec)?;
    let summary = spec
        .pack_into
        .as_ref()
        .unwrap_or(&spec.out)
        .join("summary.md");
    if report.passed() {
        Ok(format!("every stage passed; {}\n", summary.display()))
    } else {
        Err(format!(
            "a stage did not pass; {} says which",
            summary.display()
        ))
    }
}
