//! The targets `cost` judges a run against: each one a flag whose default is the value this
//! project holds itself to, so that the report's verdicts are the user's to set.

use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

/// What a run is judged against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Targets {
    /// Our throughput over the faster PyTorch run at the same product precision; `None`: 1.3 on
    /// a CPU, 1.0 on CUDA ([`Targets::throughput_on`]).
    #[serde(default)]
    pub throughput: Option<f64>,
    /// Our GEMM peak over PyTorch's (the peer's), at least.
    pub gemm: f64,
    /// Standard Residual's model FLOP utilisation, at least; `None`: 60% on a CPU, 30% on a GPU,
    /// whose tensor-core peak is harder to approach ([`Targets::mfu_on`]).
    #[serde(default)]
    pub mfu: Option<f64>,
    /// HAARES / Block AttnRes step time and peak memory, at most.
    pub haares_over_block: f64,
    /// Block AttnRes / Standard Residual step time, at most.
    pub block_over_standard: f64,
}

impl Default for Targets {
    fn default() -> Self {
        Self {
            throughput: None,
            gemm: 0.7,
            mfu: None,
            haares_over_block: 1.05,
            block_over_standard: 1.15,
        }
    }
}

impl Targets {
    /// The throughput target on `backend`.
    pub fn throughput_on(&self, backend: BackendKind) -> f64 {
        self.throughput.unwrap_or(default_throughput(backend))
    }

    /// The MFU target on `backend`.
    pub fn mfu_on(&self, backend: BackendKind) -> f64 {
        self.mfu.unwrap_or(match backend.is_cube() {
            true => 0.3,
            false => 0.6,
        })
    }
}

/// The default throughput target on `backend`: 1.3 on a CPU, 1.0 on CUDA.
pub fn default_throughput(backend: BackendKind) -> f64 {
    match backend.is_cuda() {
        true => 1.0,
        false => 1.3,
    }
}

/// `cost`'s target flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TargetArgs {
    /// Our throughput over the faster PyTorch run at our products' precision, at least
    /// [default: 1.3 on a CPU, 1.0 on CUDA].
    #[arg(long)]
    pub throughput_target: Option<f64>,
    /// Our GEMM peak over PyTorch's, at least [default: 0.7].
    #[arg(long)]
    pub gemm_target: Option<f64>,
    /// Standard Residual's model FLOP utilisation, at least, as a fraction [default: 0.6 on a
    /// CPU, 0.3 on a GPU].
    #[arg(long)]
    pub mfu_target: Option<f64>,
    /// HAARES / Block AttnRes step time and peak memory, at most [default: 1.05].
    #[arg(long)]
    pub haares_target: Option<f64>,
    /// Block AttnRes / Standard Residual step time, at most [default: 1.15].
    #[arg(long)]
    pub block_target: Option<f64>,
}

impl TargetArgs {
    /// The targets these flags set, the defaults elsewhere.
    pub fn targets(&self) -> Targets {
        let defaults = Targets::default();
        Targets {
            throughput: self.throughput_target,
            gemm: self.gemm_target.unwrap_or(defaults.gemm),
            mfu: self.mfu_target,
            haares_over_block: self.haares_target.unwrap_or(defaults.haares_over_block),
            block_over_standard: self.block_target.unwrap_or(defaults.block_over_standard),
        }
    }
}
