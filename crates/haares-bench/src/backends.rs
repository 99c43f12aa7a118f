//! The backends this crate measures on: its own features, not haares-train's runner's.

use haares_train::backend::{self, BackendJob, BackendKind};
use haares_train::error::Result;

/// Runs `job` on `kind`: the CPU backends through [`haares_train::backend::dispatch`], each GPU
/// backend this crate's `wgpu`, `cuda` and `fusion` features include through haares-train's
/// `on_*` function for it. haares-train's `wgpu-backend` and `cuda-backend` leave its runner's
/// jobs uncompiled for the GPU, so the test build does not compile them (docs/releasing.md).
pub fn dispatch<J: BackendJob + Send>(kind: BackendKind, job: J) -> Result<J::Output>
where
    J::Output: Send,
{
    match kind {
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => backend::on_wgpu(job),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => backend::on_cuda(job),
        #[cfg(all(feature = "wgpu", feature = "fusion"))]
        BackendKind::WgpuFusion => backend::on_wgpu_fusion(job),
        #[cfg(all(feature = "cuda", feature = "fusion"))]
        BackendKind::CudaFusion => backend::on_cuda_fusion(job),
        other if other.is_cube() => Err(backend::not_dispatched(other)),
        cpu => backend::dispatch(cpu, job),
    }
}
