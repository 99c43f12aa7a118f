//! `haares-train`: train, sweep, report, eval, inspect and sample. See `docs/experiments.md`.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use haares_train::backend::{BackendKind, dispatch};
use haares_train::error::Result;
use haares_train::inference::{EvalJob, ModelSource, SampleJob};
use haares_train::inspect::{InspectJob, Inspected};
use haares_train::report::write_report;
use haares_train::run::learner::Outcome;
use haares_train::study::sweep::{SingleRunJob, SweepJob};
use haares_train::study::sweep::{report_after_sweep, tally};
use haares_train::study::{
    PlannedRun, Study, load_run_config, load_study, parse_shard, shard_runs,
};

use cli::{Common, DeviceArgs, ModelFileArgs, OverrideArgs};

#[derive(Parser)]
#[command(
    name = "haares-train",
    version,
    about = "Train HAARES and its baselines; run and report the paper's studies"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every run of a study (depth, seeds, width, bpe, domains, blocks, ablations), then
    /// report.
    Sweep(SweepCommand),
    /// Write report.md, paired_results.csv and figures from a study's finished runs.
    Report(ReportCommand),
    /// Train one run: a study's first run with overrides, into --run-dir.
    Train(TrainCommand),
    /// Validation loss of a model (a run directory or a .safetensors inside one).
    Eval(EvalCommand),
    /// Show a model's routers: per read site the slots and their mean weights, the detail mass
    /// p_D, the entropy and the detail bias; writes routing.json and the heatmap (SVG, PNG).
    Inspect(InspectCommand),
    /// Generate text from a model.
    Sample(SampleCommand),
}

