//! What every measurement of the crate is told: the model (families, depth, blocks,
//! vocabulary), the batch, the steps and their repeats, the methods, and the cost protocol's
//! own settings (its GEMM, the PyTorch peer, launch counts, targets). `cost` measures it whole;
//! the comparisons and profiles take its model and steps.

use haares_core::{ModelConfig, ModelFamily};
use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

use super::targets::Targets;
use crate::error::{BenchError, Result};
use crate::measure::run_worker;
use crate::measure::worker::{KernelLog, TrainSample, TrainTask, WorkerResult, WorkerTask};
use crate::method_choice::{MethodChoice, methods};
use crate::peer::settings::{PeerMatmul, PeerMode};

/// A cost-protocol run: what to measure and how long.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostSpec {
    /// The backend every measurement runs on.
    pub backend: BackendKind,
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
    /// Methods, each with the routing path it is pinned to (written `name`, `name/reference` or
    /// `name/fused`), so that both paths can be measured in one interleaved run.
    pub methods: Vec<MethodChoice>,
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
    /// The Python interpreter of the PyTorch peer ([`crate::peer`]), when one is asked for.
    #[serde(default)]
    pub peer: Option<String>,
    /// The precisions the peer's matrix products run at, each measured (default: fp32).
    #[serde(default = "default_peer_matmul")]
    pub peer_matmul: Vec<PeerMatmul>,
    /// How the peer runs the model, each measured (default: eager).
    #[serde(default = "default_peer_modes")]
    pub peer_modes: Vec<PeerMode>,
    /// Count the kernels a step launches, on the cube backends ([`super::launches`]). Default: yes.
    #[serde(default = "default_count_launches")]
    pub count_launches: bool,
    /// What the report judges the run against.
    #[serde(default)]
    pub targets: Targets,
}

fn default_peer_matmul() -> Vec<PeerMatmul> {
    vec![PeerMatmul::Fp32]
}

fn default_peer_modes() -> Vec<PeerMode> {
    vec![PeerMode::Eager]
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
    pub fn cpu(backend: BackendKind) -> Self {
        Self {
            backend,
            families: vec![ModelFamily::Small],
            layers: 12,
            blocks: 4,
            vocab: 256,
            batch: 8,
            seq: 128,
            steps: 12,
            warmup: 4,
            repeats: 2,
            methods: methods(&["standard", "block-attnres", "haares"]),
            gemm_n: 1024,
            validation_every: default_validation_every(),
            validation_batches: default_validation_batches(),
            peer: None,
            peer_matmul: default_peer_matmul(),
            peer_modes: default_peer_modes(),
            count_launches: default_count_launches(),
            targets: Targets::default(),
        }
    }

    /// tab:cost: d = 128 / 512 / 768 at 48 layers, batch 16 × 512, 2K steps from step zero.
    pub fn paper(backend: BackendKind) -> Self {
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

    /// The model of `family` trained with `method`, on the routing path it names.
    pub fn model(&self, family: ModelFamily, method: &MethodChoice) -> Result<ModelConfig> {
        let config = family
            .config(self.layers, self.vocab, method.method)
            .with_blocks(self.blocks)
            .with_max_seq_len(self.seq.max(512))
            .with_routing(method.routing);
        config.validate()?;
        Ok(config)
    }

    /// K training steps of `method` in `family`, measured by a fresh worker process.
    pub fn measure(&self, family: ModelFamily, method: &MethodChoice) -> Result<TrainSample> {
        self.train_worker(family, method, self.steps, KernelLog::Off)
    }

    /// `steps` training steps of `method` in `family` by a fresh worker process, which counts
    /// logging each kernel launch as `kernel_log` says (on a cube backend).
    pub fn train_worker(
        &self,
        family: ModelFamily,
        method: &MethodChoice,
        steps: usize,
        kernel_log: KernelLog,
    ) -> Result<TrainSample> {
        self.worker(family, method, steps, kernel_log, None)
    }

    /// The spec's K steps of `method` in `family` by a fresh worker process, every operation of
    /// the steps after the warm-up timed ([`haares_core::op_times`]).
    pub fn operations_worker(
        &self,
        family: ModelFamily,
        method: &MethodChoice,
    ) -> Result<TrainSample> {
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
        method: &MethodChoice,
        steps: usize,
        kernel_log: KernelLog,
        record_operations_from: Option<usize>,
    ) -> Result<TrainSample> {
        let task = WorkerTask::Train(TrainTask {
            config: self.model(family, method)?,
            method: *method,
            batch: self.batch,
            seq: self.seq,
            steps,
            kernel_log,
            record_operations_from,
        });
        match run_worker(self.backend, &task)? {
            WorkerResult::Train(sample) => Ok(*sample),
            _ => Err(BenchError::Worker(
                "a training worker answered with something else".into(),
            )),
        }
    }

    /// Refuses what cannot be measured, before any worker starts.
    pub fn validate(&self) -> Result<()> {
        if self.methods.is_empty() || self.families.is_empty() {
            return Err(BenchError::Request(
                "give at least one method and one family".into(),
            ));
        }
        if self.peer_matmul.is_empty() || self.peer_modes.is_empty() {
            return Err(BenchError::Request(
                "give the peer at least one matrix-product precision (fp32, tf32) and one mode"
                    .into(),
            ));
        }
        if self.peer_matmul.contains(&PeerMatmul::Tf32) && !self.backend.is_cuda() {
            return Err(BenchError::Request(format!(
                "--peer-matmul tf32 needs a CUDA backend (PyTorch has no TF32 on `{}`); \
                 leave it out or run with --backend cuda",
                self.backend
            )));
        }
        if self.steps <= self.warmup {
            return Err(BenchError::Request(format!(
                "--steps {} must exceed --warmup {} (the steady state is measured after the warm-up)",
                self.steps, self.warmup
            )));
        }
        let sizes = [
            self.repeats,
            self.batch,
            self.seq,
            self.gemm_n,
            self.validation_every,
        ];
        if sizes.contains(&0) {
            return Err(BenchError::Request(
                "--repeats, --batch, --seq, --gemm-size and --validation-every must be positive"
                    .into(),
            ));
        }
        for family in &self.families {
            for method in &self.methods {
                self.model(*family, method)?;
            }
        }
        Ok(())
    }
}
