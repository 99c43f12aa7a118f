//! The learner loop (tab:reprotrain): fixed step budget, AdamW with the paper's decay groups and
//! global clipping, a validation pass on a fixed grid with the best-so-far endpoint (eq:endpoint),
//! atomic checkpoints and exact resumption.

use haares_core::TrainingBackend;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::Backend;
use haares_core::{HaaresModel, ModelConfig};
use haares_data::batching::BatchIterator;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::data::RunData;
use crate::error::{Result, TrainError, write_atomically};
use crate::loss::{Validation, validate, validation_pass};
use crate::metrics::{MetricsLine, MetricsLog, RoutingLine, StepLog, peak_memory_bytes};
use crate::optim::AdamW;
use crate::parallel::{Replica, Stepped};
use crate::replicas::{Schedule, run_replicated};
use crate::run_checkpoint::{self, LoopState, best_of};

/// Burn backends seed one process-wide generator: seeding and initialising under one lock keeps
/// a model's initial weights a function of its seed alone, also when tests run in parallel.
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// A model of `config` initialised from `seed`.
pub fn init_model<B: Backend>(
    config: &ModelConfig,
    seed: u64,
    device: &B::Device,
) -> Result<HaaresModel<B>> {
    let _guard = INIT_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    B::seed(device, seed);
    Ok(config.init::<B>(device)?)
}

/// How a call to [`train`] behaves beyond the config.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Show a progress bar.
    pub progress: bool,
    /// Return after this step without a final checkpoint, as if the process were killed there
    /// (resumption tests and time-sliced schedulers).
    pub stop_after: Option<usize>,
    /// Label shown in the progress bar.
    pub label: String,
    /// Where the progress bar is drawn when several runs train at once.
    pub bars: Option<indicatif::MultiProgress>,
}

/// What a finished run leaves in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run's config.
    pub config: RunConfig,
    /// Vocabulary size of the tokeniser.
    pub vocab_size: usize,
    /// Trainable parameters (every tensor).
    pub parameters: usize,
    /// Steps trained.
    pub steps: usize,
    /// Best validation loss on the grid (eq:endpoint).
    pub best_val_loss: f64,
    /// Step of the best validation loss.
    pub best_step: usize,
    /// Every validation pass, `(step, loss)`.
    pub val_curve: Vec<(usize, f64)>,
    /// Training target tokens per second from step 0 (startup included, validation excluded).
    pub tokens_per_s: f64,
    /// Training seconds.
    pub train_seconds: f64,
    /// The backend that ran it.
    pub backend: String,
}

/// How a call to [`train`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The budget is done; the summary is written.
    Finished(Box<RunSummary>),
    /// Stopped early by [`TrainOptions::stop_after`].
    Stopped {
        /// Last completed step.
        step: usize,
    },
}

/// The routing log of a run: one line per validation pass (routed methods only).
pub fn routing_path(run_dir: &Path) -> std::path::PathBuf {
    run_dir.join("routing.jsonl")
}

/// The summary file of a finished run.
pub fn summary_path(run_dir: &Path) -> std::path::PathBuf {
    run_dir.join("summary.json")
}

/// Trains `config` on `data` in `run_dir`, resuming from its last checkpoint if there is one.
pub fn train<B: TrainingBackend>(
    config: &RunConfig,
    data: &RunData,
    run_dir: &Path,
    backend: &str,
    device: &B::Device,
    options: &TrainOptions,
) -> Result<Outcome> {
    train_on::<B>(
        config,
        data,
        run_dir,
        backend,
        std::slice::from_ref(device),
        options,
    )
}

