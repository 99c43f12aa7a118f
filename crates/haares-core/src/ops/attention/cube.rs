//! Causal attention as a flash-style CubeCL kernel pair: one launch forward, two backward, where
//! the plain operations launch two matrix products, the softmax and four copies of moved heads
//! forward (7), and four products, the softmax's backward and six copies backward (11: a
//! CUDA step costs its launch count).
//!
//! Queries, keys and values are read in the projections' own `[batch, seq, heads, d_h]` layout,
//! through their strides, so the heads are never moved. Each cube takes a tile of consecutive
//! positions of one head of one batch row ([`tilings`]); it loads the other side's rows into
//! shared memory a tile at a time, leaves the tile's weights there, then each thread adds the
//! weighted rows into the columns it owns of its positions. Each thread owns several positions
//! (`stack`) and several columns, so that each value it reads from shared memory serves several
//! multiply-adds: with one position a thread, each multiply-add read its own operand.
//!
//! - **Forward**: each query keeps its running maximum `m`, its sum `l = Σ e^{s − m}` and its
//!   output `o = Σ e^{s − m} v`, rescaled when `m` grows (the online softmax), and writes `o / l`
//!   and its log-sum-exp `m + ln l`. No `[seq, seq]` tensor is written.
//! - **∂Q**: each query recomputes `p = e^{s − lse}` from its log-sum-exp, with
//!   `Δ = Σ_e ∂o_e o_e`, `∂s = p (∂o · v − Δ)` and `∂q = Σ_keys ∂s k`; it writes `Δ` for the next.
//! - **∂K, ∂V**: each key walks the queries that see it: `∂v = Σ p ∂o`, `∂k = Σ ∂s q`.
//!
//! A thread keeps at most 32 accumulators per output in registers, whatever the head's width:
//! with a thread per position and whole rows in registers, `ptxas` gave the key–value kernel
//! 255 registers and 400 bytes of spills at `d_h = 64` on sm_90 (docs/benchmarks.md, "Kernels
//! compiled for CUDA without a GPU"). The head width is a compile-time constant;
//! [`MAX_HEAD_DIM`] bounds the shared memory a cube takes.
//! `tests/portability.rs` checks the kernels against f64 on wgpu and CUDA
//! (`tests/core/attention_checks.rs`).

use burn::tensor::{Shape, Tensor};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::AttentionBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{empty_like, primitive};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
/// The attention's output and each query's log-sum-exp.
type OutputAndSums<R, F, I, BT> = (Tensor<Cube<R, F, I, BT>, 4>, Tensor<Cube<R, F, I, BT>, 3>);

/// The widest head the kernels take.
pub(in crate::ops) const MAX_HEAD_DIM: usize = 128;

impl<R, F, I, BT> AttentionBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn fuses_causal_attention(head_dim: usize) -> bool {
        head_dim <= MAX_HEAD_DIM
    }

    fn causal_attention_forward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
    ) -> (Tensor<Self, 4>, Tensor<Self, 3>) {
        causal_attention_forward(query, key, value)
    }

    fn causal_attention_backward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
        output: Tensor<Self, 4>,
        logsumexp: Tensor<Self, 3>,
        grad: Tensor<Self, 4>,
    ) -> [Tensor<Self, 4>; 3] {
        causal_attention_backward(query, key, value, output, logsumexp, grad)
    }
}

/// How one kernel divides its work: a cube takes `rows` positions of one head and walks the
/// other side `others` positions at a time; `groups` threads share a row (each owning every
/// `groups`-th column of the head and every `groups`-th position of the other side's tile), and
/// each thread owns `stack` rows, so that a value it reads from shared memory serves `stack`
/// multiply-adds (register blocking).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tiling {
    rows: usize,
    others: usize,
    groups: usize,
    stack: usize,
}

impl Tiling {
    fn threads(self) -> u32 {
        (self.rows / self.stack * self.groups) as u32
    }

    /// The values a thread keeps in registers for one output: its columns of each of its rows.
    #[cfg(test)]
    fn accumulators(self, head_dim: usize) -> usize {
        self.stack * head_dim.div_ceil(self.groups)
    }

    /// The products a thread keeps in registers per tile: its positions of the other side
    /// against each of its rows.
    #[cfg(test)]
    fn products(self) -> usize {
        self.stack * self.others.div_ceil(self.groups)
    }
}

/// The tilings of the three kernels (forward, ∂Q, ∂K and ∂V) for heads `head_dim` wide. A thread
/// owns at most 8 columns of a row and at least 4 threads share one, so that its accumulators and
/// products stay in registers at every width (at most 32 of each, [`Tiling::accumulators`] and
/// [`Tiling::products`]); the tiles shrink as the head grows so that each kernel's shared memory
/// (`shared_floats` in the tests) fits 32 KiB. `docs/notebook/cuda-static.md` gives each
/// kernel's registers, spills and occupancy compiled for sm_90a.
fn tilings(head_dim: usize) -> [Tiling; 3] {
    let groups = head_dim.div_ceil(8).max(4);
    let tiling = |rows, others, stack| Tiling {
        rows,
        others,
        groups,
        stack,
    };
    match head_dim {
        0..=32 => [tiling(64, 32, 4), tiling(64, 16, 4), tiling(64, 16, 2)],
        33..=64 => [tiling(32, 32, 4), tiling(32, 16, 4), tiling(32, 16, 2)],
        _ => [tiling(16, 16, 2), tiling(16, 8, 2), tiling(16, 8, 2)],
    }
}

