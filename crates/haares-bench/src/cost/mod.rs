//! The paper's cost protocol (sec:costprotocol) for this implementation: step time, throughput
//! from step zero and in steady state, peak memory, ratios between methods, and model FLOP
//! utilisation against a GEMM peak measured in the same run.
//!
//! Every measurement runs in a fresh worker process (`haares-bench cost-worker`), so start-up,
//! peak memory and allocator state belong to one method alone. Methods are interleaved across
//! repeats in alternating order (A B C, C B A, A B C, …) so that a drift of the machine's speed
//! affects every method alike.

pub mod anatomy;
mod device_memory;
pub mod export;
pub mod family_args;
pub mod launches;
pub mod paired;
pub mod peer;
pub mod peer_profile;
pub mod peer_report;
pub mod peer_server;
pub mod peer_settings;
pub mod report;
pub mod stats;
pub mod summary;
pub mod targets;
pub mod versus;
pub mod versus_report;
pub mod worker;

pub use family_args::{Family, Preset, SizeArgs};

use std::path::Path;
use std::process::{Command, Stdio};

use haares_core::ResidualMethod;
use haares_core::{ModelConfig, ModelFamily, RoutingPath};
use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

use haares_core::flops::flops_per_token;
use worker::{KernelLog, RESULT_PREFIX, TrainSample, WorkerResult, WorkerTask};

/// A cost-protocol run: what to measure and how long.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostSpec {
    /// Backend name.
    pub backend: String,
    /// Model families (widths).
    pub families: Vec<ModelFamily>,
    /// Depth L.
    pub layers: usize,
    /// Blocks N.
    pub blocks: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Rows per batch.
    pub batch: usize,
    /// Context length.
    pub seq: usize,
    /// Steps K per measurement (the window of the from-step-zero throughput).
    pub steps: usize,
    /// Steps excluded from the steady-state step time.
    pub warmup: usize,
    /// Measurements per method, interleaved.
    pub repeats: usize,
    /// Methods, by name; `name/reference` or `name/fused` pins the router implementation (a bare
    /// name uses the automatic choice), so both paths can be measured in one interleaved run.
    pub methods: Vec<String>,
    /// Size n of the square GEMM whose rate is the peak.
    pub gemm_n: usize,
    /// The validation schedule the routing telemetry's share of training time is computed for:
    /// a validation pass of `validation_batches` batches every `validation_every` steps.
    /// Default: the depth study's `cpu` preset (32 chunks in batches of 8, every 20 steps).
    #[serde(default = "default_validation_every")]
    pub validation_every: usize,
    /// See `validation_every`.
    #[serde(default = "default_validation_batches")]
    pub validation_batches: usize,
    /// The Python interpreter of the PyTorch peer ([`peer`]), when one is asked for.
    #[serde(default)]
    pub peer: Option<String>,
    /// The precisions the peer's matrix products run at, each measured (default: fp32).
    #[serde(default = "default_peer_matmul")]
    pub peer_matmul: Vec<peer::PeerMatmul>,
    /// How the peer runs the model, each measured (default: eager).
    #[serde(default = "default_peer_modes")]
    pub peer_modes: Vec<peer::PeerMode>,
    /// Count the kernels a step launches, on the cube backends ([`launches`]). Default: yes.
    #[serde(default = "default_count_launches")]
    pub count_launches: bool,
    /// What the report judges the run against.
    #[serde(default)]
    pub targets: targets::Targets,
}

fn default_peer_matmul() -> Vec<peer::PeerMatmul> {
    vec![peer::PeerMatmul::Fp32]
}

fn default_peer_modes() -> Vec<peer::PeerMode> {
    vec![peer::PeerMode::Eager]
}

fn default_count_launches() -> bool {
    true
}

fn default_validation_every() -> usize {
    20
}

fn default_validation_batches() -> usize {
    4
}

