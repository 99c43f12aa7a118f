//! The CUDA sources of the routing operator's kernels (`crate::cuda_sources`), at the cube sizes
//! and compile-time settings their launch sites use on CUDA.

use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::cubecl::wgpu::WgpuRuntime as W;

use super::cube_shared::MAX_SLOTS_PER_LAUNCH;
use super::read::cube::QUERY_THREADS;
use super::read::cube::kernels::{
    query_gradients_kernel, read_backward_kernel, read_forward_kernel,
};
use super::sums::cube::kernels::{add_scaled_rows_kernel, row_dots_kernel, weighted_sum_kernel};
use super::write::cube::kernels::{
    pair_write_kernel, rms_match_multiplier_kernel, signed_sum_with_mean_square_kernel,
};
use crate::cuda_sources::{
    CUDA_PLANES, CudaSources, elementwise_cube, float, settings, tensor, tensors,
};
use crate::ops::cube_shared::ROW_THREADS;

/// Slot counts the sources are compiled at: a HAARES read's first (the embedding, a block's sum
/// and its detail), the widest read of the paper's runs (HAARES at N = 4 blocks: the embedding,
/// three completed pairs and the active pair, `2N + 1`), and the most one launch reads on CUDA.
/// Each count is a kernel of its own.
const SLOT_COUNTS: [usize; 3] = [3, 9, MAX_SLOTS_PER_LAUNCH];

/// Adds every routing kernel: the fused reads' (forward, backward, the query's gradients), the
/// writes' and the row kernels.
///
/// # Errors
/// CubeCL's compiler.
pub(in crate::ops) fn cuda_sources(sources: &mut CudaSources) -> crate::Result<()> {
    for count in SLOT_COUNTS {
        read_kernels(sources, count)?;
        slot_kernels(sources, count)?;
    }
    let query = CubeDim::new_1d(QUERY_THREADS as u32);
    let kernel = query_gradients_kernel::QueryGradientsKernel::<W>::new(
        settings(query),
        sources.client(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        tensor(),
        (),
        QUERY_THREADS,
        float(),
    );
    sources.add(&kernel, format!("{QUERY_THREADS} threads"), query)?;
    write_kernels(sources)
}

/// A read's forward and backward kernels over `count` slots, with every compile-time option off
/// and on.
fn read_kernels(sources: &mut CudaSources, count: usize) -> crate::Result<()> {
    let row = CubeDim::new_1d(ROW_THREADS as u32);
    let (client, s, t) = (sources.client(), settings(row), tensor);
    for on in [false, true] {
        let (forward, backward) = if on {
            ("norm", "norm, bias, weights' gradient, folded mean squares")
        } else {
            ("no norm", "no options")
        };
        let kernel = read_forward_kernel::ReadForwardKernel::<W>::new(
            s.clone(),
            client.clone(),
            tensors(count),
            tensors(count),
            tensors(count),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            (),
            (),
            (),
            (),
            on,
            ROW_THREADS,
            CUDA_PLANES,
            float(),
        );
        sources.add(&kernel, format!("{count} slots, {forward}"), row)?;
        let kernel = read_backward_kernel::ReadBackwardKernel::<W>::new(
            s.clone(),
            client.clone(),
            tensors(count),
            tensors(count),
            tensors(count),
            tensors(count),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            (),
            (),
            (),
            (),
            (),
            (),
            (),
            on,
            on,
            on,
            on,
            ROW_THREADS,
            CUDA_PLANES,
            float(),
        );
        sources.add(&kernel, format!("{count} slots, {backward}"), row)?;
    }
    Ok(())
}

/// The plain primitives over `count` slots: each token's dot products with a row, and the
/// weighted sum.
fn slot_kernels(sources: &mut CudaSources, count: usize) -> crate::Result<()> {
    let row = CubeDim::new_1d(ROW_THREADS as u32);
    let variant = format!("{count} slots");
    let kernel = row_dots_kernel::RowDotsKernel::<W>::new(
        settings(row),
        sources.client(),
        tensors(count),
        tensor(),
        tensor(),
        (),
        (),
        ROW_THREADS,
        float(),
    );
    sources.add(&kernel, &variant, row)?;
    let cube = elementwise_cube();
    let kernel = weighted_sum_kernel::WeightedSumKernel::<W>::new(
        settings(cube),
        sources.client(),
        tensors(count),
        tensor(),
        tensor(),
        float(),
    );
    sources.add(&kernel, &variant, cube)
}

/// The accumulators' kernels: HAARES's pair write, its RMS matching, a sum with its mean square,
/// and a gradient's scaled rows.
fn write_kernels(sources: &mut CudaSources) -> crate::Result<()> {
    let (row, cube) = (CubeDim::new_1d(ROW_THREADS as u32), elementwise_cube());
    let (client, t) = (sources.client(), tensor);
    for own_detail in [false, true] {
        let kernel = pair_write_kernel::PairWriteKernel::<W>::new(
            settings(row),
            client.clone(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            t(),
            (),
            (),
            (),
            (),
            ROW_THREADS,
            own_detail,
            CUDA_PLANES,
            float(),
        );
        let variant = if own_detail {
            "own detail"
        } else {
            "shared detail"
        };
        sources.add(&kernel, variant, row)?;
    }
    let kernel = signed_sum_with_mean_square_kernel::SignedSumWithMeanSquareKernel::<W>::new(
        settings(row),
        client.clone(),
        t(),
        t(),
        t(),
        t(),
        (),
        ROW_THREADS,
        CUDA_PLANES,
        float(),
    );
    sources.add(&kernel, "", row)?;
    let kernel = rms_match_multiplier_kernel::RmsMatchMultiplierKernel::<W>::new(
        settings(cube),
        client.clone(),
        t(),
        t(),
        t(),
        t(),
        (),
        (),
        (),
        float(),
    );
    sources.add(&kernel, "", cube)?;
    for accumulated in [false, true] {
        let kernel = add_scaled_rows_kernel::AddScaledRowsKernel::<W>::new(
            settings(cube),
            client.clone(),
            t(),
            t(),
            t(),
            t(),
            (),
            (),
            (),
            accumulated,
            float(),
        );
        let variant = if accumulated { "accumulated" } else { "fresh" };
        sources.add(&kernel, variant, cube)?;
    }
    Ok(())
}
