//! Backends chosen at run time (`--backend`), compiled in by cargo features.

use haares_core::TrainingBackend;
use std::fmt;
use std::str::FromStr;

#[cfg(any(feature = "flex", feature = "ndarray"))]
use crate::cpu::on_cpu_pool;
use crate::error::{Result, TrainError};

/// A Burn backend the runner can train on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Burn's Flex CPU backend (feature `flex`): the faster CPU backend here (docs/notebook/cpu-speed.md).
    Flex,
    /// Burn's NdArray CPU backend (feature `ndarray`): the tests' reference backend.
    Ndarray,
    /// WebGPU through wgpu: Vulkan, Metal, DX12 (feature `wgpu`).
    Wgpu,
    /// CUDA (feature `cuda`).
    Cuda,
    /// wgpu with Burn's kernel fusion and the plain operations in place of this project's
    /// kernels (features `wgpu` and `fusion`): an option for measuring what fusion saves
    /// (docs/deviations.md, "GPU backends without Burn's kernel fusion").
    WgpuFusion,
    /// CUDA with Burn's kernel fusion, as [`BackendKind::WgpuFusion`] (features `cuda`, `fusion`).
    CudaFusion,
}

impl BackendKind {
    /// Every backend name.
    pub const NAMES: &[&str] = &[
        "flex",
        "ndarray",
        "wgpu",
        "cuda",
        "wgpu-fusion",
        "cuda-fusion",
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::Ndarray => "ndarray",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
            Self::WgpuFusion => "wgpu-fusion",
            Self::CudaFusion => "cuda-fusion",
        }
    }

    /// Whether this is a GPU (cube) backend: one run per device, CubeCL's caches and counters.
    pub fn is_cube(self) -> bool {
        !matches!(self, Self::Flex | Self::Ndarray)
    }

    /// The features a build needs for this backend.
    fn features(self) -> &'static str {
        match self {
            Self::WgpuFusion => "wgpu,fusion",
            Self::CudaFusion => "cuda,fusion",
            other => other.name(),
        }
    }

    /// Whether this build includes the backend.
    pub fn compiled_in(self) -> bool {
        match self {
            Self::Flex => cfg!(feature = "flex"),
            Self::Ndarray => cfg!(feature = "ndarray"),
            Self::Wgpu => cfg!(feature = "wgpu"),
            Self::Cuda => cfg!(feature = "cuda"),
            Self::WgpuFusion => cfg!(all(feature = "wgpu", feature = "fusion")),
            Self::CudaFusion => cfg!(all(feature = "cuda", feature = "fusion")),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = TrainError;
    fn from_str(text: &str) -> Result<Self> {
        let kind = match text {
            "flex" | "cpu" => Self::Flex,
            "ndarray" => Self::Ndarray,
            "wgpu" => Self::Wgpu,
            "cuda" => Self::Cuda,
            "wgpu-fusion" => Self::WgpuFusion,
            "cuda-fusion" => Self::CudaFusion,
            _ => {
                return Err(TrainError::Config(format!(
                    "unknown backend `{text}`; choose one of: {}",
                    Self::NAMES.join(", ")
                )));
            }
        };
        if !kind.compiled_in() {
            return Err(TrainError::Config(format!(
                "backend `{text}` is not compiled into this build; rebuild with `--features {0}` \
                 (e.g. cargo run -p haares-train --features {0} -- …)",
                kind.features()
            )));
        }
        Ok(kind)
    }
}

/// Whether CubeCL autotunes matrix products and reductions on the cube backends in this build.
/// This crate's `autotune` feature turns it on (opt-in: docs/decisions.md, decision 24), but so
/// does any crate in the build that depends on `burn` with Burn's default features, so the answer
/// is read from Burn's cube backend itself: its default matrix-product strategy is `Cube` (one
/// kernel per shape, chosen by a fixed rule) exactly when it was compiled without autotuning.
/// False in a build without a cube backend. Reports say which build measured them.
pub fn autotune() -> bool {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        use burn_cubecl::kernel::matmul::MatmulStrategy;
        !matches!(MatmulStrategy::default(), MatmulStrategy::Cube)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        false
    }
}

/// How reports name a build's [`autotune`].
pub fn autotune_text(autotune: bool) -> &'static str {
    if autotune {
        "CubeCL autotuning on (the `autotune` feature, or Burn's default features in the build)"
    } else {
        "CubeCL autotuning off (the default: built without the `autotune` feature)"
    }
}