/// [`train`] with one replica per device, data-parallel ([`crate::parallel`]): the same run,
/// batch and data order as on one device, to float rounding. The first device validates, logs
/// and checkpoints.
pub fn train_on<B: TrainingBackend>(
    config: &RunConfig,
    data: &RunData,
    run_dir: &Path,
    backend: &str,
    devices: &[B::Device],
    options: &TrainOptions,
) -> Result<Outcome> {
    config.validate()?;
    let Some(device) = devices.first() else {
        return Err(TrainError::Config("no device to train on".into()));
    };
    Replica::check_batch(devices.len(), config.batch_size)?;
    std::fs::create_dir_all(run_dir).map_err(|e| TrainError::io(run_dir, e))?;
    // One writer per run: held until this function returns, whatever it returns.
    let _lock = crate::run_lock::RunLock::acquire(run_dir)?;
    let vocab = data.tokenizer.vocab_size();
    let model_config = config.model_config(vocab)?;
    let config_path = run_dir.join("config.json");
    if let Some(saved) = saved_run_config(&config_path)?
        && &saved != config
    {
        return Err(TrainError::Checkpoint(format!(
            "`{}` belongs to a run with another configuration ({}); resume with the same settings, \
             or choose another run directory",
            run_dir.display(),
            run_checkpoint::config_difference(&saved, config)
        )));
    }
    if !config_path.exists() {
        let json = serde_json::json!({ "run": config, "model": model_config });
        write_atomically(
            &config_path,
            &serde_json::to_vec_pretty(&json).expect("json"),
        )?;
        data.tokenizer.save(&run_dir.join("tokenizer.json"))?;
    }

    let (model, optimizer, state) = match run_checkpoint::latest(run_dir) {
        Some(dir) => {
            let loaded = run_checkpoint::load::<B>(&dir, config, device)?;
            (loaded.model, loaded.optimizer, loaded.state)
        }
        None => {
            let model = init_model::<B>(&model_config, config.model_seed, device)?;
            let state = LoopState {
                step: 0,
                optimizer_steps: 0,
                data_position: BatchIterator::new(
                    &data.train,
                    config.batch_size,
                    config.data_seed,
                )?
                .position(),
                val_curve: Vec::new(),
                train_seconds: 0.0,
                config: config.clone(),
            };
            (model, AdamW::new(config.optimizer), state)
        }
    };
    let (saved, expected) = (
        serde_json::to_value(&model.config),
        serde_json::to_value(&model_config),
    );
    if saved.ok() != expected.ok() {
        return Err(TrainError::Checkpoint(format!(
            "the checkpoint's model ({} model, {} layers, d = {}, {} ids) is not the model of this \
             run ({}, {} layers, d = {}, {vocab} ids); delete the run directory to start afresh",
            model.config.method.name(),
            model.config.n_layers,
            model.config.d_model,
            model.config.vocab_size,
            model_config.method.name(),
            model_config.n_layers,
            model_config.d_model,
        )));
    }
    let learner = LearnerLoop {
        config,
        data,
        run_dir,
        backend,
        device,
        options,
        routed: model_config.method.is_routed(),
        vocab,
    };
    if devices.len() == 1 {
        return learner.run(model, optimizer, state, Replica::SOLE);
    }
    let last = match options.stop_after {
        Some(stop) if stop > state.step && stop < config.steps => stop,
        _ => config.steps,
    };
    let schedule = Schedule {
        train: &data.train,
        position: state.data_position,
        steps: state.step..last,
        seq_len: config.seq_len,
    };
    run_replicated(
        devices,
        schedule,
        model,
        optimizer,
        |model, optimizer, replica| learner.run(model, optimizer, state, replica),
    )
}

/// The learner loop of replica 0, with what it needs beside the model and the optimizer.
struct LearnerLoop<'a, B: TrainingBackend> {
    config: &'a RunConfig,
    data: &'a RunData,
    run_dir: &'a Path,
    backend: &'a str,
    device: &'a B::Device,
    options: &'a TrainOptions,
    routed: bool,
    vocab: usize,
}

