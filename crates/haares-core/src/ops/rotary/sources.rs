//! The CUDA sources of RoPE's kernels (`crate::cuda_sources`), each direction a variant of its
//! own.

use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::kernels::{rotary_kernel, rotary_pack_kernel};
use crate::cuda_sources::{CudaSources, elementwise_cube, float, settings, tensor};

/// Adds RoPE's two kernels (separate heads, packed projection), forward and back, one thread per
/// element.
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> crate::Result<()> {
    let cube = elementwise_cube();
    let (client, s) = (sources.client(), settings(cube));
    let t = tensor;
    for back in [false, true] {
        let variant = if back { "back" } else { "forward" };
        let kernel = rotary_kernel::RotaryKernel::<W>::new(
            s.clone(),
            client.clone(),
            t(),
            t(),
            t(),
            t(),
            (),
            back,
            true,
            float(),
        );
        sources.add(&kernel, variant, cube)?;
        let kernel = rotary_pack_kernel::RotaryPackKernel::<W>::new(
            s.clone(),
            client.clone(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            (),
            back,
            true,
            float(),
        );
        sources.add(&kernel, variant, cube)?;
    }
    Ok(())
}
