//! The CUDA sources of the cross-entropy's kernels (`crate::cuda_sources`), at the cube size
//! their launch sites use on CUDA.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::TOTAL_THREADS;
use super::cube::kernels::{
    cross_entropy_backward_kernel, cross_entropy_kernel, loss_total_kernel,
};
use crate::cuda_sources::{CUDA_PLANES, CudaSources, float, int, settings, tensor};
use crate::ops::cube_shared::ROW_THREADS;

/// Adds the cross-entropy's two kernels, one cube of [`ROW_THREADS`] per row, and the loss's
/// total, one cube of [`TOTAL_THREADS`].
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> crate::Result<()> {
    let (row, threads) = (CubeDim::new_1d(ROW_THREADS as u32), ROW_THREADS);
    let variant = format!("{threads} threads per row");
    let (client, s) = (sources.client(), settings(row));
    let t = tensor;
    let kernel = cross_entropy_kernel::CrossEntropyKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        threads,
        CUDA_PLANES,
        [float(), int()],
    );
    sources.add(&kernel, &variant, row)?;
    let kernel = cross_entropy_backward_kernel::CrossEntropyBackwardKernel::<W>::new(
        s,
        client,
        t(),
        t(),
        t(),
        t(),
        t(),
        t(),
        threads,
        [float(), int()],
    );
    sources.add(&kernel, &variant, row)?;
    let cube = CubeDim::new_1d(TOTAL_THREADS as u32);
    let kernel = loss_total_kernel::LossTotalKernel::<W>::new(
        settings(cube),
        sources.client(),
        t(),
        t(),
        TOTAL_THREADS,
        CUDA_PLANES,
        float(),
    );
    sources.add(
        &kernel,
        &format!("one cube of {TOTAL_THREADS} threads"),
        cube,
    )
}
