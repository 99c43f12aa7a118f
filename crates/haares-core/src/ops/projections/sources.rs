//! The CUDA sources of the packed projections' joins and splits (`crate::cuda_sources`), for two
//! and three parts.

use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::kernels::{concat_columns_kernel, split_columns_kernel};
use crate::cuda_sources::{CudaSources, elementwise_cube, float, settings, tensor};

/// Adds the join and split kernels for two and three parts, one thread per element.
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> crate::Result<()> {
    let cube = elementwise_cube();
    let (client, s) = (sources.client(), settings(cube));
    let t = tensor;
    for three in [false, true] {
        let variant = if three { "three parts" } else { "two parts" };
        let kernel = concat_columns_kernel::ConcatColumnsKernel::<W>::new(
            s.clone(),
            client.clone(),
            t(),
            t(),
            t(),
            t(),
            three,
            float(),
        );
        sources.add(&kernel, variant, cube)?;
        let kernel = split_columns_kernel::SplitColumnsKernel::<W>::new(
            s.clone(),
            client.clone(),
            t(),
            t(),
            t(),
            t(),
            three,
            float(),
        );
        sources.add(&kernel, variant, cube)?;
    }
    Ok(())
}
