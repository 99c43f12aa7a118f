//! How the PyTorch peer runs ([`crate::peer`]): its matrix products' precision, eager or
//! compiled, and how close its logits must come to ours at each precision.

use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

/// Logits agree when they differ by at most this much relative to `max(1, max |logit|)`: fp32
/// rounding of two implementations (different summation orders) stays orders of magnitude below.
pub const LOGITS_TOLERANCE: f64 = 1e-4;

/// The same where our matrix products are TF32 (CUDA) and the peer's logits fp32: the portability
/// suite's TF32 bound (`haares-core/tests/portability.rs`), which emulated TF32 rounding stays
/// under for every method. On an H200 the peer's logits differed from ours by at most 2.0e-2 at
/// a scale of 10.3 (d = 512 HAARES; docs/benchmarks.md); a wrong model differs by O(1).
pub const TF32_LOGITS_TOLERANCE: f64 = 3e-2;

/// The logits' tolerance when our matrix products run at `ours`.
pub fn logits_tolerance(ours: PeerMatmul) -> f64 {
    match ours {
        PeerMatmul::Fp32 => LOGITS_TOLERANCE,
        PeerMatmul::Tf32 => TF32_LOGITS_TOLERANCE,
    }
}

/// Whether logits `diff` apart at a scale of `scale` (`max |logit|` of ours) agree, where our
/// matrix products run at `ours`: within [`logits_tolerance`] of `max(1, scale)`.
pub fn logits_agree(diff: f64, scale: f64, ours: PeerMatmul) -> bool {
    diff <= logits_tolerance(ours) * scale.max(1.0)
}

/// The precision of the peer's f32 matrix products on CUDA (on a CPU PyTorch computes in fp32
/// either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PeerMatmul {
    /// Full fp32: PyTorch's default, and the paper's setting.
    #[default]
    Fp32,
    /// TF32 tensor cores (`torch.backends.cuda.matmul.allow_tf32`): what CubeCL's matrix
    /// products use for f32 on a GPU with tensor cores (cubek-matmul stages f32 operands as
    /// tf32), so the comparison at the same precision.
    Tf32,
}

impl PeerMatmul {
    /// The precision of our own matrix products on `backend`: TF32 on CUDA, fp32 elsewhere.
    pub fn ours(backend: BackendKind) -> Self {
        if backend.is_cuda() {
            Self::Tf32
        } else {
            Self::Fp32
        }
    }

    /// The name in reports and on the command line.
    pub fn label(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Tf32 => "TF32",
        }
    }
}

/// How PyTorch runs the model: op by op (eager, PyTorch's default), or compiled by
/// `torch.compile` (TorchInductor's default mode), which fuses the plain operations between the
/// matrix products. A compiled run's first step includes the compilation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PeerMode {
    /// PyTorch eager.
    #[default]
    Eager,
    /// `torch.compile(model)`: forward and backward compiled; AdamW and the clip stay eager.
    Compiled,
}

impl PeerMode {
    /// The name in reports.
    pub fn label(self) -> &'static str {
        match self {
            Self::Eager => "eager",
            Self::Compiled => "compiled",
        }
    }
}

/// A peer implementation on the command line (`--peer torch,torch-compile`), each run by
/// `crates/haares-bench/peer/torch_peer.py`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PeerKind {
    /// PyTorch eager.
    Torch,
    /// The same model through `torch.compile` (TorchInductor), its compilation timed apart.
    TorchCompile,
}

impl PeerKind {
    /// How this peer runs the model.
    pub fn mode(self) -> PeerMode {
        match self {
            Self::Torch => PeerMode::Eager,
            Self::TorchCompile => PeerMode::Compiled,
        }
    }

    /// The modes of the peers named, eager before compiled, each once.
    pub fn modes(kinds: &[PeerKind]) -> Vec<PeerMode> {
        [PeerMode::Eager, PeerMode::Compiled]
            .into_iter()
            .filter(|mode| kinds.iter().any(|kind| kind.mode() == *mode))
            .collect()
    }
}