fn main() -> ExitCode {
    // glibc's allocator keeps what a training step frees (the process is this binary's to
    // configure; the library never sets it): before any thread starts.
    haares_train::cpu::keep_freed_memory();
    let cli = Cli::parse();
    // The products' provider is the process's (HAARES_PRODUCTS): a misspelt one is refused before
    // any work, not replaced by the default.
    if let Err(error) = haares_core::ops::matmul::ProductProvider::from_env() {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let outcome = match cli.command {
        Command::Sweep(command) => command.run(),
        Command::Report(command) => command.run(),
        Command::Train(command) => command.run(),
        Command::Eval(command) => command.run(),
        Command::Inspect(command) => command.run(),
        Command::Sample(command) => command.run(),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Args)]
struct SweepCommand {
    /// Study name or path to a study .toml file.
    study: String,
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    overrides: OverrideArgs,
    /// Run only shard i of n (0-based): every n-th run starting at the i-th.
    #[arg(long)]
    shard: Option<String>,
    /// List the runs without training.
    #[arg(long)]
    dry_run: bool,
    /// Runs trained at the same time (default: the number of CPU cores for CPU backends, 1 on a
    /// GPU).
    #[arg(long)]
    jobs: Option<usize>,
    #[command(flatten)]
    devices: DeviceArgs,
    /// Place each run on one of the GPUs --devices names, this many runs at a time on each (1:
    /// one run per GPU), instead of training every run data-parallel on all of them. A run that
    /// fails is reported and its GPU takes the next run.
    #[arg(long, conflicts_with = "jobs")]
    runs_per_device: Option<usize>,
}

impl SweepCommand {
    /// Trains the study's unfinished runs (this shard's), then writes the report of all of them.
    fn run(self) -> Result<()> {
        let backend = self.common.backend()?;
        let (study, all) = plan(&self.study, &self.overrides)?;
        let runs = match &self.shard {
            Some(shard) => shard_runs(all.clone(), parse_shard(shard)?),
            None => all.clone(),
        };
        if self.dry_run {
            for run in &runs {
                let config = serde_json::to_string(&run.config).expect("a run config serialises");
                println!("{}\t{config}", run.name);
            }
            return Ok(());
        }
        let study_dir = self.common.runs_dir.join(&study.name);
        let job = SweepJob {
            runs,
            study_dir: study_dir.clone(),
            paths: self.common.paths(),
            progress: !self.common.quiet,
            stop_after: None,
            jobs: self.jobs.unwrap_or_else(|| default_jobs(backend)),
            devices: self.devices.devices,
            runs_per_device: self.runs_per_device,
        };
        let statuses = dispatch(backend, job)?;
        eprintln!("{}", tally(&statuses));
        let written = report_after_sweep(&study, &all, &study_dir, &statuses)?;
        println!("report: {}", written.display());
        Ok(())
    }
}

#[derive(Args)]
struct ReportCommand {
    /// Study name or path to a study .toml file.
    study: String,
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    overrides: OverrideArgs,
}

impl ReportCommand {
    fn run(self) -> Result<()> {
        let (study, runs) = plan(&self.study, &self.overrides)?;
        let written = write_report(&study, &runs, &self.common.runs_dir.join(&study.name))?;
        println!("report: {}", written.display());
        Ok(())
    }
}

#[derive(Args)]
struct TrainCommand {
    /// Directory of the run (created; resumed if it holds a checkpoint).
    #[arg(long)]
    run_dir: PathBuf,
    /// Study whose preset supplies the defaults (its first run) when no --config is given.
    #[arg(long, default_value = "depth")]
    study: String,
    /// A run config: a TOML table of run-config fields, or a run's config.json.
    #[arg(long, conflicts_with = "study")]
    config: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    overrides: OverrideArgs,
    #[command(flatten)]
    devices: DeviceArgs,
}

impl TrainCommand {
    fn run(self) -> Result<()> {
        let config = match &self.config {
            Some(path) => load_run_config(path, &self.overrides.overrides()?)?,
            None => {
                let (_, runs) = plan(&self.study, &self.overrides)?;
                let first = runs.into_iter().next();
                first.expect("a study has at least one run").config
            }
        };
        let job = SingleRunJob {
            config,
            run_dir: self.run_dir,
            paths: self.common.paths(),
            progress: !self.common.quiet,
            devices: self.devices.devices,
        };
        match dispatch(self.common.backend()?, job)? {
            Outcome::Finished(summary) => println!(
                "best validation loss {:.4} at step {} ({:.0} tokens/s)",
                summary.best_val_loss, summary.best_step, summary.tokens_per_s
            ),
            Outcome::Stopped { step } => println!("stopped at step {step}"),
        }
        Ok(())
    }
}

#[derive(Args)]
struct EvalCommand {
    /// Run directory or model file.
    model: PathBuf,
    /// Evaluate on another dataset than the run's (same tokeniser required).
    #[arg(long)]
    dataset: Option<String>,
    /// Only the first this many validation chunks.
    #[arg(long)]
    chunks: Option<usize>,
    #[command(flatten)]
    model_file: ModelFileArgs,
    #[command(flatten)]
    common: Common,
}

impl EvalCommand {
    fn run(self) -> Result<()> {
        let job = EvalJob {
            source: ModelSource::resolve(&self.model)?.with_options(self.model_file.options()),
            dataset: self.dataset,
            chunks: self.chunks,
            paths: self.common.paths(),
        };
        let (loss, chunks) = dispatch(self.common.backend()?, job)?;
        println!(
            "validation loss {loss:.4} (perplexity {:.2}) over {chunks} chunks",
            loss.exp()
        );
        Ok(())
    }
}

#[derive(Args)]
struct InspectCommand {
    /// Run directory, a model file inside one, or a bare .safetensors file.
    model: PathBuf,
    /// Route this text instead of the validation split, and show its weights per token.
    #[arg(long)]
    prompt: Option<String>,
    /// The tokeniser (tokenizer.json) of a bare model file, for --prompt.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Validation chunks to route when no prompt is given.
    #[arg(long, default_value_t = 16)]
    chunks: usize,
    /// Where to write routing.json, routing.svg/png and tokens.csv (default: <run>/inspect,
    /// or <file stem>-inspect beside a bare file).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    model_file: ModelFileArgs,
    #[command(flatten)]
    common: Common,
}

impl InspectCommand {
    fn run(self) -> Result<()> {
        let inspected = Inspected::resolve(&self.model)?;
        let job = InspectJob {
            out: self.out.unwrap_or_else(|| inspected.default_out()),
            inspected,
            load: self.model_file.options(),
            prompt: self.prompt,
            tokenizer: self.tokenizer,
            chunks: self.chunks,
            paths: self.common.paths(),
        };
        let inspection = dispatch(self.common.backend()?, job)?;
        println!("{}", inspection.table);
        if let Some(per_token) = &inspection.per_token {
            println!("{per_token}");
        }
        for file in &inspection.files {
            println!("wrote {}", file.display());
        }
        Ok(())
    }
}

#[derive(Args)]
struct SampleCommand {
    /// Run directory or model file.
    model: PathBuf,
    /// Text to continue.
    #[arg(long, default_value = "My fellow Americans,")]
    prompt: String,
    /// New tokens.
    #[arg(long, default_value_t = 200)]
    tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample among the k most likely tokens; 0 keeps all.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    model_file: ModelFileArgs,
    #[command(flatten)]
    common: Common,
}

impl SampleCommand {
    fn run(self) -> Result<()> {
        let job = SampleJob {
            source: ModelSource::resolve(&self.model)?.with_options(self.model_file.options()),
            prompt: self.prompt.clone(),
            tokens: self.tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            seed: self.seed,
        };
        let text = dispatch(self.common.backend()?, job)?;
        println!("{}{text}", self.prompt);
        Ok(())
    }
}

/// The study `name` and its runs under the command line's preset and overrides.
fn plan(name: &str, overrides: &OverrideArgs) -> Result<(Study, Vec<PlannedRun>)> {
    let study = load_study(name)?;
    let runs = study.plan(overrides.preset.as_deref(), &overrides.overrides()?)?;
    Ok((study, runs))
}

/// CPU backends train a small model on about one core, so one run per core; a GPU runs one.
fn default_jobs(backend: BackendKind) -> usize {
    match backend.is_cube() {
        false => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        true => 1,
    }
}