impl CostSpec {
    /// Minutes on a 2-core CPU: the small family's widths at 12 layers, short context.
    pub fn cpu(backend: &str) -> Self {
        Self {
            backend: backend.to_string(),
            families: vec![ModelFamily::Small],
            layers: 12,
            blocks: 4,
            vocab: 256,
            batch: 8,
            seq: 128,
            steps: 12,
            warmup: 4,
            repeats: 2,
            methods: ["standard", "block-attnres", "haares"]
                .map(String::from)
                .to_vec(),
            gemm_n: 1024,
            validation_every: default_validation_every(),
            validation_batches: default_validation_batches(),
            peer: None,
            peer_matmul: default_peer_matmul(),
            peer_modes: default_peer_modes(),
            count_launches: default_count_launches(),
            targets: targets::Targets::default(),
        }
    }

    /// tab:cost: d = 128 / 512 / 768 at 48 layers, batch 16 × 512, 2K steps from step zero.
    pub fn paper(backend: &str) -> Self {
        Self {
            families: vec![ModelFamily::Small, ModelFamily::Medium, ModelFamily::Large],
            layers: 48,
            batch: 16,
            seq: 512,
            steps: 2000,
            warmup: 100,
            repeats: 1,
            gemm_n: 8192,
            ..Self::cpu(backend)
        }
    }

    /// The model of `family` trained with `method` (`name` or `name/routing`).
    pub fn model(&self, family: ModelFamily, method: &str) -> Result<ModelConfig, String> {
        let (name, routing) = match method.split_once('/') {
            None => (method, RoutingPath::Auto),
            Some((name, "reference")) => (name, RoutingPath::Reference),
            Some((name, "fused")) => (name, RoutingPath::Fused),
            Some((_, other)) => {
                return Err(format!(
                    "unknown routing path `{other}` in method `{method}`; use `/reference` or `/fused`"
                ));
            }
        };
        let config = family
            .config(
                self.layers,
                self.vocab,
                name.parse::<ResidualMethod>().map_err(|e| e.to_string())?,
            )
            .with_blocks(self.blocks)
            .with_max_seq_len(self.seq.max(512))
            .with_routing(routing);
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// K training steps of `method` in `family`, measured by a fresh worker process.
    pub fn measure(&self, family: ModelFamily, method: &str) -> Result<TrainSample, String> {
        self.train_worker(family, method, self.steps, KernelLog::Off)
    }

    /// `steps` training steps of `method` in `family` by a fresh worker process, which counts
    /// logging each kernel launch as `kernel_log` says (on a cube backend).
    pub fn train_worker(
        &self,
        family: ModelFamily,
        method: &str,
        steps: usize,
        kernel_log: KernelLog,
    ) -> Result<TrainSample, String> {
        self.worker(family, method, steps, kernel_log, None)
    }

    /// The spec's K steps of `method` in `family` by a fresh worker process, every operation of
    /// the steps after the warm-up timed ([`haares_core::op_times`]).
    pub fn operations_worker(
        &self,
        family: ModelFamily,
        method: &str,
    ) -> Result<TrainSample, String> {
        self.worker(
            family,
            method,
            self.steps,
            KernelLog::Off,
            Some(self.warmup),
        )
    }

    fn worker(
        &self,
        family: ModelFamily,
        method: &str,
        steps: usize,
        kernel_log: KernelLog,
        record_operations_from: Option<usize>,
    ) -> Result<TrainSample, String> {
        let task = WorkerTask::Train {
            config: self.model(family, method)?,
            method: method.to_string(),
            batch: self.batch,
            seq: self.seq,
            steps,
            kernel_log,
            record_operations_from,
        };
        match run_worker(&self.backend, &task)? {
            WorkerResult::Train(sample) => Ok(*sample),
            _ => Err("a training worker answered with something else".into()),
        }
    }

    /// Refuses what cannot be measured, before any worker starts.
    pub fn validate(&self) -> Result<(), String> {
        self.backend
            .parse::<BackendKind>()
            .map_err(|e| e.to_string())?;
        if self.methods.is_empty() || self.families.is_empty() {
            return Err("give at least one method and one family".into());
        }
        if self.peer_matmul.is_empty() || self.peer_modes.is_empty() {
            return Err(
                "give the peer at least one matrix-product precision (fp32, tf32) and one mode"
                    .into(),
            );
        }
        if self.peer_matmul.contains(&peer::PeerMatmul::Tf32) && !self.backend.starts_with("cuda") {
            return Err(format!(
                "--peer-matmul tf32 needs a CUDA backend (PyTorch has no TF32 on `{}`); \
                 leave it out or run with --backend cuda",
                self.backend
            ));
        }
        if self.steps <= self.warmup {
            return Err(format!(
                "--steps {} must exceed --warmup {} (the steady state is measured after the warm-up)",
                self.steps, self.warmup
            ));
        }
        let sizes = [
            self.repeats,
            self.batch,
            self.seq,
            self.gemm_n,
            self.validation_every,
        ];
        if sizes.contains(&0) {
            return Err(
                "--repeats, --batch, --seq, --gemm-size and --validation-every must be positive"
                    .into(),
            );
        }
        for family in &self.families {
            for method in &self.methods {
                self.model(*family, method)?;
            }
        }
        Ok(())
    }
}

/// Every sample of a cost run, ready for [`report`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostRun {
    /// What was measured.
    pub spec: CostSpec,
    /// GEMM rates (FLOP/s) measured before and after the model runs.
    pub gemm_flops_per_s: Vec<f64>,
    /// Samples per family, in measurement order.
    pub samples: Vec<(ModelFamily, Vec<TrainSample>)>,
    /// Training FLOPs per token of every family × method (analytic, [`crate::flops`]).
    pub training_flops: Vec<(ModelFamily, String, f64)>,
    /// The PyTorch peer's measurements, when one was asked for.
    #[serde(default)]
    pub peer: Option<peer::PeerRun>,
    /// Kernel launches per step of every family × method, on the cube backends.
    #[serde(default)]
    pub launches: Vec<launches::LaunchCount>,
}

