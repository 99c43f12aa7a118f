//! The CUDA sources of the activations' kernels (`crate::cuda_sources`), at the cube sizes and
//! compile-time settings their launch sites use on CUDA.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube::ROW_THREADS;
use super::cube::kernels::{swiglu_backward_kernel, swiglu_kernel};
use super::cube_cross_entropy::kernels::{cross_entropy_backward_kernel, cross_entropy_kernel};
use super::cube_norm::kernels::{rms_norm_backward_kernel, rms_norm_kernel};
use super::cube_packed::kernels::{
    concat_columns_kernel, rotary_pack_kernel, split_columns_kernel, swiglu_packed_backward_kernel,
};
use super::cube_rotary::kernels::rotary_kernel;
use super::cube_softmax::kernels::{causal_softmax_backward_kernel, causal_softmax_kernel};
use crate::cuda_sources::{CudaSources, elementwise_cube, float, int, settings, tensor};

/// Adds every activation kernel: the fused attention's at each of `head_dims`, then the others.
///
/// # Errors
/// A head width the fused attention does not take, or CubeCL's compiler.
pub(crate) fn cuda_sources(sources: &mut CudaSources, head_dims: &[usize]) -> Result<(), String> {
    for &head_dim in head_dims {
        super::cube_attention::sources::attention_sources(sources, head_dim)?;
    }
    row_kernels(sources)?;
    elementwise_kernels(sources)
}

/// The kernels that take one cube of [`ROW_THREADS`] per row.
fn row_kernels(sources: &mut CudaSources) -> Result<(), String> {
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
    let kernel = causal_softmax_kernel::CausalSoftmaxKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        threads,
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
        float(),
    );
    sources.add(&kernel, &variant, row)?;
    let kernel = cross_entropy_kernel::CrossEntropyKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
        threads,
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
    sources.add(&kernel, &variant, row)
}

/// The kernels that take one thread per element, each in its compile-time variants.
fn elementwise_kernels(sources: &mut CudaSources) -> Result<(), String> {
    let cube = elementwise_cube();
    let (client, s) = (sources.client(), settings(cube));
    let t = tensor;
    let kernel =
        swiglu_kernel::SwigluKernel::<W>::new(s.clone(), client.clone(), t(), t(), t(), float());
    sources.add(&kernel, "", cube)?;
    let kernel = swiglu_backward_kernel::SwigluBackwardKernel::<W>::new(
        s.clone(),
        client.clone(),
        t(),
        t(),
        t(),
        t(),
        t(),
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
            float(),
        );
        sources.add(&kernel, variant, cube)?;
    }
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
