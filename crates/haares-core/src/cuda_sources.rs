//! The CUDA C++ that CubeCL generates for this project's kernels, on a machine without a GPU.
//!
//! Whether a kernel compiles for CUDA, and its registers, spills and occupancy, are properties
//! of its source: NVRTC and `ptxas -v` report them on any machine
//! (`scripts/cuda-static/report.sh`; docs/benchmarks.md, "Kernels compiled for CUDA without a
//! GPU"). A lent GPU's time is then spent on timings, not on finding a kernel that does not
//! compile.
//!
//! CubeCL builds a kernel's definition from a compute client, and a CUDA client needs a CUDA
//! device, so the definitions are built on wgpu's client (lavapipe, on a machine without a GPU) and
//! compiled by CubeCL's CUDA compiler with the options its CUDA runtime takes on compute capability
//! 9.0 and up. No kernel here reads a device property while it is defined: its variants are set by
//! the launch sites' constants, which [`core_kernel_sources`](crate::ops::core_kernel_sources)
//! repeats.

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn_cubecl::cubecl::Compiler;
use burn_cubecl::cubecl::cuda::CudaCompiler;
use burn_cubecl::cubecl::ir::{ElemType, FloatKind, IntKind, StorageType, UIntKind};
use burn_cubecl::cubecl::prelude::{
    AddressType, ComputeClient, CubeDim, CubeKernel, ExecutionMode, KernelSettings, Runtime,
    TensorCompilationArg,
};
use burn_cubecl::cubecl::wgpu::{WgpuDevice, WgpuRuntime};

use crate::HaaresError;

/// One kernel's CUDA C++, as CubeCL's CUDA runtime hands it to NVRTC.
#[derive(Clone, Debug)]
pub struct CudaKernelSource {
    /// The kernel's entry point in the source.
    pub name: String,
    /// Which of its compiled variants this is (its compile-time settings), e.g. `d_h = 64`.
    pub variant: String,
    /// Threads per cube it is launched with (the `__launch_bounds__` in the source).
    pub threads: u32,
    /// The source.
    pub source: String,
}

/// Collects kernels' CUDA sources: definitions built on a wgpu client, compiled by CubeCL's
/// CUDA compiler.
pub struct CudaSources {
    client: ComputeClient<WgpuRuntime>,
    kernels: Vec<CudaKernelSource>,
}

impl CudaSources {
    /// A collection on the default wgpu device.
    ///
    /// # Errors
    /// No wgpu device to build the definitions on (install a Vulkan driver such as Mesa's
    /// lavapipe).
    pub fn new() -> crate::Result<Self> {
        let client =
            catch_unwind(|| WgpuRuntime::client(&WgpuDevice::default())).map_err(|_| {
                HaaresError::KernelSource(
                    "no wgpu device to build the kernels' definitions on: install a Vulkan driver \
                     (Mesa's lavapipe: `apt-get install mesa-vulkan-drivers`) and set \
                     XDG_RUNTIME_DIR"
                        .into(),
                )
            })?;
        Ok(Self {
            client,
            kernels: Vec::new(),
        })
    }

    /// The client kernels are defined on: the second argument of a kernel's generated `new`.
    pub fn client(&self) -> ComputeClient<WgpuRuntime> {
        self.client.clone()
    }

    /// Adds `kernel`, launched with `cube_dim`, compiled as CubeCL's CUDA runtime compiles it
    /// (checked bounds, the options it sets on compute capability 9.0 and up).
    ///
    /// # Errors
    /// CubeCL could not define or compile the kernel: the message names it and `variant`.
    pub fn add<K: CubeKernel>(
        &mut self,
        kernel: &K,
        variant: impl Into<String>,
        cube_dim: CubeDim,
    ) -> crate::Result<()> {
        let variant = variant.into();
        let failed = |message: String| HaaresError::KernelSource(message);
        let definition = catch_unwind(AssertUnwindSafe(|| kernel.define()))
            .map_err(|_| failed(format!("CubeCL could not define a kernel ({variant})")))?;
        let name = definition.options.kernel_name.clone();
        let mut options = <CudaCompiler as Compiler>::CompilationOptions::default();
        let features = &mut options.supports_features;
        (features.fast_math, features.grid_constants) = (true, true);
        (features.clusters, features.elect_sync, features.fast_tanh) = (true, true, true);
        let address = StorageType::Scalar(ElemType::UInt(UIntKind::U32));
        let compiled = catch_unwind(AssertUnwindSafe(|| {
            CudaCompiler::default().compile(definition, &options, ExecutionMode::Checked, address)
        }))
        .map_err(|_| {
            failed(format!(
                "CubeCL's CUDA compiler panicked on kernel {name} ({variant})"
            ))
        })?
        .map_err(|error| {
            failed(format!(
                "CubeCL's CUDA compiler, kernel {name} ({variant}): {error:?}"
            ))
        })?;
        self.kernels.push(CudaKernelSource {
            name,
            variant,
            threads: cube_dim.num_elems(),
            source: compiled.to_string(),
        });
        Ok(())
    }

    /// The sources collected, in the order they were added.
    pub fn into_kernels(self) -> Vec<CudaKernelSource> {
        self.kernels
    }
}

/// The plane (warp) reductions CUDA's launches choose (`cube_shared::plane_reduction`: CUDA
/// reports plane operations and one 32-wide plane size, which divides every row cube).
pub const CUDA_PLANES: bool = true;

/// Settings of a kernel launched with `cube_dim`, addressed with 32-bit indices (as Burn's
/// cube backends launch these kernels at the sizes they take).
pub fn settings(cube_dim: CubeDim) -> KernelSettings {
    KernelSettings::default()
        .cube_dim(cube_dim)
        .address_type(AddressType::U32)
}

/// The compilation argument of a tensor that is not written in place.
pub fn tensor() -> TensorCompilationArg {
    TensorCompilationArg { inplace: None }
}

/// The compilation argument of a sequence of `count` tensors, none written in place.
pub fn tensors<S: FromIterator<TensorCompilationArg>>(count: usize) -> S {
    (0..count).map(|_| tensor()).collect()
}

/// `f32`, the element type the kernels are compiled for on the GPU backends.
pub fn float() -> StorageType {
    StorageType::Scalar(ElemType::Float(FloatKind::F32))
}

/// `i32`, the cube backends' integer element (token ids).
pub fn int() -> StorageType {
    StorageType::Scalar(ElemType::Int(IntKind::I32))
}

/// The cube of an element-wise launch on a large tensor on CUDA: eight 32-thread planes, as
/// CubeCL's `CubeDim::new` gives it.
pub fn elementwise_cube() -> CubeDim {
    CubeDim::new_2d(32, 8)
}
