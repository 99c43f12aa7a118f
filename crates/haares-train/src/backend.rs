//! Backends chosen at run time (`--backend`), compiled in by cargo features.

#[cfg(any(
    feature = "flex",
    feature = "ndarray",
    feature = "wgpu-backend",
    feature = "cuda-backend"
))]
use burn::backend::Autodiff;
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

    /// Whether this runs on CUDA, fused or not.
    pub fn is_cuda(self) -> bool {
        matches!(self, Self::Cuda | Self::CudaFusion)
    }

    /// The features a build needs for this backend.
    fn features(self) -> &'static str {
        match self {
            Self::WgpuFusion => "wgpu,fusion",
            Self::CudaFusion => "cuda,fusion",
            other => other.name(),
        }
    }

    /// Whether this build includes the backend: its library part (the `*-backend` features for
    /// the GPU backends), whether or not [`dispatch`] has an arm for it.
    pub fn compiled_in(self) -> bool {
        match self {
            Self::Flex => cfg!(feature = "flex"),
            Self::Ndarray => cfg!(feature = "ndarray"),
            Self::Wgpu => cfg!(feature = "wgpu-backend"),
            Self::Cuda => cfg!(feature = "cuda-backend"),
            Self::WgpuFusion => cfg!(all(feature = "wgpu-backend", feature = "fusion")),
            Self::CudaFusion => cfg!(all(feature = "cuda-backend", feature = "fusion")),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// As its name, so that a spec written to JSON reads as the command line names it.
impl serde::Serialize for BackendKind {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// From any name [`BackendKind::from_name`] takes, compiled into this build or not, so that a
/// report written by a GPU build reads in a CPU build.
impl<'de> serde::Deserialize<'de> for BackendKind {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::from_name(&name).map_err(serde::de::Error::custom)
    }
}

impl BackendKind {
    /// The backend a name (or Flex's alias `cpu`) names, whether or not this build has it: for
    /// reading what another build wrote, or choosing the backend of another binary.
    pub fn from_name(text: &str) -> Result<Self> {
        Ok(match text {
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
        })
    }
}

/// A backend this build can run: [`BackendKind::from_name`], refused with the feature to
/// rebuild with where the build lacks it.
impl FromStr for BackendKind {
    type Err = TrainError;
    fn from_str(text: &str) -> Result<Self> {
        let kind = Self::from_name(text)?;
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
    #[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
    {
        use burn_cubecl::kernel::matmul::MatmulStrategy;
        !matches!(MatmulStrategy::default(), MatmulStrategy::Cube)
    }
    #[cfg(not(any(feature = "cuda-backend", feature = "wgpu-backend")))]
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

/// Runs `job` on the backend `kind` (which [`BackendKind::from_str`] has checked is compiled in):
/// `on_flex`, `on_ndarray`, `on_wgpu`, … for each backend of this crate's runner features
/// (`flex`, `ndarray`, `wgpu`, `cuda`, `fusion`). A job is compiled once per backend here, so a
/// crate that runs its own jobs picks its backends itself from the `on_*` functions and the
/// `*-backend` features (haares-bench's `dispatch`).
pub fn dispatch<J: BackendJob + Send>(kind: BackendKind, job: J) -> Result<J::Output>
where
    J::Output: Send,
{
    // A misspelt provider stops the job here rather than being ignored for the default.
    haares_core::ops::matmul::ProductProvider::from_env()
        .map_err(|error| TrainError::Config(error.to_string()))?;
    match kind {
        #[cfg(feature = "flex")]
        BackendKind::Flex => on_flex(job),
        #[cfg(feature = "ndarray")]
        BackendKind::Ndarray => on_ndarray(job),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => on_wgpu(job),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => on_cuda(job),
        #[cfg(all(feature = "wgpu", feature = "fusion"))]
        BackendKind::WgpuFusion => on_wgpu_fusion(job),
        #[cfg(all(feature = "cuda", feature = "fusion"))]
        BackendKind::CudaFusion => on_cuda_fusion(job),
        #[allow(unreachable_patterns)]
        other => {
            drop(job);
            Err(not_dispatched(other))
        }
    }
}

/// What [`dispatch`] says for a backend its features leave out. [`BackendKind::from_str`]
/// accepts a backend whose library part is compiled in (`wgpu-backend`), so a binary built with
/// that alone (the test build's) names the feature its runner lacks.
pub fn not_dispatched(kind: BackendKind) -> TrainError {
    TrainError::Config(format!(
        "backend `{kind}` is not compiled into this runner; rebuild with `--features {}`",
        kind.features()
    ))
}

/// Runs `job` on Flex, on a thread of the CPU pool ([`on_cpu_pool`]).
#[cfg(feature = "flex")]
pub fn on_flex<J: BackendJob + Send>(job: J) -> Result<J::Output>
where
    J::Output: Send,
{
    on_cpu::<burn::backend::Flex, J>(job, BackendKind::Flex)
}

/// Runs `job` on NdArray, on a thread of the CPU pool ([`on_cpu_pool`]).
#[cfg(feature = "ndarray")]
pub fn on_ndarray<J: BackendJob + Send>(job: J) -> Result<J::Output>
where
    J::Output: Send,
{
    on_cpu::<burn::backend::NdArray, J>(job, BackendKind::Ndarray)
}

/// Runs `job` on the CPU backend `B` under autodiff, on a thread of the CPU pool.
#[cfg(any(feature = "flex", feature = "ndarray"))]
fn on_cpu<B, J>(job: J, kind: BackendKind) -> Result<J::Output>
where
    B: burn::tensor::backend::Backend,
    Autodiff<B>: TrainingBackend,
    J: BackendJob + Send,
    J::Output: Send,
{
    on_cpu_pool(|| job.run::<Autodiff<B>>(Default::default(), kind))
}

/// Runs `job` on wgpu without fusion ([`haares_core::backend::Wgpu`]): CubeCL's kernel caches are first set
/// to the machine's shared directory ([`crate::kernel_cache`]), unless the process configured
/// CubeCL already, and the device is started once, so that a missing driver or device is a
/// [`TrainError::Device`] saying what to install.
#[cfg(feature = "wgpu-backend")]
pub fn on_wgpu<J: BackendJob>(job: J) -> Result<J::Output> {
    on_cube::<haares_core::backend::Wgpu, J>(job, BackendKind::Wgpu, WGPU_MISSING)
}

/// Runs `job` on CUDA without fusion ([`haares_core::backend::Cuda`]), started as `on_wgpu` starts wgpu.
#[cfg(feature = "cuda-backend")]
pub fn on_cuda<J: BackendJob>(job: J) -> Result<J::Output> {
    on_cube::<haares_core::backend::Cuda, J>(job, BackendKind::Cuda, CUDA_MISSING)
}

/// Runs `job` on Burn's wgpu backend with kernel fusion, started as [`on_wgpu`] starts wgpu.
#[cfg(all(feature = "wgpu-backend", feature = "fusion"))]
pub fn on_wgpu_fusion<J: BackendJob>(job: J) -> Result<J::Output> {
    on_cube::<burn::backend::Wgpu, J>(job, BackendKind::WgpuFusion, WGPU_MISSING)
}

/// Runs `job` on Burn's CUDA backend with kernel fusion, started as `on_wgpu` starts wgpu.
#[cfg(all(feature = "cuda-backend", feature = "fusion"))]
pub fn on_cuda_fusion<J: BackendJob>(job: J) -> Result<J::Output> {
    on_cube::<burn::backend::Cuda, J>(job, BackendKind::CudaFusion, CUDA_MISSING)
}

#[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
fn on_cube<B, J>(job: J, kind: BackendKind, missing: &str) -> Result<J::Output>
where
    B: burn::tensor::backend::Backend,
    Autodiff<B>: TrainingBackend,
    J: BackendJob,
{
    share_kernel_caches();
    probe::<B>(missing)?;
    job.run::<Autodiff<B>>(Default::default(), kind)
}

/// What a wgpu backend that cannot start says.
#[cfg(feature = "wgpu-backend")]
const WGPU_MISSING: &str = "wgpu found no usable adapter: install a Vulkan, Metal or DX12 driver \
     (Debian: `apt-get install mesa-vulkan-drivers` for the lavapipe software device)";

/// What a CUDA backend that cannot start says.
#[cfg(feature = "cuda-backend")]
const CUDA_MISSING: &str = "CUDA could not start: this needs an NVIDIA GPU and its driver \
     (`libcuda.so`, `nvidia-smi` lists the GPU); the message above says what was missing";

/// Points CubeCL at the shared kernel caches; without them a run still trains (each process then
/// compiles its own kernels), so a failure is a warning.
#[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
fn share_kernel_caches() {
    use crate::kernel_cache::{KernelEvents, configure_cube_runtime};
    if let Err(error) = configure_cube_runtime(KernelEvents::Quiet) {
        eprintln!("warning: {error}; kernels are compiled and tuned anew in this process");
    }
}

/// Starts a GPU backend with one tiny tensor: CubeCL panics (in its device thread) when the
/// driver or the device is missing, which would otherwise end the process with a panic deep in a
/// job. Here it becomes a [`TrainError::Device`] saying what to install.
#[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
fn probe<B: burn::tensor::backend::Backend>(missing: &str) -> Result<()> {
    use burn::tensor::Tensor;
    let device = B::Device::default();
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Tensor::<B, 1>::zeros([1], &device).into_data();
    }));
    started.map_err(|_| TrainError::Device(missing.to_string()))
}