impl CostRun {
    /// Whether the run stopped before its last family (a file written after an earlier one).
    pub fn is_partial(&self) -> bool {
        self.samples.len() < self.spec.families.len()
    }
}

/// Runs the protocol: GEMM peak, then every family's methods interleaved over the repeats, then
/// the GEMM peak again. `log` receives one line per finished measurement, and `finished_family`
/// the run so far after each family but the last (so that a run cut short on a GPU machine's time
/// limit keeps the families it finished; [`CostRun::is_partial`] says so).
pub fn run_cost(
    spec: &CostSpec,
    mut log: impl FnMut(&str),
    mut finished_family: impl FnMut(&CostRun) -> Result<(), String>,
) -> Result<CostRun, String> {
    spec.validate()?;
    let gemm = WorkerTask::Gemm {
        n: spec.gemm_n,
        reps: 3,
    };
    let mut gemm_rates = vec![gemm_of(run_worker(&spec.backend, &gemm)?)?];
    log(&format!(
        "GEMM {0}×{0}: {1:.1} GFLOP/s",
        spec.gemm_n,
        gemm_rates[0] / 1e9
    ));
    let mut peer = peer::PeerSession::start(spec, &mut log);
    if let Some(peer) = &mut peer {
        peer.gemm(spec.gemm_n, &spec.backend, &mut log);
    }
    let mut samples = Vec::new();
    let mut training_flops = Vec::new();
    let mut launch_counts = Vec::new();
    for &family in &spec.families {
        let family_samples = measure_family(spec, family, peer.as_mut(), &mut log)?;
        for method in &spec.methods {
            let flops = flops_per_token(&spec.model(family, method)?, spec.seq).training();
            training_flops.push((family, method.clone(), flops));
            if launches::counts_launches(spec)
                && let Some(count) = launches::count_launches(spec, family, method)?
            {
                log(&format!(
                    "{family:?} {method}: {} kernel launches per step",
                    count.total()
                ));
                launch_counts.push(count);
            }
        }
        samples.push((family, family_samples));
        if samples.len() < spec.families.len() {
            finished_family(&CostRun {
                spec: spec.clone(),
                gemm_flops_per_s: gemm_rates.clone(),
                samples: samples.clone(),
                training_flops: training_flops.clone(),
                peer: peer.as_ref().map(peer::PeerSession::snapshot),
                launches: launch_counts.clone(),
            })?;
        }
    }
    gemm_rates.push(gemm_of(run_worker(&spec.backend, &gemm)?)?);
    if let Some(peer) = &mut peer {
        peer.gemm(spec.gemm_n, &spec.backend, &mut log);
    }
    Ok(CostRun {
        spec: spec.clone(),
        gemm_flops_per_s: gemm_rates,
        samples,
        training_flops,
        peer: peer.map(peer::PeerSession::finish),
        launches: launch_counts,
    })
}

