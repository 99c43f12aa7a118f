//! `haares-train`: train, sweep, report, eval, inspect and sample. See `docs/experiments.md`.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use haares_train::backend::{BackendKind, dispatch};
use haares_train::error::Result;
use haares_train::inference::{EvalJob, ModelSource, SampleJob};
use haares_train::inspect::{InspectJob, Inspected};

use cli::{Common, DeviceArgs, OverrideArgs};
use haares_train::learner::Outcome;
use haares_train::report;
use haares_train::study::{
    PlannedRun, Study, load_run_config, load_study, parse_shard, shard_runs,
};
use haares_train::sweep::{RunStatus, SingleRunJob, SweepJob};

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
    /// Run every run of a study (depth, seeds, width, bpe, domains, blocks, ablations), then report.
    Sweep {
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
        /// Runs trained at the same time (default: the number of CPU cores for CPU backends, 1 on a GPU).
        #[arg(long)]
        jobs: Option<usize>,
        #[command(flatten)]
        devices: DeviceArgs,
    },
    /// Write report.md, paired_results.csv and figures from a study's finished runs.
    Report {
        /// Study name or path to a study .toml file.
        study: String,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Train one run: a study's first run with overrides, into --run-dir.
    Train {
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
    },
    /// Validation loss of a model (a run directory or a .safetensors inside one).
    Eval {
        /// Run directory or model file.
        model: PathBuf,
        /// Evaluate on another dataset than the run's (same tokeniser required).
        #[arg(long)]
        dataset: Option<String>,
        /// Only the first this many validation chunks.
        #[arg(long)]
        chunks: Option<usize>,
        #[command(flatten)]
        common: Common,
    },
    /// Show a model's routers: per read site the slots and their mean weights, the detail mass
    /// p_D, the entropy and the detail bias; writes routing.json and the heatmap (SVG, PNG).
    Inspect {
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
        common: Common,
    },
    /// Generate text from a model.
    Sample {
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
        common: Common,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Sweep {
            study,
            common,
            overrides,
            shard,
            dry_run,
            jobs,
            devices,
        } => {
            let backend = common.backend()?;
            let (study, mut runs) = plan(&study, &overrides)?;
            let all = runs.clone();
            if let Some(shard) = shard {
                runs = shard_runs(runs, parse_shard(&shard)?);
            }
            let study_dir = common.runs_dir.join(&study.name);
            if dry_run {
                for run in &runs {
                    println!(
                        "{}\t{}",
                        run.name,
                        serde_json::to_string(&run.config).expect("json")
                    );
                }
                return Ok(());
            }
            let job = SweepJob {
                runs,
                study_dir: study_dir.clone(),
                paths: common.paths(),
                progress: !common.quiet,
                stop_after: None,
                jobs: jobs.unwrap_or_else(|| default_jobs(backend)),
                devices: devices.devices,
            };
            let statuses = dispatch(backend, job)?;
            let count =
                |wanted: fn(&RunStatus) -> bool| statuses.iter().filter(|(_, s)| wanted(s)).count();
            let trained = count(|s| matches!(s, RunStatus::Trained(_)));
            let locked = count(|s| matches!(s, RunStatus::Locked(_)));
            eprintln!(
                "{trained} runs trained, {} finished earlier, {locked} being trained by other processes",
                statuses.len() - trained - locked
            );
            let written = report::write_report(&study, &all, &study_dir)?;
            println!("report: {}", written.display());
            Ok(())
        }
        Command::Report {
            study,
            common,
            overrides,
        } => {
            let (study, runs) = plan(&study, &overrides)?;
            let written = report::write_report(&study, &runs, &common.runs_dir.join(&study.name))?;
            println!("report: {}", written.display());
            Ok(())
        }
        Command::Train {
            run_dir,
            study,
            config,
            common,
            overrides,
            devices,
        } => {
            let config = match config {
                Some(path) => load_run_config(&path, &overrides.overrides()?)?,
                None => {
                    let (_, runs) = plan(&study, &overrides)?;
                    let first = runs.into_iter().next();
                    first.expect("a study has at least one run").config
                }
            };
            let job = SingleRunJob {
                config,
                run_dir,
                paths: common.paths(),
                progress: !common.quiet,
                devices: devices.devices,
            };
            match dispatch(common.backend()?, job)? {
                Outcome::Finished(summary) => println!(
                    "best validation loss {:.4} at step {} ({:.0} tokens/s)",
                    summary.best_val_loss, summary.best_step, summary.tokens_per_s
                ),
                Outcome::Stopped { step } => println!("stopped at step {step}"),
            }
            Ok(())
        }
        Command::Eval {
            model,
            dataset,
            chunks,
            common,
        } => {
            let job = EvalJob {
                source: ModelSource::resolve(&model)?,
                dataset,
                chunks,
                paths: common.paths(),
            };
            let (loss, chunks) = dispatch(common.backend()?, job)?;
            println!(
                "validation loss {loss:.4} (perplexity {:.2}) over {chunks} chunks",
                loss.exp()
            );
            Ok(())
        }
        Command::Inspect {
            model,
            prompt,
            tokenizer,
            chunks,
            out,
            common,
        } => {
            let inspected = Inspected::resolve(&model)?;
            let job = InspectJob {
                out: out.unwrap_or_else(|| inspected.default_out()),
                inspected,
                prompt,
                tokenizer,
                chunks,
                paths: common.paths(),
            };
            let inspection = dispatch(common.backend()?, job)?;
            println!("{}", inspection.table);
            if let Some(per_token) = &inspection.per_token {
                println!("{per_token}");
            }
            for file in &inspection.files {
                println!("wrote {}", file.display());
            }
            Ok(())
        }
        Command::Sample {
            model,
            prompt,
            tokens,
            temperature,
            top_k,
            seed,
            common,
        } => {
            let job = SampleJob {
                source: ModelSource::resolve(&model)?,
                prompt: prompt.clone(),
                tokens,
                temperature,
                top_k,
                seed,
            };
            let text = dispatch(common.backend()?, job)?;
            println!("{prompt}{text}");
            Ok(())
        }
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
    match backend {
        BackendKind::Flex | BackendKind::Ndarray => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        BackendKind::Wgpu | BackendKind::Cuda => 1,
    }
}
