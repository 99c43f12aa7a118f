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

use crate::config::RunConfig;
use crate::data::RunData;
use crate::error::{Result, TrainError, write_atomically};
use crate::run::checkpoint::{self, LoopState, best_of};
use crate::run::data_parallel::{Schedule, run_replicated};
use crate::run::loss::{Validation, validate, validation_pass};
use crate::run::metrics::{MetricsLine, MetricsLog, RoutingLine, StepLog, peak_memory_bytes};
use crate::run::optim::AdamW;
use crate::run::step::{Replica, Stepped};
use crate::run::summary::{RunSummary, summary_path};

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

/// [`train`] with one replica per device, data-parallel ([`crate::run::data_parallel`]): the same
/// run, batch and data order as on one device, to float rounding. The first device validates, logs
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
    let _lock = crate::run::lock::RunLock::acquire(run_dir)?;
    let vocab = data.tokenizer.vocab_size();
    let model_config = config.model_config(vocab)?;
    claim_run_dir(config, &model_config, data, run_dir)?;
    let (model, optimizer, state) =
        start_or_resume::<B>(config, &model_config, data, run_dir, device)?;
    let learner = LearnerLoop {
        config,
        data,
        run_dir,
        backend,
        device,
        device_names: devices.iter().map(|d| format!("{d:?}")).collect(),
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

/// Refuses a run directory that belongs to another configuration; in a new one, writes the run's
/// `config.json` and `tokenizer.json`.
fn claim_run_dir(
    config: &RunConfig,
    model_config: &ModelConfig,
    data: &RunData,
    run_dir: &Path,
) -> Result<()> {
    let config_path = run_dir.join("config.json");
    if let Some(saved) = saved_run_config(&config_path)?
        && &saved != config
    {
        return Err(TrainError::Checkpoint(format!(
            "`{}` belongs to a run with another configuration ({}); resume with the same settings, \
             or choose another run directory",
            run_dir.display(),
            checkpoint::config_difference(&saved, config)
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
    Ok(())
}

/// The model, optimizer and loop state of the run's last checkpoint, or fresh ones; a checkpoint
/// whose model is not `model_config`'s is refused.
fn start_or_resume<B: TrainingBackend>(
    config: &RunConfig,
    model_config: &ModelConfig,
    data: &RunData,
    run_dir: &Path,
    device: &B::Device,
) -> Result<(HaaresModel<B>, AdamW<B::InnerBackend>, LoopState)> {
    let (model, optimizer, state) = match checkpoint::latest(run_dir) {
        Some(dir) => {
            let loaded = checkpoint::load::<B>(&dir, config, device)?;
            (loaded.model, loaded.optimizer, loaded.state)
        }
        None => {
            let model = init_model::<B>(model_config, config.model_seed, device)?;
            let batches = BatchIterator::new(&data.train, config.batch_size, config.data_seed)?;
            let state = LoopState {
                step: 0,
                optimizer_steps: 0,
                data_position: batches.position(),
                val_curve: Vec::new(),
                train_seconds: 0.0,
                config: config.clone(),
            };
            (model, AdamW::new(config.optimizer), state)
        }
    };
    let (saved, expected) = (
        serde_json::to_value(&model.config),
        serde_json::to_value(model_config),
    );
    if saved.ok() != expected.ok() {
        let describe = |c: &ModelConfig| {
            format!(
                "{} model, {} layers, d = {}, {} ids",
                c.method.name(),
                c.n_layers,
                c.d_model,
                c.vocab_size
            )
        };
        return Err(TrainError::Checkpoint(format!(
            "the checkpoint's model ({}) is not the model of this run ({}); delete the run \
             directory to start afresh",
            describe(&model.config),
            describe(model_config),
        )));
    }
    Ok((model, optimizer, state))
}

/// The learner loop of replica 0, with what it needs beside the model and the optimizer.
struct LearnerLoop<'a, B: TrainingBackend> {
    config: &'a RunConfig,
    data: &'a RunData,
    run_dir: &'a Path,
    backend: &'a str,
    device: &'a B::Device,
    /// Every device the run trains on, for its summary.
    device_names: Vec<String>,
    options: &'a TrainOptions,
    routed: bool,
    vocab: usize,
}

/// The learner's logs, and the training loss and time since the last metrics line.
struct Logs {
    metrics: MetricsLog,
    routing: Option<StepLog<RoutingLine>>,
    bar: ProgressBar,
    interval_loss: f64,
    interval_steps: usize,
    interval_seconds: f64,
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
        let (config, run_dir) = (self.config, self.run_dir);
        let mut batches = BatchIterator::restore(&self.data.train, state.data_position)?;
        let mut logs = self.open_logs(state.step)?;
        while state.step < config.steps {
            let started = Instant::now();
            let batch = batches.next_batch();
            let stepped = replica
                .step(
                    &mut model,
                    &mut optimizer,
                    &batch,
                    config.seq_len,
                    self.device,
                    |_| Ok(()),
                )
                .map_err(|error| error.at_step(state.step + 1))?;
            let Stepped::Updated { loss, stats } = stepped else {
                logs.bar.abandon();
                return Err(TrainError::NonFinite {
                    step: state.step + 1,
                    run_dir: run_dir.to_path_buf(),
                });
            };
            state.step += 1;
            let seconds = started.elapsed().as_secs_f64();
            state.train_seconds += seconds;
            logs.interval_seconds += seconds;
            (logs.interval_loss, logs.interval_steps) =
                (logs.interval_loss + loss, logs.interval_steps + 1);
            let last = state.step == config.steps;
            let val_loss = self.validate_on_grid(&model, &mut state, &mut logs, last)?;
            if state.step.is_multiple_of(config.log_every) || last || val_loss.is_some() {
                self.log_metrics(&mut logs, &state, stats.grad_norm, val_loss)?;
            }
            logs.bar.set_position(state.step as u64);
            if let Some((best_step, _)) = best_of(&state.val_curve)
                && best_step == state.step
                && val_loss.is_some()
            {
                model.save_safetensors(run_dir.join("best-model.safetensors"))?;
            }
            if state.step.is_multiple_of(config.checkpoint_every) || last {
                state.optimizer_steps = optimizer.steps;
                state.data_position = batches.position();
                checkpoint::save(run_dir, &model, &optimizer, &state)?;
            }
            if self.options.stop_after == Some(state.step) && !last {
                logs.bar.abandon();
                return Ok(Outcome::Stopped { step: state.step });
            }
        }
        logs.bar.finish();
        self.finish(&model, &state)
    }

    /// The metrics and routing logs, kept through step `done`, and the progress bar.
    fn open_logs(&self, done: usize) -> Result<Logs> {
        let routing = self
            .routed
            .then(|| StepLog::<RoutingLine>::open(&routing_path(self.run_dir), done))
            .transpose()?;
        Ok(Logs {
            metrics: MetricsLog::open(&self.run_dir.join("metrics.jsonl"), done)?,
            routing,
            bar: progress_bar(self.options, self.config.steps, done),
            interval_loss: 0.0,
            interval_steps: 0,
            interval_seconds: 0.0,
        })
    }

    /// On the validation grid (and at the last step): the validation loss, added to the curve,
    /// and the routing statistics of the same pass, logged.
    fn validate_on_grid(
        &self,
        model: &HaaresModel<B>,
        state: &mut LoopState,
        logs: &mut Logs,
        last: bool,
    ) -> Result<Option<f64>> {
        let config = self.config;
        if !(state.step.is_multiple_of(config.eval_every) || last) {
            return Ok(None);
        }
        let valid = model.valid();
        let pass = validation_pass(&self.data.validation, config.batch_size, config.val_chunks);
        let Validation { loss, routing } = validate(
            &valid,
            pass,
            config.seq_len,
            self.device,
            logs.routing.is_some(),
        );
        state.val_curve.push((state.step, loss));
        if let (Some(log), Some(routing)) = (logs.routing.as_mut(), routing) {
            log.write(&RoutingLine {
                step: state.step,
                val_loss: loss,
                routing,
            })?;
        }
        Ok(Some(loss))
    }

    /// One metrics line: the interval's mean training loss and throughput, then a fresh interval.
    fn log_metrics(
        &self,
        logs: &mut Logs,
        state: &LoopState,
        grad_norm: f64,
        val_loss: Option<f64>,
    ) -> Result<()> {
        let train_loss = logs.interval_loss / logs.interval_steps.max(1) as f64;
        let tokens = logs.interval_steps * self.config.tokens_per_step();
        let tokens_per_s = tokens as f64 / logs.interval_seconds.max(1e-9);
        logs.metrics.write(&MetricsLine {
            step: state.step,
            train_loss: Some(train_loss),
            grad_norm: Some(grad_norm),
            val_loss,
            tokens_per_s: Some(tokens_per_s),
            elapsed_s: state.train_seconds,
            peak_memory_bytes: peak_memory_bytes(),
        })?;
        logs.bar.set_message(format!(
            "loss {train_loss:.4}{} | {tokens_per_s:.0} tok/s",
            best_of(&state.val_curve)
                .map(|(_, l)| format!(" | best val {l:.4}"))
                .unwrap_or_default(),
        ));
        (
            logs.interval_loss,
            logs.interval_steps,
            logs.interval_seconds,
        ) = (0.0, 0, 0.0);
        Ok(())
    }

    /// Writes the finished run's `summary.json`.
    fn finish(&self, model: &HaaresModel<B>, state: &LoopState) -> Result<Outcome> {
        let config = self.config;
        let (best_step, best_val_loss) = state.best().unwrap_or((0, f64::NAN));
        let summary = RunSummary {
            config: config.clone(),
            vocab_size: self.vocab,
            parameters: model.num_params(),
            steps: state.step,
            best_val_loss,
            best_step,
            val_curve: state.val_curve.clone(),
            tokens_per_s: (state.step * config.tokens_per_step()) as f64
                / state.train_seconds.max(1e-9),
            train_seconds: state.train_seconds,
            backend: self.backend.to_string(),
            devices: self.device_names.clone(),
            products: <B as haares_core::ops::MatmulBackend>::product_kernels(),
        };
        write_atomically(
            &summary_path(self.run_dir),
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
