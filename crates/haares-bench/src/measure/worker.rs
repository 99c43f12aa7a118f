//! One measurement of the cost protocol, run in its own process (`haares-bench cost-worker`) so
//! that its startup, its peak memory and its allocator state belong to it alone.

use haares_core::TrainingBackend;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use haares_base::SplitMix64;
use haares_core::{HaaresModel, ModelConfig};
use haares_data::batching::Batch;
use haares_train::backend::{BackendJob, BackendKind};
use haares_train::run::learner::init_model;
use haares_train::run::loss::validate;
use haares_train::run::metrics::peak_memory_bytes;
use haares_train::run::optim::{AdamW, AdamWSettings};
use haares_train::run::step::{Replica, Stepped};
use serde::{Deserialize, Serialize};

use crate::measure::device_memory::DeviceMemory;
use crate::measure::heartbeat::Heartbeat;
use crate::measure::phases::{Anatomy, AnatomyRecorder, Phase, StepTimes};
use crate::method_choice::MethodChoice;

/// What a worker process measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WorkerTask {
    /// `steps` training steps of one method from a fresh process.
    Train(TrainTask),
    /// The initial and a perturbed model, with our logits, for the PyTorch peer.
    Export(crate::measure::export::ExportTask),
    /// The best of `reps` square `n × n` matrix products (the GEMM peak).
    Gemm {
        /// Matrix size.
        n: usize,
        /// Timed repetitions after one warm-up.
        reps: usize,
    },
}

/// What a training worker logs of each kernel launch on a cube backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KernelLog {
    /// Nothing: the step times are the device's own.
    #[default]
    Off,
    /// Every launch, counted by kernel.
    Launches,
    /// Every launch with its device time: each kernel then runs alone, so the step's wall time
    /// is no longer its real one.
    Times,
}

/// A worker's answer, printed as one JSON line after [`RESULT_PREFIX`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WorkerResult {
    /// See [`TrainSample`] (boxed: its kernel tallies make it far larger than the others).
    Train(Box<TrainSample>),
    /// Best GEMM rate in FLOP/s.
    Gemm {
        /// 2n³ / fastest repetition.
        flops_per_s: f64,
    },
    /// The export's files are written.
    Exported,
}

/// One method's run of K steps from a fresh process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainSample {
    /// Method name.
    pub method: MethodChoice,
    /// Seconds from the worker's start to the model and optimizer being ready (backend start-up
    /// and initialisation).
    pub startup_s: f64,
    /// Seconds from the worker's start to the end of step K (the paper's window: from step zero,
    /// start-up included).
    pub total_s: f64,
    /// Wall time of every step, each ending with the loss and the update read back.
    pub step_s: Vec<f64>,
    /// Peak resident set size of the worker (Linux VmHWM).
    pub peak_rss_bytes: Option<u64>,
    /// Most heap bytes allocated at once in the worker ([`crate::measure::heap`]); `None` where the
    /// counting allocator is not installed (runs recorded before it existed).
    #[serde(default)]
    pub peak_allocated_bytes: Option<u64>,
    /// Largest device bytes in use seen at the sampling points (after the forward, after the
    /// update); GPU backends only.
    pub device_in_use_bytes: Option<u64>,
    /// Largest device bytes reserved by the allocator; GPU backends only.
    pub device_reserved_bytes: Option<u64>,
    /// Where the time of the worker's start and of every step went ([`crate::measure::phases`]);
    /// `None` in runs recorded before it existed.
    #[serde(default)]
    pub anatomy: Option<Anatomy>,
    /// Validation batches timed without and with routing statistics (routed methods only;
    /// `None` in runs recorded before it existed).
    #[serde(default)]
    pub validation: Option<ValidationCost>,
    /// Loss of the first and of the last step (a sanity check that training happened).
    pub first_loss: f64,
    /// See `first_loss`.
    pub last_loss: f64,
    /// Every operation's time over the steps the task asked to record, summed.
    #[serde(default)]
    pub operations: Option<Vec<haares_core::op_times::OpTime>>,
    /// The matrix products' time by shape over the same steps, summed (both passes).
    #[serde(default)]
    pub products: Option<Vec<haares_core::op_times::ProductTime>>,
    /// The kernels of the matrix products (`MatmulBackend::product_kernels`: on CUDA the
    /// process's provider); empty in runs recorded before it existed.
    #[serde(default)]
    pub product_kernels: String,
}