/// wgpu as the runners use it: Burn's cube backend without kernel fusion. Burn 0.21's fused
/// kernels gave wrong logits in the portability tests (docs/deviations.md); unfused, wgpu matches
/// the f64 reference to f32 rounding.
#[cfg(feature = "wgpu")]
pub type WgpuUnfused = burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

/// CUDA as the runners use it: without kernel fusion, like [`WgpuUnfused`].
#[cfg(feature = "cuda")]
pub type CudaUnfused = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// A job generic over the backend, run by [`dispatch`].
pub trait BackendJob {
    /// What the job returns.
    type Output;
    /// Runs the job on backend `B` and its default device.
    fn run<B: TrainingBackend>(
        self,
        device: B::Device,
        backend: BackendKind,
    ) -> Result<Self::Output>;
}

/// Runs `job` on the backend `kind` (which [`BackendKind::from_str`] has checked is compiled in).
/// On the CPU backends the job runs on a thread of a Rayon pool ([`on_cpu_pool`]). On the cube backends CubeCL's kernel caches are first set to the machine's shared directory
/// ([`crate::kernel_cache`]), unless the process configured CubeCL already, and the device is
/// started once: a missing driver or device is a [`TrainError::Device`] saying what to install.
pub fn dispatch<J: BackendJob + Send>(kind: BackendKind, job: J) -> Result<J::Output>
where
    J::Output: Send,
{
    use burn::backend::Autodiff;
    match kind {
        #[cfg(feature = "flex")]
        BackendKind::Flex => {
            on_cpu_pool(|| job.run::<Autodiff<burn::backend::Flex>>(Default::default(), kind))
        }
        #[cfg(feature = "ndarray")]
        BackendKind::Ndarray => {
            on_cpu_pool(|| job.run::<Autodiff<burn::backend::NdArray>>(Default::default(), kind))
        }
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            share_kernel_caches();
            probe::<WgpuUnfused>(WGPU_MISSING)?;
            job.run::<Autodiff<WgpuUnfused>>(Default::default(), kind)
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            share_kernel_caches();
            probe::<CudaUnfused>(CUDA_MISSING)?;
            job.run::<Autodiff<CudaUnfused>>(Default::default(), kind)
        }
        #[cfg(all(feature = "wgpu", feature = "fusion"))]
        BackendKind::WgpuFusion => {
            share_kernel_caches();
            probe::<burn::backend::Wgpu>(WGPU_MISSING)?;
            job.run::<Autodiff<burn::backend::Wgpu>>(Default::default(), kind)
        }
        #[cfg(all(feature = "cuda", feature = "fusion"))]
        BackendKind::CudaFusion => {
            share_kernel_caches();
            probe::<burn::backend::Cuda>(CUDA_MISSING)?;
            job.run::<Autodiff<burn::backend::Cuda>>(Default::default(), kind)
        }
        #[allow(unreachable_patterns)]
        other => Err(TrainError::Config(format!(
            "backend `{other}` is not compiled into this build"
        ))),
    }
}

/// What a wgpu backend that cannot start says.
#[cfg(feature = "wgpu")]
const WGPU_MISSING: &str = "wgpu found no usable adapter: install a Vulkan, Metal or DX12 driver \
     (Debian: `apt-get install mesa-vulkan-drivers` for the lavapipe software device)";

/// What a CUDA backend that cannot start says.
#[cfg(feature = "cuda")]
const CUDA_MISSING: &str = "CUDA could not start: this needs an NVIDIA GPU and its driver \
     (`libcuda.so`, `nvidia-smi` lists the GPU); the message above says what was missing";

/// Points CubeCL at the shared kernel caches; without them a run still trains (each process then
/// compiles its own kernels), so a failure is a warning.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn share_kernel_caches() {
    use crate::kernel_cache::{KernelEvents, configure_cube_runtime};
    if let Err(error) = configure_cube_runtime(KernelEvents::Quiet) {
        eprintln!("warning: {error}; kernels are compiled and tuned anew in this process");
    }
}

/// Starts a GPU backend with one tiny tensor: CubeCL panics (in its device thread) when the
/// driver or the device is missing, which would otherwise end the process with a panic deep in a
/// job. Here it becomes a [`TrainError::Device`] saying what to install.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn probe<B: burn::tensor::backend::Backend>(missing: &str) -> Result<()> {
    use burn::tensor::Tensor;
    let device = B::Device::default();
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Tensor::<B, 1>::zeros([1], &device).into_data();
    }));
    started.map_err(|_| TrainError::Device(missing.to_string()))
}
