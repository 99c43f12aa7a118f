//! The CUDA sources of the optimizer's kernels (`haares_core::cuda_sources`), at the batch sizes
//! and cube sizes `cube.rs` launches them with on CUDA.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;
use haares_core::cuda_sources::{CudaSources, elementwise_cube, settings, tensor, tensors};

use super::cube::{MAX_BATCH, NORM_PARTS, NORM_THREADS};
use super::cube_kernels::{adamw_kernel, sum_of_squares_kernel, total_kernel};

/// Adds AdamW's update and the gradients' sums of squares, for a batch of one parameter and
/// for a full batch (each batch size is a kernel of its own), and the sum of their parts.
///
/// # Errors
/// CubeCL's compiler.
pub fn optimizer_cuda_sources(sources: &mut CudaSources) -> haares_core::Result<()> {
    let (cube, norm) = (elementwise_cube(), CubeDim::new_1d(NORM_THREADS as u32));
    for batch in [1, MAX_BATCH] {
        let variant = match batch {
            1 => "1 parameter".to_string(),
            _ => format!("{batch} parameters"),
        };
        let kernel = adamw_kernel::AdamwKernel::<W>::new(
            settings(cube),
            sources.client(),
            tensors(batch),
            tensors(batch),
            tensors(batch),
            tensors(batch),
            tensors(batch),
            tensors(batch),
            tensors(batch),
            (),
            (),
            (),
            (),
            (),
            (),
            (),
            (),
            (),
            (),
        );
        sources.add(&kernel, &variant, cube)?;
        let kernel = sum_of_squares_kernel::SumOfSquaresKernel::<W>::new(
            settings(norm),
            sources.client(),
            tensors(batch),
            tensor(),
            (),
            NORM_THREADS,
            NORM_PARTS,
        );
        sources.add(&kernel, &variant, norm)?;
    }
    let kernel = total_kernel::TotalKernel::<W>::new(
        settings(norm),
        sources.client(),
        tensor(),
        tensor(),
        NORM_THREADS,
    );
    sources.add(&kernel, "one cube", norm)?;
    Ok(())
}
