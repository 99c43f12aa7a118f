//! `haares-gpu-check`: everything a GPU node should measure of haares, in stages, cheapest
//! first, each under its own time budget, with `summary.md` and `summary.json` rewritten after
//! every stage so that a run cut short keeps what it measured (docs/benchmarks.md, "The GPU
//! check"). It runs the binaries of a bundle built elsewhere (`scripts/gpu/build.sh`), so the
//! node needs no Rust toolchain, and can pack its output into a few files of bounded size for
//! machines that hand back only so much ([`pack::PackLimits`]).
//!
//! Stages, in order: `facts` (the device, its driver, the GEMM peak, the products' provider),
//! `portability` (the core's numerical and kernel checks on the backend, one process per test),
//! `products` (every matrix product of a step, by provider, against `torch.matmul`),
//! `cost-small` and `cost-medium` (the cost protocol at d = 128 and 512 beside PyTorch eager),
//! `compile-small` (the same against `torch.compile`), `kernel-times` (a steady step's device time
//! by phase and kernel), `first-step` and `first-step-deep` (the first-step anatomy at a shallow
//! and at the paper's depth), `real-run` (training on the embedded corpus with a checkpoint, a
//! kill and a resume compared with an uninterrupted run, then `eval` and `sample`), `placement`
//! (one run on the device, then two side by side; docs/experiments.md, "Many runs, one per GPU").
//! The `gpu` profile has the paper's sizes; `tiny` runs the same stages in seconds on a CPU (CI
//! runs it).

pub mod cli;
pub mod pack;
mod placement;
mod portability;
mod process;
mod real_run;
mod stage;
mod stages;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

pub use pack::PackLimits;
pub use stages::{Profile, STAGES};

/// What a check runs, and with which binaries.
#[derive(Debug, Clone)]
pub struct CheckSpec {
    /// The backend the stages run on (`cuda` on a GPU machine).
    pub backend: BackendKind,
    /// Sizes and budgets.
    pub profile: Profile,
    /// Stages to run, in [`STAGES`] order.
    pub stages: Vec<String>,
    /// `(stage, seconds)` budgets replacing the profile's.
    pub budgets: Vec<(String, u64)>,
    /// Output folder.
    pub out: PathBuf,
    /// The `haares-bench` binary (the stages' measurements and their workers).
    pub bench_bin: PathBuf,
    /// The `haares-train` binary.
    pub train_bin: PathBuf,
    /// The core's `portability` test binary, built with the backend's feature.
    pub portability_bin: PathBuf,
    /// How many portability tests run at once, each in its own process.
    pub portability_jobs: usize,
    /// The bundle's manifest (commit, build), copied into the summary.
    pub manifest: Option<PathBuf>,
    /// Where the output folder is packed after every stage (`pack`), if anywhere.
    pub pack_into: Option<PathBuf>,
    /// The files a packed folder may hold and their size.
    pub pack_limits: PackLimits,
}

/// How a stage ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// Everything it runs succeeded and its checks held.
    Passed,
    /// Something failed; why.
    Failed(String),
    /// Its budget ran out; what it had measured is kept.
    TimedOut,
    /// It cannot run on the check's backend; why. Neither a pass nor a failure.
    Skipped(String),
}

/// One finished stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageRecord {
    /// Stage name.
    pub name: String,
    /// How it ended.
    pub status: StageStatus,
    /// Wall seconds.
    pub seconds: f64,
    /// Its budget in seconds.
    pub budget_s: u64,
    /// Its log file, relative to the output folder.
    pub log: String,
    /// What it measured, as JSON (stage-specific).
    pub results: serde_json::Value,
    /// What it measured, as markdown.
    pub markdown: String,
}

/// The check so far: `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    /// Backend.
    pub backend: BackendKind,
    /// Profile name.
    pub profile: String,
    /// Unix seconds at the start.
    pub started_unix_s: u64,
    /// The bundle's manifest, if given.
    pub manifest: Option<serde_json::Value>,
    /// Whether the `haares-bench` binary the stages run (and its workers) autotunes CubeCL
    /// kernels, as the bundle's manifest says; `None` without a manifest that says it.
    #[serde(default)]
    pub autotune: Option<bool>,
    /// Finished stages, in order.
    pub stages: Vec<StageRecord>,
}

impl CheckReport {
    /// Whether every stage passed or was skipped (could not run on the backend).
    pub fn passed(&self) -> bool {
        self.stages
            .iter()
            .all(|s| matches!(s.status, StageStatus::Passed | StageStatus::Skipped(_)))
    }
}

impl CheckSpec {
    /// Refuses unknown stages and budgets, and missing binaries, before anything runs.
    pub fn validate(&self) -> Result<(), String> {
        for name in self
            .stages
            .iter()
            .chain(self.budgets.iter().map(|(n, _)| n))
        {
            if !STAGES.contains(&name.as_str()) {
                return Err(format!(
                    "unknown stage `{name}`; the stages are {}",
                    STAGES.join(", ")
                ));
            }
        }
        for (what, path) in [
            ("--train-bin", &self.train_bin),
            ("--portability-bin", &self.portability_bin),
            ("the haares-bench binary", &self.bench_bin),
        ] {
            if !path.is_file() {
                return Err(format!(
                    "{what} `{}` does not exist: build the bundle with scripts/gpu/build.sh \
                     (or give the path)",
                    path.display()
                ));
            }
        }
        Ok(())
    }

    fn budget(&self, stage: &str) -> u64 {
        self.budgets
            .iter()
            .find(|(name, _)| name == stage)
            .map_or_else(|| self.profile.budget_s(stage), |(_, s)| *s)
    }
}

