//! The CUDA sources of SwiGLU's kernels (`crate::cuda_sources`), at the cube size their launch
//! sites use on CUDA.

use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::kernels::{swiglu_backward_kernel, swiglu_kernel, swiglu_packed_backward_kernel};
use crate::cuda_sources::{CudaSources, elementwise_cube, float, settings, tensor};

/// Adds SwiGLU's three kernels (forward, backward, packed backward), one thread per element.
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> crate::Result<()> {
    let cube = elementwise_cube();
    let (client, s) = (sources.client(), settings(cube));
    let t = tensor;
    let kernel = swiglu_kernel::SwigluKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        true,
        float(),
    );
    sources.add(&kernel, "", cube)?;
    let kernel = swiglu_backward_kernel::SwigluBackwardKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        true,
        float(),
    );
    sources.add(&kernel, "", cube)?;
    let kernel = swiglu_packed_backward_kernel::SwigluPackedBackwardKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        float(),
    );
    sources.add(&kernel, "", cube)?;
    Ok(())
}