/// Seconds of single validation batches of the learner's validation pass ([`validate`]), timed
/// alternately without and with the routing statistics the learner logs (`routing.jsonl`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ValidationCost {
    /// Loss only.
    pub plain_s: Vec<f64>,
    /// Loss and routing statistics, from the same forward pass.
    pub with_routing_s: Vec<f64>,
}

/// A training task: the model, the method, the batch and the steps, and what the worker records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainTask {
    /// The model.
    pub config: ModelConfig,
    /// The method, with the routing path it is pinned to (its name goes into the report).
    pub method: MethodChoice,
    /// Rows per batch.
    pub batch: usize,
    /// Context length.
    pub seq: usize,
    /// Steps K.
    pub steps: usize,
    /// What the worker logs of every kernel launch on a cube backend (counting launches slows
    /// the host side and timing them serialises the device, so timing workers log neither).
    #[serde(default)]
    pub kernel_log: KernelLog,
    /// The first step whose operations are timed ([`haares_core::op_times`]), through the last;
    /// `None`: none are.
    #[serde(default)]
    pub record_operations_from: Option<usize>,
}

/// The marker in front of a worker's JSON answer on its stdout.
pub const RESULT_PREFIX: &str = "HAARES-COST-RESULT ";

impl WorkerTask {
    /// What the worker logs of each kernel launch.
    pub fn kernel_log(&self) -> KernelLog {
        match self {
            WorkerTask::Train(task) => task.kernel_log,
            _ => KernelLog::Off,
        }
    }
}

/// Runs `task` on backend `B` (through [`haares_train::backend::dispatch`]).
pub struct Worker {
    /// The task.
    pub task: WorkerTask,
    /// When the worker process started.
    pub started: Instant,
}

impl BackendJob for Worker {
    type Output = WorkerResult;
    fn run<B: TrainingBackend>(
        self,
        device: B::Device,
        backend: BackendKind,
    ) -> haares_train::Result<WorkerResult> {
        Ok(match self.task {
            WorkerTask::Gemm { n, reps } => WorkerResult::Gemm {
                flops_per_s: gemm_rate::<B::InnerBackend>(n, reps, &device),
            },
            WorkerTask::Export(export) => {
                export.run::<B>(&device)?;
                WorkerResult::Exported
            }
            WorkerTask::Train(task) => {
                WorkerResult::Train(Box::new(train::<B>(task, &device, backend, self.started)?))
            }
        })
    }
}

