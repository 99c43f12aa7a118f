//! The `haares-gpu-check` command line.

use std::path::PathBuf;

use haares_train::backend::BackendKind;

use super::{CheckSpec, PackLimits, Profile, STAGES, run_check};

/// Everything a GPU node should measure of haares, in budgeted stages with a summary after each
/// (docs/benchmarks.md, "The GPU check"; scripts/gpu/run.sh calls it).
#[derive(clap::Parser)]
#[command(name = "haares-gpu-check", version)]
pub struct GpuCheckArgs {
    /// Backend the stages run on: the bundle's binaries must have it; this one need not.
    #[arg(long, default_value = "cuda", value_parser = BackendKind::from_name)]
    backend: BackendKind,
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
    /// The haares-bench binary the stages measure with [default: beside this one].
    #[arg(long)]
    bench_bin: Option<PathBuf>,
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
    /// summaries, `results.tar.gz` and the kernel cache in parts, for a node that hands back only
    /// a few files of bounded size.
    #[arg(long)]
    pack: Option<PathBuf>,
    /// With --pack: the largest part of the kernel cache's archive, in MiB [default: 15].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=4096))]
    part_mib: Option<u64>,
    /// With --pack: the most parts of the kernel cache's archive; a larger cache is left out
    /// [default: 4].
    #[arg(long, value_name = "N")]
    max_parts: Option<usize>,
}

impl GpuCheckArgs {
    /// The check these options describe; binaries not given are looked for beside this one.
    pub fn spec(self) -> Result<CheckSpec, String> {
        let this =
            std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        let beside = |name: &str| this.with_file_name(name);
        if self.pack.is_none() && (self.part_mib.is_some() || self.max_parts.is_some()) {
            return Err(
                "--part-mib and --max-parts size what --pack writes: give --pack too".into(),
            );
        }
        let defaults = PackLimits::default();
        let pack_limits = PackLimits {
            part_bytes: self
                .part_mib
                .map_or(defaults.part_bytes, |mib| mib as usize * 1024 * 1024),
            max_parts: self.max_parts.unwrap_or(defaults.max_parts),
        };
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
            pack_limits,
            bench_bin: self.bench_bin.unwrap_or_else(|| beside("haares-bench")),
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
