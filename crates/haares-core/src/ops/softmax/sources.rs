//! The CUDA sources of the causal softmax's kernels (`crate::cuda_sources`), at the cube size
//! their launch sites use on CUDA.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::kernels::{causal_softmax_backward_kernel, causal_softmax_kernel};
use crate::cuda_sources::{CUDA_PLANES, CudaSources, float, settings, tensor};
use crate::ops::cube_shared::ROW_THREADS;

/// Adds the causal softmax's two kernels, one cube of [`ROW_THREADS`] per row.
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> crate::Result<()> {
    let (row, threads) = (CubeDim::new_1d(ROW_THREADS as u32), ROW_THREADS);
    let variant = format!("{threads} threads per row");
    let (client, s) = (sources.client(), settings(row));
    let t = tensor;
    let kernel = causal_softmax_kernel::CausalSoftmaxKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        threads,
        CUDA_PLANES,
        float(),
    );
    sources.add(&kernel, &variant, row)?;
    let kernel = causal_softmax_backward_kernel::CausalSoftmaxBackwardKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        threads,
        CUDA_PLANES,
        float(),
    );
    sources.add(&kernel, &variant, row)?;
    Ok(())
}