impl<B: TrainingBackend> LearnerLoop<'_, B> {
    /// Steps to the end of the budget (or [`TrainOptions::stop_after`]): validation on the grid,
    /// logs, the best model, checkpoints, and the summary at the end.
    fn run(
        &self,
        mut model: HaaresModel<B>,
        mut optimizer: AdamW<B::InnerBackend>,
        mut state: LoopState,
        replica: Replica,
    ) -> Result<Outcome> {
        let Self {
            config,
            data,
            run_dir,
            backend,
            device,
            options,
            routed,
            vocab,
        } = *self;
        let mut batches = BatchIterator::restore(&data.train, state.data_position)?;
        let mut metrics = MetricsLog::open(&run_dir.join("metrics.jsonl"), state.step)?;
        let mut routing_log = routed
            .then(|| StepLog::<RoutingLine>::open(&routing_path(run_dir), state.step))
            .transpose()?;
        let bar = progress_bar(options, config.steps, state.step);

        let (mut interval_loss, mut interval_steps) = (0.0, 0usize);
        let mut interval_seconds = 0.0;
        while state.step < config.steps {
            let started = Instant::now();
            let batch = batches.next_batch();
            let stepped =
                replica.step(&mut model, &mut optimizer, &batch, config.seq_len, device)?;
            let Stepped::Updated { loss: value, stats } = stepped else {
                bar.abandon();
                return Err(TrainError::NonFinite {
                    step: state.step + 1,
                    run_dir: run_dir.to_path_buf(),
                });
            };
            state.step += 1;
            let seconds = started.elapsed().as_secs_f64();
            state.train_seconds += seconds;
            interval_seconds += seconds;
            (interval_loss, interval_steps) = (interval_loss + value, interval_steps + 1);

            let last = state.step == config.steps;
            let evaluate = state.step.is_multiple_of(config.eval_every) || last;
            let validation = evaluate.then(|| {
                let valid = model.valid();
                let pass = validation_pass(&data.validation, config.batch_size, config.val_chunks);
                validate(&valid, pass, config.seq_len, device, routing_log.is_some())
            });
            let val_loss = validation.as_ref().map(|v| v.loss);
            if let Some(loss) = val_loss {
                state.val_curve.push((state.step, loss));
            }
            if let (
                Some(log),
                Some(Validation {
                    loss,
                    routing: Some(routing),
                }),
            ) = (routing_log.as_mut(), validation)
            {
                log.write(&RoutingLine {
                    step: state.step,
                    val_loss: loss,
                    routing,
                })?;
            }
            if state.step.is_multiple_of(config.log_every) || last || val_loss.is_some() {
                let train_loss = interval_loss / interval_steps.max(1) as f64;
                let tokens_per_s =
                    (interval_steps * config.tokens_per_step()) as f64 / interval_seconds.max(1e-9);
                metrics.write(&MetricsLine {
                    step: state.step,
                    train_loss: Some(train_loss),
                    grad_norm: Some(stats.grad_norm),
                    val_loss,
                    tokens_per_s: Some(tokens_per_s),
                    elapsed_s: state.train_seconds,
                    peak_memory_bytes: peak_memory_bytes(),
                })?;
                bar.set_message(format!(
                    "loss {train_loss:.4}{} | {tokens_per_s:.0} tok/s",
                    best_of(&state.val_curve)
                        .map(|(_, l)| format!(" | best val {l:.4}"))
                        .unwrap_or_default(),
                ));
                (interval_loss, interval_steps, interval_seconds) = (0.0, 0, 0.0);
            }
            bar.set_position(state.step as u64);
            if let Some((best_step, _)) = best_of(&state.val_curve)
                && best_step == state.step
                && val_loss.is_some()
            {
                model.save_safetensors(run_dir.join("best-model.safetensors"))?;
            }
            if state.step.is_multiple_of(config.checkpoint_every) || last {
                state.optimizer_steps = optimizer.steps;
                state.data_position = batches.position();
                run_checkpoint::save(run_dir, &model, &optimizer, &state)?;
            }
            if options.stop_after == Some(state.step) && !last {
                bar.abandon();
                return Ok(Outcome::Stopped { step: state.step });
            }
        }
        bar.finish();
        let (best_step, best_val_loss) = state.best().unwrap_or((0, f64::NAN));
        let summary = RunSummary {
            config: config.clone(),
            vocab_size: vocab,
            parameters: model.num_params(),
            steps: state.step,
            best_val_loss,
            best_step,
            val_curve: state.val_curve.clone(),
            tokens_per_s: (state.step * config.tokens_per_step()) as f64
                / state.train_seconds.max(1e-9),
            train_seconds: state.train_seconds,
            backend: backend.to_string(),
        };
        write_atomically(
            &summary_path(run_dir),
            &serde_json::to_vec_pretty(&summary).expect("summary serialises"),
        )?;
        Ok(Outcome::Finished(Box::new(summary)))
    }
}

/// The run config stored in a run's `config.json`, if the file exists.
pub fn saved_run_config(path: &Path) -> Result<Option<RunConfig>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TrainError::io(path, e)),
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| TrainError::Checkpoint(format!("`{}` is not JSON: {e}", path.display())))?;
    serde_json::from_value(value["run"].clone())
        .map(Some)
        .map_err(|e| {
            TrainError::Checkpoint(format!("`{}` holds no run config: {e}", path.display()))
        })
}

fn progress_bar(options: &TrainOptions, steps: usize, done: usize) -> ProgressBar {
    if !options.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps as u64).with_position(done as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(options.label.clone());
    match &options.bars {
        Some(bars) => bars.add(bar),
        None => bar,
    }
}
