//! The CUDA sources of RMSNorm's kernels (`crate::cuda_sources`), at the cube size their launch
//! sites use on CUDA.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::kernels::{rms_norm_backward_kernel, rms_norm_kernel};
use crate::cuda_sources::{CudaSources, float, settings, tensor};
use crate::ops::cube_shared::ROW_THREADS;

/// Adds RMSNorm's two kernels, one cube of [`ROW_THREADS`] per row.
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> Result<(), String> {
    let (row, threads) = (CubeDim::new_1d(ROW_THREADS as u32), ROW_THREADS);
    let variant = format!("{threads} threads per row");
    let (client, s) = (sources.client(), settings(row));
    let t = tensor;
    let kernel = rms_norm_kernel::RmsNormKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        (),
        threads,
        float(),
    );
    sources.add(&kernel, &variant, row)?;
    let kernel = rms_norm_backward_kernel::RmsNormBackwardKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        (),
        threads,
        float(),
    );
    sources.add(&kernel, &variant, row)?;
    Ok(())
}
