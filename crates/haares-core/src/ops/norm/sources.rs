//! The CUDA sources of RMSNorm's kernels (`crate::cuda_sources`), at the cube size their launch
//! sites use on CUDA.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::kernels::{column_sums_kernel, rms_norm_backward_kernel, rms_norm_kernel};
use super::cube::{COLUMN_THREADS, ROWS_PER_CUBE};
use crate::cuda_sources::{CUDA_PLANES, CudaSources, float, settings, tensor};
use crate::ops::cube_shared::ROW_THREADS;

/// Adds RMSNorm's kernels: the forward pass and the backward pass's first launch, one cube of
/// [`ROW_THREADS`] per row or block of rows (the backward pass at the paper's widths 128 and 512,
/// which it is compiled for one by one), and the column sums, [`COLUMN_THREADS`] a cube.
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> crate::Result<()> {
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
        CUDA_PLANES,
        float(),
    );
    sources.add(&kernel, &variant, row)?;
    for width in [128, 512] {
        let kernel = rms_norm_backward_kernel::RmsNormBackwardKernel::<W>::new(
            s.clone(),
            client.clone(),
            t(),
            t(),
            t(),
            t(),
            t(),
            (),
            (),
            threads,
            width,
            CUDA_PLANES,
            float(),
        );
        let variant = format!("{threads} threads, {ROWS_PER_CUBE} rows per cube, d = {width}");
        sources.add(&kernel, &variant, row)?;
    }
    let column = CubeDim::new_1d(COLUMN_THREADS as u32);
    let kernel = column_sums_kernel::ColumnSumsKernel::<W>::new(
        settings(column),
        client.clone(),
        t(),
        t(),
        float(),
    );
    sources.add(
        &kernel,
        &format!("{COLUMN_THREADS} columns per cube"),
        column,
    )?;
    Ok(())
}