/// Trains `task` from a fresh model on `device`, timing every step and phase, and the worker's
/// start since `started`.
fn train<B: TrainingBackend>(
    task: TrainTask,
    device: &B::Device,
    backend: BackendKind,
    started: Instant,
) -> haares_train::Result<TrainSample> {
    let method = task.method;
    let mut recorder = AnatomyRecorder::start();
    let heartbeat = Heartbeat::start(method.to_string(), "backend start", HEARTBEAT);
    let (mut trainer, backend_start_s) =
        start_up::<B>(&task, device, started, &mut recorder, &heartbeat)?;
    let mut memory = DeviceMemory::new(backend);
    let startup_s = started.elapsed().as_secs_f64();
    eprintln!("  {method}: backend up in {backend_start_s:.1} s, model ready at {startup_s:.1} s");
    let (mut step_s, mut losses) = (Vec::with_capacity(task.steps), Vec::new());
    heartbeat.enter("first step: forward");
    let mut heartbeat = Some(heartbeat);
    for step in 0..task.steps {
        if task.record_operations_from == Some(step) {
            haares_core::op_times::start_recording();
        }
        let step_start = Instant::now();
        let times = trainer.step(|phase| {
            if phase == Phase::Forward {
                memory.sample();
            }
            recorder.mark_phase(step, phase);
            if let (Some(heartbeat), Some(next)) = (&heartbeat, phase.next()) {
                heartbeat.enter(format!("first step: {}", next.name()));
            }
        })?;
        memory.sample();
        step_s.push(step_start.elapsed().as_secs_f64());
        losses.push(times.loss);
        recorder.record_step(times);
        if step == 0 {
            heartbeat = None;
            // On a GPU the first step compiles and autotunes the kernels: minutes
            // where the live log would otherwise be silent.
            eprintln!("  {method}: first step {}", recorder.first_step_line());
        }
    }
    let operations = task
        .record_operations_from
        .map(|_| haares_core::op_times::stop_recording());
    let products = operations
        .as_ref()
        .map(|_| haares_core::op_times::take_products());
    let validation = task
        .config
        .method
        .is_routed()
        .then(|| trainer.validation_cost(VALIDATION_REPEATS));
    Ok(TrainSample {
        method,
        validation,
        startup_s,
        total_s: started.elapsed().as_secs_f64(),
        step_s,
        peak_rss_bytes: peak_memory_bytes(),
        peak_allocated_bytes: crate::measure::heap::peak_allocated_bytes(),
        device_in_use_bytes: memory.in_use,
        device_reserved_bytes: memory.reserved,
        anatomy: Some(recorder.finish()),
        first_loss: losses.first().copied().unwrap_or(f64::NAN),
        last_loss: losses.last().copied().unwrap_or(f64::NAN),
        operations,
        products,
        product_kernels: <B as haares_core::ops::MatmulBackend>::product_kernels(),
    })
}

/// Starts the backend and builds the task's model for its batches, each timed
/// into `recorder`; the trainer and the seconds from the worker's start (`started`) to the
/// backend's.
fn start_up<B: TrainingBackend>(
    task: &TrainTask,
    device: &B::Device,
    started: Instant,
    recorder: &mut AnatomyRecorder,
    heartbeat: &Heartbeat,
) -> haares_train::Result<(Trainer<B>, f64)> {
    start_backend::<B>(device)?;
    let backend_start_s = started.elapsed().as_secs_f64();
    recorder.mark_start(backend_start_s);
    heartbeat.enter("model init");
    let init_start = Instant::now();
    let trainer = Trainer::<B>::new(&task.config, task.batch, task.seq, device)?;
    sync::<B>(device)?;
    recorder.mark_init(init_start.elapsed().as_secs_f64());
    Ok((trainer, backend_start_s))
}

/// How often a worker says where its silent start and first step are.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(15);

/// Timed validation batches per mode, after one untimed batch of each.
const VALIDATION_REPEATS: usize = 6;

/// A model, its optimizer and a source of batches: one training step of the learner (forward,
/// masked cross-entropy, backward, clipped AdamW update), as the cost protocol and the criterion
/// benchmarks time it.
pub struct Trainer<B: TrainingBackend> {
    model: HaaresModel<B>,
    optimizer: AdamW<B::InnerBackend>,
    rng: SplitMix64,
    batch: usize,
    seq: usize,
    device: B::Device,
}

impl<B: TrainingBackend> Trainer<B> {
    /// A model of `config` (model seed 42) with a fresh optimizer (the paper's AdamW settings).
    pub fn new(
        config: &ModelConfig,
        batch: usize,
        seq: usize,
        device: &B::Device,
    ) -> haares_train::Result<Self> {
        Ok(Self {
            model: init_model::<B>(config, 42, device)?,
            optimizer: AdamW::new(AdamWSettings::default()),
            rng: SplitMix64::new(2026),
            batch,
            seq,
            device: device.clone(),
        })
    }

