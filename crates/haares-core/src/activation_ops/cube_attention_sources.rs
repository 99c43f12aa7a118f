//! The CUDA C++ that CubeCL generates for the fused attention's kernels, on a machine without a
//! GPU: registers and spills are a property of the compiled kernel, and `ptxas -v` reports them
//! from this source (`scripts/cuda-static/report.sh`; docs/benchmarks.md, "Kernels compiled for
//! CUDA without a GPU"). These are the kernels that keep arrays per thread; the others keep a
//! few scalars.
//!
//! CubeCL builds a kernel's definition from a compute client's device properties, and a CUDA
//! client needs a CUDA device, so the definitions are built on wgpu's (lavapipe's, on a machine
//! without a GPU) and compiled by CubeCL's CUDA compiler, with the options its CUDA runtime
//! takes on compute capability 9.0 and up. These kernels read no device property.

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn_cubecl::cubecl::Compiler;
use burn_cubecl::cubecl::cuda::CudaCompiler;
use burn_cubecl::cubecl::ir::{ElemType, FloatKind, StorageType, UIntKind};
use burn_cubecl::cubecl::prelude::{
    AddressType, CubeDim, CubeKernel, ExecutionMode, KernelSettings, Runtime, TensorCompilationArg,
};
use burn_cubecl::cubecl::wgpu::{WgpuDevice, WgpuRuntime};

use super::grad_kernels::{attention_key_value_grad_kernel, attention_query_grad_kernel};
use super::kernels::attention_forward_kernel;
use super::{MAX_HEAD_DIM, Tiling, tilings};

/// One kernel's CUDA C++, as CubeCL's CUDA runtime hands it to NVRTC.
#[derive(Clone, Debug)]
pub struct CudaKernelSource {
    /// The kernel's entry point in the source.
    pub name: String,
    /// The head width it was generated for.
    pub head_dim: usize,
    /// Threads per cube it is launched with (the `__launch_bounds__` in the source).
    pub threads: u32,
    /// The source.
    pub source: String,
}

/// The CUDA C++ of causal attention's three kernels (forward, ∂Q, ∂K and ∂V) for `f32` heads
/// `head_dim` wide, as the fused pair launches them.
///
/// # Errors
/// A message saying what failed: a head width the kernels do not take, no wgpu device to build
/// the definitions on (install a Vulkan driver such as Mesa's lavapipe), or CubeCL's compiler.
pub fn attention_cuda_sources(head_dim: usize) -> Result<[CudaKernelSource; 3], String> {
    if !(1..=MAX_HEAD_DIM).contains(&head_dim) {
        return Err(format!(
            "head width {head_dim}: the fused attention takes 1 to {MAX_HEAD_DIM}"
        ));
    }
    let client = catch_unwind(|| WgpuRuntime::client(&WgpuDevice::default())).map_err(|_| {
        "no wgpu device to build the kernels' definitions on: install a Vulkan driver \
         (Mesa's lavapipe: `apt-get install mesa-vulkan-drivers`) and set XDG_RUNTIME_DIR"
            .to_string()
    })?;
    let [forward, query_grad, key_value] = tilings(head_dim);
    let float = StorageType::Scalar(ElemType::Float(FloatKind::F32));
    let tensor = || TensorCompilationArg { inplace: None };
    let settings = |tiling: Tiling| {
        KernelSettings::default()
            .cube_dim(CubeDim::new_1d(tiling.threads()))
            .address_type(AddressType::U32)
    };
    let forward_kernel = attention_forward_kernel::AttentionForwardKernel::<WgpuRuntime>::new(
        settings(forward),
        client.clone(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        head_dim,
        forward.rows,
        forward.others,
        forward.groups,
        float,
    );
    let query_kernel = attention_query_grad_kernel::AttentionQueryGradKernel::<WgpuRuntime>::new(
        settings(query_grad),
        client.clone(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        head_dim,
        query_grad.rows,
        query_grad.others,
        query_grad.groups,
        float,
    );
    let key_value_kernel =
        attention_key_value_grad_kernel::AttentionKeyValueGradKernel::<WgpuRuntime>::new(
            settings(key_value),
            client,
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            tensor(),
            head_dim,
            key_value.rows,
            key_value.others,
            key_value.groups,
            float,
        );
    Ok([
        cuda_source(&forward_kernel, forward, head_dim)?,
        cuda_source(&query_kernel, query_grad, head_dim)?,
        cuda_source(&key_value_kernel, key_value, head_dim)?,
    ])
}

/// `kernel` compiled by CubeCL's CUDA compiler, checked (as `launch` runs it), with the
/// options CubeCL's CUDA runtime sets on compute capability 9.0 and up.
fn cuda_source<K: CubeKernel>(
    kernel: &K,
    tiling: Tiling,
    head_dim: usize,
) -> Result<CudaKernelSource, String> {
    let definition = catch_unwind(AssertUnwindSafe(|| kernel.define()))
        .map_err(|_| format!("CubeCL could not define a kernel at head width {head_dim}"))?;
    let name = definition.options.kernel_name.clone();
    let mut options = <CudaCompiler as Compiler>::CompilationOptions::default();
    let features = &mut options.supports_features;
    (features.fast_math, features.grid_constants) = (true, true);
    (features.clusters, features.elect_sync, features.fast_tanh) = (true, true, true);
    let address = StorageType::Scalar(ElemType::UInt(UIntKind::U32));
    let compiled = CudaCompiler::default()
        .compile(definition, &options, ExecutionMode::Checked, address)
        .map_err(|error| format!("CubeCL's CUDA compiler, kernel {name}: {error:?}"))?;
    Ok(CudaKernelSource {
        name,
        head_dim,
        threads: tiling.threads(),
        source: compiled.to_string(),
    })
}