/// [`AttentionBackend::causal_attention_forward`] in one
/// launch: the output `[batch, seq, heads, d_h]` and each query's log-sum-exp
/// `[batch, seq, heads]`.
fn causal_attention_forward<R, F, I, BT>(
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
    let [tiling, ..] = tilings(head_dim);
    let (cube_count, cube_dim) = per_tile(&query, tiling);
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
        tiling.rows,
        tiling.others,
        tiling.groups,
        tiling.stack,
        query.dtype.into(),
    );
    (from_primitive(output), from_primitive(logsumexp))
}

/// [`AttentionBackend::causal_attention_backward`] in two
/// launches: `∂Q` (and each query's `Δ`), then `∂K` and `∂V`.
fn causal_attention_backward<R, F, I, BT>(
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
    let [_, query_tiling, key_value_tiling] = tilings(head_dim);
    let (cube_count, cube_dim) = per_tile(&query, query_tiling);
    grad_kernels::attention_query_grad_kernel::launch::<R>(
        &client,
        cube_count,
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
        query_tiling.rows,
        query_tiling.others,
        query_tiling.groups,
        query_tiling.stack,
        query.dtype.into(),
    );
    let (cube_count, cube_dim) = per_tile(&query, key_value_tiling);
    grad_kernels::attention_key_value_grad_kernel::launch::<R>(
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
        key_value_tiling.rows,
        key_value_tiling.others,
        key_value_tiling.groups,
        key_value_tiling.stack,
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

/// One cube per tile of `tiling.rows` positions of every head of every batch row.
fn per_tile<R: CubeRuntime>(like: &CubeTensor<R>, tiling: Tiling) -> (CubeCount, CubeDim) {
    let shape = like.meta.shape();
    let cubes = shape[0] * shape[2] * shape[1].div_ceil(tiling.rows);
    let cube_dim = CubeDim::new_1d(tiling.threads());
    (
        calculate_cube_count_elemwise(&like.client, cubes * tiling.threads() as usize, cube_dim),
        cube_dim,
    )
}

mod kernels;

mod grad_kernels;

#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(in crate::ops) mod sources;

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared memory a cube may take: 32 KiB, the limit of Mesa's software Vulkan and of many
    /// devices (CUDA's is 48 KiB). Past it lavapipe once returned wrong gradients without an error.
    const SHARED_BYTES: usize = 32 * 1024;

    /// The shared memory each kernel declares, in elements: its own rows and the other side's, `d_h
    /// + 1` apart, and the products between them (`cube/kernels.rs`).
    fn shared_floats(head_dim: usize) -> [usize; 3] {
        let [forward, query_grad, key_value] = tilings(head_dim);
        let tile = |positions: usize| positions * (head_dim + 1);
        let products = |tiling: Tiling| tiling.rows * (tiling.others + 1);
        [
            tile(forward.rows)
                + 2 * tile(forward.others)
                + products(forward)
                + forward.rows * forward.groups,
            2 * tile(query_grad.rows)
                + 2 * tile(query_grad.others)
                + products(query_grad)
                + query_grad.rows * query_grad.groups,
            2 * tile(key_value.rows)
                + 2 * tile(key_value.others)
                + 2 * products(key_value)
                + 2 * key_value.others,
        ]
    }

    /// Every width the kernels take fits the shared memory bound; every thread owns whole rows of
    /// its tile, at most 8 columns of each and at most 32 accumulators and products; and no cube
    /// has more threads than every device allows.
    #[test]
    fn tilings_fit_the_shared_memory_bound() {
        for head_dim in 1..=MAX_HEAD_DIM {
            for (floats, tiling) in shared_floats(head_dim).into_iter().zip(tilings(head_dim)) {
                assert!(
                    floats * 4 <= SHARED_BYTES,
                    "d_h {head_dim}: {floats} f32 values"
                );
                assert_eq!(tiling.rows % tiling.stack, 0, "d_h {head_dim}: {tiling:?}");
                assert!(
                    head_dim.div_ceil(tiling.groups) <= 8,
                    "d_h {head_dim}: {tiling:?}"
                );
                assert!(
                    tiling.accumulators(head_dim) <= 32 && tiling.products() <= 32,
                    "d_h {head_dim}: {tiling:?}"
                );
                assert!(tiling.threads() <= 256, "d_h {head_dim}: {tiling:?}");
            }
        }
    }
}
