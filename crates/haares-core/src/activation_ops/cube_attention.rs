//! Causal attention as a flash-style CubeCL kernel pair (`cube.rs` has the other activations and
//! the shared pieces): one launch forward, two backward, where the plain operations launch two
//! matrix products, the softmax and four copies of moved heads forward (7), and four products,
//! the softmax's backward and six copies backward (11; issue 34: a CUDA step costs its launch
//! count).
//!
//! Queries, keys and values are read in the projections' own `[batch, seq, heads, d_h]` layout,
//! through their strides, so the heads are never moved. Each cube takes 32 (or 16, [`tile_for`])
//! consecutive positions of one head of one batch row, one thread per position; the cube's threads load the
//! rows the other side needs into shared memory one tile at a time, and each thread walks the
//! tile's rows its position may see.
//!
//! - **Forward**: each query keeps its running maximum `m`, its sum `l = Σ e^{s − m}` and its
//!   output `o = Σ e^{s − m} v`, rescaled when `m` grows (the online softmax), and writes `o / l`
//!   and its log-sum-exp `m + ln l`. No `[seq, seq]` tensor is written.
//! - **∂Q**: each query recomputes `p = e^{s − lse}` from its log-sum-exp, with
//!   `Δ = Σ_e ∂o_e o_e`, `∂s = p (∂o · v − Δ)` and `∂q = Σ_keys ∂s k`; it writes `Δ` for the next.
//! - **∂K, ∂V**: each key walks the queries that see it: `∂v = Σ p ∂o`, `∂k = Σ ∂s q`.
//!
//! Every thread keeps its own row and its accumulators in registers (`d_h` values each), so the
//! head width is a compile-time constant; [`MAX_HEAD_DIM`] bounds the shared memory a cube takes.
//! `tests/core/attention_checks.rs` checks the kernels against f64 on wgpu and CUDA.

use burn::tensor::{Shape, Tensor};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::cube::{empty_like, primitive};
use crate::autodiff_node::from_primitive;

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
/// The attention's output and each query's log-sum-exp.
type OutputAndSums<R, F, I, BT> = (Tensor<Cube<R, F, I, BT>, 4>, Tensor<Cube<R, F, I, BT>, 3>);

/// The widest head the kernels take.
pub(super) const MAX_HEAD_DIM: usize = 128;

/// Positions per cube, and rows per shared-memory tile, for heads `head_dim` wide: 32, or 16 for
/// heads wider than 64, so that the key–value kernel's two tiles of `tile × d_h` values and two
/// of `tile` (`tile · (2 d_h + 2)` f32 values) stay within 32 KiB of shared memory, the limit of
/// Mesa's software Vulkan and of many devices (CUDA's is 48 KiB). At `d_h = 128` and a tile of 32
/// they took 33,024 bytes, and lavapipe returned wrong key gradients without an error.
fn tile_for(head_dim: usize) -> usize {
    match head_dim {
        0..=64 => 32,
        _ => 16,
    }
}

/// [`causal_attention_forward`](super::ActivationBackend::causal_attention_forward) in one
/// launch: the output `[batch, seq, heads, d_h]` and each query's log-sum-exp
/// `[batch, seq, heads]`.
pub(super) fn causal_attention_forward<R, F, I, BT>(
    query: Tensor<Cube<R, F, I, BT>, 4>,
    key: Tensor<Cube<R, F, I, BT>, 4>,
    value: Tensor<Cube<R, F, I, BT>, 4>,
) -> OutputAndSums<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let head_dim = query.dims()[3];
    let (query, key, value) = (primitive(query), primitive(key), primitive(value));
    let output = empty_like(&query);
    let logsumexp = per_query(&query);
    let tile = tile_for(head_dim);
    let (cube_count, cube_dim) = per_tile(&query, tile);
    kernels::attention_forward_kernel::launch::<R>(
        &query.client.clone(),
        cube_count,
        cube_dim,
        query.clone().into_tensor_arg(),
        key.into_tensor_arg(),
        value.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        logsumexp.clone().into_tensor_arg(),
        head_dim,
        tile,
        query.dtype.into(),
    );
    (from_primitive(output), from_primitive(logsumexp))
}

/// [`causal_attention_backward`](super::ActivationBackend::causal_attention_backward) in two
/// launches: `∂Q` (and each query's `Δ`), then `∂K` and `∂V`.
pub(super) fn causal_attention_backward<R, F, I, BT>(
    query: Tensor<Cube<R, F, I, BT>, 4>,
    key: Tensor<Cube<R, F, I, BT>, 4>,
    value: Tensor<Cube<R, F, I, BT>, 4>,
    output: Tensor<Cube<R, F, I, BT>, 4>,
    logsumexp: Tensor<Cube<R, F, I, BT>, 3>,
    grad: Tensor<Cube<R, F, I, BT>, 4>,
) -> [Tensor<Cube<R, F, I, BT>, 4>; 3]
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let head_dim = query.dims()[3];
    let (query, key, value) = (primitive(query), primitive(key), primitive(value));
    let (output, logsumexp, grad) = (primitive(output), primitive(logsumexp), primitive(grad));
    let (query_grad, key_grad, value_grad) =
        (empty_like(&query), empty_like(&query), empty_like(&query));
    let delta = per_query(&query);
    let client = query.client.clone();
    let tile = tile_for(head_dim);
    let (cube_count, cube_dim) = per_tile(&query, tile);
    kernels::attention_query_grad_kernel::launch::<R>(
        &client,
        cube_count.clone(),
        cube_dim,
        query.clone().into_tensor_arg(),
        key.clone().into_tensor_arg(),
        value.clone().into_tensor_arg(),
        output.into_tensor_arg(),
        logsumexp.clone().into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        query_grad.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        head_dim,
        tile,
        query.dtype.into(),
    );
    kernels::attention_key_value_grad_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        query.clone().into_tensor_arg(),
        key.into_tensor_arg(),
        value.into_tensor_arg(),
        logsumexp.into_tensor_arg(),
        delta.into_tensor_arg(),
        grad.into_tensor_arg(),
        key_grad.clone().into_tensor_arg(),
        value_grad.clone().into_tensor_arg(),
        head_dim,
        tile,
        query.dtype.into(),
    );
    [query_grad, key_grad, value_grad].map(from_primitive)
}

/// A contiguous `[batch, seq, heads]` tensor: one value per query of `like`.
fn per_query<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    let shape = like.meta.shape();
    empty_device_contiguous_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        Shape::new([shape[0], shape[1], shape[2]]),
        like.dtype,
    )
}

/// One cube of `tile` threads per tile of positions of every head of every batch row.
fn per_tile<R: CubeRuntime>(like: &CubeTensor<R>, tile: usize) -> (CubeCount, CubeDim) {
    let shape = like.meta.shape();
    let cubes = shape[0] * shape[2] * shape[1].div_ceil(tile);
    let cube_dim = CubeDim::new_1d(tile as u32);
    (
        calculate_cube_count_elemwise(&like.client, cubes * tile, cube_dim),
        cube_dim,
    )
}

#[path = "cube_attention_kernels.rs"]
mod kernels;