/// Runs the stages in order; the summary is rewritten after each. A failed stage does not stop
/// the next one.
pub fn run_check(spec: &CheckSpec) -> Result<CheckReport, String> {
    spec.validate()?;
    std::fs::create_dir_all(&spec.out)
        .map_err(|e| format!("cannot create `{}`: {e}", spec.out.display()))?;
    let manifest = match &spec.manifest {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .ok()
                .and_then(|text| serde_json::from_str(&text).ok())
                .ok_or_else(|| format!("cannot read the manifest `{}`", path.display()))?,
        ),
        None => None,
    };
    let mut report = CheckReport {
        backend: spec.backend,
        profile: spec.profile.name.to_string(),
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        autotune: bench_autotunes(manifest.as_ref(), &spec.bench_bin),
        manifest,
        stages: Vec::new(),
    };
    let chosen: Vec<&str> = STAGES
        .iter()
        .copied()
        .filter(|s| spec.stages.iter().any(|c| c == s))
        .collect();
    for (index, name) in chosen.iter().enumerate() {
        let budget_s = spec.budget(name);
        eprintln!(
            "[gpu-check] stage {}/{} `{name}` started (budget {budget_s} s)",
            index + 1,
            chosen.len()
        );
        let started = Instant::now();
        let deadline = started + std::time::Duration::from_secs(budget_s);
        let log = format!("{name}.log");
        let outcome = stages::run_stage(name, spec, deadline, &spec.out.join(&log));
        let record = StageRecord {
            name: name.to_string(),
            status: outcome.status,
            seconds: started.elapsed().as_secs_f64(),
            budget_s,
            log,
            results: outcome.results,
            markdown: outcome.markdown,
        };
        eprintln!(
            "[gpu-check] stage `{name}`: {} in {:.0} s",
            status_text(&record.status),
            record.seconds
        );
        report.stages.push(record);
        write_atomically_both(
            &spec.out.join("summary"),
            &report,
            &summary_markdown(&report),
        )?;
        if let Some(into) = &spec.pack_into {
            let cache = haares_train::kernel_cache::kernel_cache_dir();
            if let Err(e) = pack::pack(&spec.out, into, &cache, spec.pack_limits) {
                eprintln!(
                    "[gpu-check] warning: packing into `{}` failed: {e}",
                    into.display()
                );
            }
        }
    }
    Ok(report)
}

/// Whether the bundle's `haares-bench` autotunes: the manifest's entry for the binary's file name
/// (`build.sh` builds a tuned and an untuned one).
fn bench_autotunes(
    manifest: Option<&serde_json::Value>,
    bench_bin: &std::path::Path,
) -> Option<bool> {
    let name = bench_bin.file_name()?.to_string_lossy().into_owned();
    manifest?["autotune"][name.as_str()].as_bool()
}

/// Writes `value` as `<stem>.json` and `table` as `<stem>.md`, each atomically.
fn write_atomically_both(
    stem: &std::path::Path,
    value: &impl Serialize,
    table: &str,
) -> Result<(), String> {
    let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    for (extension, text) in [("json", json.as_str()), ("md", table)] {
        let path = stem.with_extension(extension);
        haares_data::write_atomically(&path, text.as_bytes())
            .map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    }
    Ok(())
}

fn status_text(status: &StageStatus) -> String {
    match status {
        StageStatus::Passed => "passed".into(),
        StageStatus::Failed(why) => format!("FAILED ({why})"),
        StageStatus::TimedOut => "TIMED OUT (what it measured is kept)".into(),
        StageStatus::Skipped(why) => format!("skipped ({why})"),
    }
}

/// `summary.md`: the build, then every stage's status and measurements.
pub fn summary_markdown(report: &CheckReport) -> String {
    let mut out = format!(
        "# GPU check: backend `{}`, profile `{}`\n\n",
        report.backend, report.profile
    );
    if let Some(manifest) = &report.manifest {
        let field = |key: &str| manifest[key].as_str().unwrap_or("?").to_string();
        let _ = writeln!(
            out,
            "Bundle built from commit `{}` (uncommitted changes: {}) on {}, {}.\n",
            field("commit"),
            manifest["dirty"],
            field("built"),
            field("rustc")
        );
        // A seeded cache makes every first step warm: the timings say so next to them.
        let seed = &manifest["kernel_cache_seed"];
        if seed.is_object() {
            let _ = writeln!(
                out,
                "The kernel cache started from an earlier run's ({} bytes, sha256 `{}`): \
                 kernels it holds are neither compiled nor tuned again, so first steps are \
                 warm, not cold.\n",
                seed["bytes"],
                seed["sha256"].as_str().unwrap_or("?")
            );
        }
    }
    let _ = match report.autotune {
        Some(autotune) => writeln!(
            out,
            "The stages' `haares-bench` and its workers run with {}.\n",
            haares_train::backend::autotune_text(autotune)
        ),
        None => writeln!(
            out,
            "No manifest names the stages' `haares-bench` build: whether it autotunes is not \
             known.\n"
        ),
    };
    // The real run's trainer is another binary, built as the manifest says.
    if let Some(train) = report
        .manifest
        .as_ref()
        .and_then(|manifest| manifest["autotune"]["haares-train"].as_bool())
    {
        let _ = writeln!(
            out,
            "The real run's `haares-train` was built with {}.\n",
            haares_train::backend::autotune_text(train)
        );
    }
    out.push_str("| stage | status | seconds | budget (s) | log |\n|---|---|---|---|---|\n");
    for stage in &report.stages {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} |",
            stage.name,
            status_text(&stage.status),
            stage.seconds,
            stage.budget_s,
            stage.log
        );
    }
    for stage in &report.stages {
        let _ = write!(
            out,
            "\n## {}\n\n{}\n",
            stage.name,
            stage.markdown.trim_end()
        );
    }
    out
}
