//! The device memory a training worker samples on the cube backends (CUDA, wgpu): CubeCL's
//! allocator statistics, with cuBLAS's workspaces on CUDA, which CubeCL's pool does not see.

use haares_train::backend::BackendKind;

/// Device allocator statistics of the cube backends (CUDA, wgpu), sampled at step boundaries:
/// CubeCL reports bytes in use and reserved but keeps no high-water mark of its own.
pub(super) struct DeviceMemory {
    backend: BackendKind,
    pub(super) in_use: Option<u64>,
    pub(super) reserved: Option<u64>,
}

impl DeviceMemory {
    pub(super) fn new(backend: BackendKind) -> Self {
        Self {
            backend,
            in_use: None,
            reserved: None,
        }
    }

    pub(super) fn sample(&mut self) {
        if let Some((in_use, reserved)) = device_memory_usage(self.backend) {
            self.in_use = Some(self.in_use.unwrap_or(0).max(in_use));
            self.reserved = Some(self.reserved.unwrap_or(0).max(reserved));
        }
    }
}

/// `(bytes in use, bytes reserved)` on the default device of a cube backend; `None` on CPU.
fn device_memory_usage(backend: BackendKind) -> Option<(u64, u64)> {
    #[allow(unused_imports)]
    use cubecl_usage::*;
    match backend {
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu | BackendKind::WgpuFusion => {
            usage::<cubecl::wgpu::WgpuRuntime>(&Default::default())
        }
        // cuBLAS's workspaces are device memory CubeCL's pool does not see (every device's: a
        // worker trains on one).
        #[cfg(feature = "cuda")]
        BackendKind::Cuda | BackendKind::CudaFusion => {
            let blas = haares_core::ops::matmul::cublas::workspace_bytes();
            usage::<cubecl::cuda::CudaRuntime>(&Default::default())
                .map(|(in_use, reserved)| (in_use + blas, reserved + blas))
        }
        _ => None,
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cubecl_usage {
    pub fn usage<R: cubecl::Runtime>(device: &R::Device) -> Option<(u64, u64)> {
        let usage = R::client(device).memory_usage().ok()?;
        Some((usage.bytes_in_use, usage.bytes_reserved))
    }
}

#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
mod cubecl_usage {}
