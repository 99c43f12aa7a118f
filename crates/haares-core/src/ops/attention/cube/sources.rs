//! The CUDA sources of the fused attention's kernels (`crate::cuda_sources`): these keep tiles
//! of rows per cube, and their registers and spills are what the static report is for.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime;

use super::grad_kernels::{attention_key_value_grad_kernel, attention_query_grad_kernel};
use super::kernels::attention_forward_kernel;
use super::{MAX_HEAD_DIM, tilings};
use crate::cuda_sources::{CudaSources, float, settings, tensor};

/// Adds causal attention's three kernels (forward, ∂Q, ∂K and ∂V) for `f32` heads `head_dim`
/// wide, as the fused pair launches them.
///
/// # Errors
/// A head width the kernels do not take, or CubeCL's compiler.
pub(in crate::ops) fn attention_sources(
    sources: &mut CudaSources,
    head_dim: usize,
) -> crate::Result<()> {
    if !(1..=MAX_HEAD_DIM).contains(&head_dim) {
        return Err(crate::HaaresError::KernelSource(format!(
            "head width {head_dim}: the fused attention takes 1 to {MAX_HEAD_DIM}"
        )));
    }
    let [forward, query_grad, key_value] = tilings(head_dim);
    let variant = format!("d_h = {head_dim}");
    let cube = |tiling: super::Tiling| CubeDim::new_1d(tiling.threads());
    let kernel = attention_forward_kernel::AttentionForwardKernel::<WgpuRuntime>::new(
        settings(cube(forward)),
        sources.client(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        head_dim,
        forward.rows,
        forward.others,
        forward.groups,
        forward.stack,
        float(),
    );
    sources.add(&kernel, &variant, cube(forward))?;
    let kernel = attention_query_grad_kernel::AttentionQueryGradKernel::<WgpuRuntime>::new(
        settings(cube(query_grad)),
        sources.client(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        head_dim,
        query_grad.rows,
        query_grad.others,
        query_grad.groups,
        query_grad.stack,
        float(),
    );
    sources.add(&kernel, &variant, cube(query_grad))?;
    let kernel = attention_key_value_grad_kernel::AttentionKeyValueGradKernel::<WgpuRuntime>::new(
        settings(cube(key_value)),
        sources.client(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        head_dim,
        key_value.rows,
        key_value.others,
        key_value.groups,
        key_value.stack,
        float(),
    );
    sources.add(&kernel, &variant, cube(key_value))
}