/// Every method of `family` in `spec.repeats` interleaved rounds, the order turning each round,
/// with the PyTorch peer's run after each of ours where there is a peer.
fn measure_family(
    spec: &CostSpec,
    family: ModelFamily,
    mut peer: Option<&mut peer::PeerSession>,
    log: &mut impl FnMut(&str),
) -> Result<Vec<TrainSample>, String> {
    let mut samples = Vec::new();
    for repeat in 0..spec.repeats {
        let mut order: Vec<&String> = spec.methods.iter().collect();
        if repeat % 2 == 1 {
            order.reverse();
        }
        for method in order {
            let sample = spec.measure(family, method)?;
            log(&format!(
                "{family:?} {method} (repeat {}): {:.3} s/step, loss {:.3} → {:.3}",
                repeat + 1,
                stats::median(&sample.step_s[spec.warmup..]),
                sample.first_loss,
                sample.last_loss
            ));
            samples.push(sample);
            if let Some(peer) = peer.as_deref_mut() {
                peer.measure(spec, family, method, repeat, log);
            }
        }
    }
    Ok(samples)
}

fn gemm_of(result: WorkerResult) -> Result<f64, String> {
    match result {
        WorkerResult::Gemm { flops_per_s } => Ok(flops_per_s),
        _ => Err("a GEMM worker answered with something else".into()),
    }
}

/// Runs one task in a fresh `haares-bench cost-worker` process and reads its answer.
pub(crate) fn run_worker(backend: &str, task: &WorkerTask) -> Result<WorkerResult, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let task_json = serde_json::to_string(task).map_err(|e| e.to_string())?;
    // The worker's stderr goes straight to ours: its progress and, if it fails, its error.
    let output = Command::new(&exe)
        .args(["cost-worker", "--backend", backend, "--task", &task_json])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start the worker `{}`: {e}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let answer = stdout.lines().find_map(|l| l.strip_prefix(RESULT_PREFIX));
    match (output.status.success(), answer) {
        (true, Some(json)) => serde_json::from_str(json)
            .map_err(|e| format!("the worker's answer is not valid JSON ({e}): {json}")),
        _ => Err(format!(
            "a measurement failed ({}); the worker's error is above",
            output.status
        )),
    }
}

/// Writes `run` as `<stem>.json` and its table as `<stem>.md`, atomically.
pub fn write_cost_run(run: &CostRun, stem: &Path) -> Result<String, String> {
    let table = report::cost_table(run);
    write_atomically_both(stem, run, &table)?;
    Ok(table)
}

/// Writes `value` as `<stem>.json` and `table` as `<stem>.md`, each atomically, creating the
/// folder.
pub fn write_atomically_both(
    stem: &Path,
    value: &impl Serialize,
    table: &str,
) -> Result<(), String> {
    let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    if let Some(dir) = stem.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    }
    for (extension, text) in [("json", json.as_str()), ("md", table)] {
        let path = stem.with_extension(extension);
        haares_data::write_atomically(&path, text.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}