    /// One step of the learner ([`Replica::step`]) on a fresh random batch, its phases timed
    /// apart: the forward pass ends with the loss read back, the backward pass and the update
    /// each with a device sync. `at_end` runs after each phase, outside its timing (a memory
    /// sampling point, a kernel tally).
    pub fn step(&mut self, mut at_end: impl FnMut(Phase)) -> haares_train::Result<StepTimes> {
        let vocab = self.model.config.vocab_size;
        let mut start = Instant::now();
        let batch = random_batch(&mut self.rng, self.batch, self.seq, vocab);
        let mut phase_s = [0.0; 3];
        let device = &self.device;
        let stepped = Replica::SOLE.step(
            &mut self.model,
            &mut self.optimizer,
            &batch,
            self.seq,
            device,
            |phase| {
                if phase != Phase::Forward {
                    sync::<B>(device)?;
                }
                phase_s[phase.index()] = start.elapsed().as_secs_f64();
                at_end(phase);
                start = Instant::now();
                Ok(())
            },
        )?;
        match stepped {
            Stepped::Updated { loss, .. } => Ok(StepTimes { loss, phase_s }),
            Stepped::NonFinite(loss) => Err(haares_train::TrainError::Config(format!(
                "the cost protocol's loss became {loss} on a random batch; the model's \
                 initialisation or the backend is broken (check it with `cargo test -p haares-core`)"
            ))),
        }
    }
}

impl<B: TrainingBackend> Trainer<B> {
    /// Times `repeats` validation batches each way — the learner's [`validate`] without and
    /// with routing statistics — alternating which goes first, after one untimed batch of each.
    pub fn validation_cost(&mut self, repeats: usize) -> ValidationCost {
        let valid = self.model.valid();
        let vocab = valid.config.vocab_size;
        let batch = random_batch(&mut self.rng, self.batch, self.seq, vocab);
        let time = |routing: bool| {
            let start = Instant::now();
            let pass = validate(
                &valid,
                std::iter::once(batch.clone()),
                self.seq,
                &self.device,
                routing,
            );
            std::hint::black_box(pass);
            start.elapsed().as_secs_f64()
        };
        time(false);
        time(true);
        let mut cost = ValidationCost {
            plain_s: Vec::with_capacity(repeats),
            with_routing_s: Vec::with_capacity(repeats),
        };
        for repeat in 0..repeats {
            for routing in [repeat % 2 == 1, repeat % 2 == 0] {
                let seconds = time(routing);
                match routing {
                    true => cost.with_routing_s.push(seconds),
                    false => cost.plain_s.push(seconds),
                }
            }
        }
        cost
    }
}

/// Waits for the device's queued work; a failure is the backend's error.
fn sync<B: Backend>(device: &B::Device) -> haares_train::Result<()> {
    B::sync(device).map_err(|e| haares_train::TrainError::Device(format!("{e:?}")))
}

/// Brings the backend up: its first tensor, read back (device and context creation, on a GPU the
/// driver and runtime start).
fn start_backend<B: Backend>(device: &B::Device) -> haares_train::Result<()> {
    Tensor::<B, 1>::zeros([1], device).into_data();
    sync::<B>(device)
}

/// Uniform random ids, a fresh batch per step (the cost does not depend on the text).
fn random_batch(rng: &mut SplitMix64, batch: usize, seq: usize, vocab: usize) -> Batch {
    let mut ids = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| ((rng.next_f64() * vocab as f64) as u32).min(vocab as u32 - 1))
            .collect()
    };
    let (inputs, targets) = (ids(batch * seq), ids(batch * seq));
    Batch {
        batch_size: batch,
        seq_len: seq,
        inputs,
        targets,
        mask: vec![1.0; batch * seq],
    }
}

/// The fastest of `reps` `n × n` products, as FLOP/s (2n³ per product), by the backend's product
/// as the model takes it (`MatmulBackend`: on CUDA the process's provider).
fn gemm_rate<B: haares_core::ops::MatmulBackend>(n: usize, reps: usize, device: &B::Device) -> f64 {
    let mut rng = SplitMix64::new(7);
    let mut matrix = || {
        let values: Vec<f32> = (0..n * n).map(|_| rng.next_f64() as f32 - 0.5).collect();
        Tensor::<B, 2>::from_data(TensorData::new(values, [n, n]), device)
    };
    let (a, b) = (matrix(), matrix());
    let mut best = f64::INFINITY;
    for rep in 0..=reps {
        let start = Instant::now();
        let product = B::matmul(a.clone(), b.clone());
        let _ = B::sync(device);
        let seconds = start.elapsed().as_secs_f64();
        drop(product);
        if rep > 0 {
            best = best.min(seconds);
        }
    }
    2.0 * (n as f64).powi(3) / best
}
