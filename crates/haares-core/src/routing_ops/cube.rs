//! The routing operator's primitives as CubeCL kernels on Burn's cube backends (CUDA, wgpu).
//!
//! Each kernel reads every source of a chunk in one pass: the sources arrive as a CubeCL
//! `Sequence` of tensors (one binding each, never stacked), so a chunk's size is bounded by the
//! device's storage bindings per kernel. [`naive`](super::naive) is the reference they are
//! tested against (`tests/cube/kernels.rs`, part of `tests/portability.rs`, on wgpu and CUDA).

use burn::tensor::Tensor;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeDim, LaunchArg, SequenceArg, TensorArg};
use burn_cubecl::kernel::into_contiguous_aligned;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::{
    PairWrite, ReadBackward, ReadBias, ReadForward, ReadGradients, ReadNorm, ReadQuery,
    RmsMatching, RoutingBackend, SlotRows, from_primitive,
};
use crate::config::RoutingPath;

/// Threads that share one token row in [`row_dots_kernel`].
pub(super) const ROW_THREADS: usize = 64;
/// Most sources one launch reads (fewer where the device allows fewer bindings).
pub(super) const MAX_SLOTS_PER_LAUNCH: usize = 16;
/// Bindings a launch needs besides its sources: the other input, the output and metadata.
const OTHER_BINDINGS: usize = 4;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> RoutingBackend
    for CubeBackend<R, F, I, BT>
{
    /// The fused path on CUDA, the reference path on wgpu. On an H200 (2026-11-28) every CUDA
    /// check passed, the operator on the kernels included, and Block AttnRes's fused steps took
    /// 0.82–0.89 s against the reference path's 1.17–1.28 s (docs/notebook/cuda.md). wgpu's kernels
    /// pass every check on lavapipe, a CPU Vulkan, but have not been timed on a GPU.
    /// `RoutingPath::Fused` selects the kernels on either.
    fn auto_routing() -> RoutingPath {
        if is_cuda::<R>() {
            RoutingPath::Fused
        } else {
            RoutingPath::Reference
        }
    }

    /// The read kernel holds each slot row as it forms the row's gradient: adding the mean
    /// square's share there costs no pass, and saves the mean squares' own backward passes and
    /// the additions of their gradients across reads.
    fn folds_mean_squares() -> bool {
        true
    }

    /// One launch where the read's slots fit one (`cube_read.rs`), else the composition.
    fn routing_read_forward(
        slots: &[SlotRows<Self>],
        query: &ReadQuery<Self>,
        bias: Option<&ReadBias<Self>>,
        epsilon: f64,
        norm: Option<&ReadNorm<Self>>,
    ) -> ReadForward<Self> {
        super::cube_read::read_forward(slots, query, bias, epsilon, norm)
            .unwrap_or_else(|| super::read::compose(slots, query, bias, epsilon, norm))
    }

    /// One launch, and the query's, key weight's and bias's gradients in one more, where the
    /// read's slots fit one launch (`cube_read.rs`); else the composition.
    fn routing_read_backward(
        read: ReadBackward<Self>,
        into: Vec<Option<Tensor<Self, 2>>>,
        wanted: &[bool],
        mean_squares_wanted: &[bool],
    ) -> ReadGradients<Self> {
        super::cube_read::read_backward(read, into, wanted, mean_squares_wanted).unwrap_or_else(
            |(read, into)| super::read::compose_backward(read, into, wanted, mean_squares_wanted),
        )
    }

    fn row_dots(slots: &[Tensor<Self, 2>], rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let rows = cube_tensor(rows);
        let chunk = slots_per_launch(&rows);
        let slots: Vec<_> = slots.iter().cloned().map(cube_tensor).collect();
        let mut parts: Vec<_> = slots
            .chunks(chunk)
            .map(|chunk| from_primitive(row_dots(chunk, rows.clone(), 1.0)))
            .collect();
        // Burn's concatenation copies even a single part.
        match parts.len() {
            1 => parts.pop().expect("one part"),
            _ => Tensor::cat(parts, 0),
        }
    }

    /// One launch: the row dots of the rows with themselves, divided by `d` in the kernel.
    fn row_mean_square(rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let rows = cube_tensor(rows);
        let sums = row_dots(std::slice::from_ref(&rows), rows.clone(), d_model as f64);
        from_primitive::<Self, 2>(sums).reshape([tokens, 1])
    }

    /// One launch (`cube_rows.rs`) where the tensor operations take a scalar product, a product
    /// and an addition.
    fn row_mean_square_backward(
        into: Option<Tensor<Self, 2>>,
        grad: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
    ) -> Tensor<Self, 2> {
        let [tokens, d_model] = rows.dims();
        let column = cube_tensor(grad.reshape([1, tokens]));
        from_primitive(super::cube_rows::add_scaled_rows(
            into.map(cube_tensor),
            &column,
            0,
            &cube_tensor(rows),
            2.0 / d_model as f64,
        ))
    }

    /// One launch (`cube_rows.rs`): the sum and its mean square.
    fn signed_sum_with_mean_square<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        let shape = sum.dims();
        let d_model = shape[D - 1];
        let tokens = sum.shape().num_elements() / d_model;
        let rows = |tensor: Tensor<Self, D>| cube_tensor(tensor.reshape([tokens, d_model]));
        let (output, mean_square) =
            super::cube_rows::signed_sum_with_mean_square(&rows(sum), &rows(term), sign);
        let mut mean_square_shape = shape;
        mean_square_shape[D - 1] = 1;
        (
            from_primitive::<Self, 2>(output).reshape(shape),
            Some(from_primitive::<Self, 2>(mean_square).reshape(mean_square_shape)),
        )
    }

    /// One launch (`cube_rows.rs`).
    fn rms_match_multiplier(
        cumulative_mean_square: Tensor<Self, 2>,
        detail_mean_square: Tensor<Self, 2>,
        gamma: f64,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let (multiplier, matched) = super::cube_rows::rms_match_multiplier(
            &cube_tensor(cumulative_mean_square),
            &cube_tensor(detail_mean_square),
            gamma,
            epsilon,
        );
        (from_primitive(multiplier), from_primitive(matched))
    }

    /// One launch (`cube_rows.rs`): both sums, their mean squares and the multiplier.
    fn pair_write<const D: usize>(
        cumulative: Tensor<Self, D>,
        detail: Option<Tensor<Self, D>>,
        term: Tensor<Self, D>,
        sign: f64,
        matching: RmsMatching,
    ) -> PairWrite<Self, D> {
        let shape = cumulative.dims();
        let d_model = shape[D - 1];
        let tokens = cumulative.shape().num_elements() / d_model;
        let rows = |tensor: Tensor<Self, D>| cube_tensor(tensor.reshape([tokens, d_model]));
        let pair = super::cube_rows::pair_write(
            &rows(cumulative),
            detail.map(rows).as_ref(),
            &rows(term),
            sign,
            matching.gamma,
            matching.epsilon,
        );
        let mut column_shape = shape;
        column_shape[D - 1] = 1;
        let full = |tensor| from_primitive::<Self, 2>(tensor).reshape(shape);
        let column = |tensor| from_primitive::<Self, 2>(tensor).reshape(column_shape);
        let (cumulative, cumulative_mean_square) = pair.cumulative;
        PairWrite {
            cumulative: full(cumulative),
            cumulative_mean_square: column(cumulative_mean_square),
            detail: pair
                .detail
                .map(|(detail, mean_square)| (full(detail), column(mean_square))),
            multiplier: column(pair.multiplier),
            matched_mean_square: column(pair.matched),
        }
    }

    /// One launch per wanted slot (`cube_rows.rs`), the addition included.
    fn add_scaled_rows(
        into: Vec<Option<Tensor<Self, 2>>>,
        columns: Tensor<Self, 2>,
        rows: Tensor<Self, 2>,
        wanted: &[bool],
    ) -> Vec<Option<Tensor<Self, 2>>> {
        let (columns, rows) = (cube_tensor(columns), cube_tensor(rows));
        into.into_iter()
            .zip(wanted)
            .enumerate()
            .map(|(slot, (into, &wanted))| {
                wanted.then(|| {
                    let into = into.map(cube_tensor);
                    from_primitive(super::cube_rows::add_scaled_rows(
                        into, &columns, slot, &rows, 1.0,
                    ))
                })
            })
            .collect()
    }

    fn weighted_sum(slots: &[Tensor<Self, 2>], weights: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let slots: Vec<_> = slots.iter().cloned().map(cube_tensor).collect();
        let chunk = slots_per_launch(&slots[0]);
        slots
            .chunks(chunk)
            .enumerate()
            .map(|(index, slots)| {
                let weights = weights.clone().narrow(0, index * chunk, slots.len());
                from_primitive(weighted_sum(slots, cube_tensor(weights)))
            })
            .reduce(|sum, part| sum + part)
            .expect("a read has at least one slot")
    }

    /// The kernels' weighted sum summed over tokens: no matrix product, since CUDA rounds a
    /// matrix product's f32 inputs to TF32 (`naive::weighted_total` runs one per slot), and the
    /// query's gradient would carry that rounding into an otherwise f32 read.
    fn weighted_total(slots: &[Tensor<Self, 2>], weights: Tensor<Self, 2>) -> Tensor<Self, 1> {
        let d_model = slots[0].dims()[1];
        Self::weighted_sum(slots, weights)
            .sum_dim(0)
            .reshape([d_model])
    }
}

/// Whether `R` is CubeCL's CUDA runtime. Only this crate's `cuda` feature names that runtime, so
/// without it every runtime counts as not CUDA.
#[cfg(feature = "cuda")]
fn is_cuda<R: CubeRuntime>() -> bool {
    std::any::TypeId::of::<R>() == std::any::TypeId::of::<burn_cubecl::cubecl::cuda::CudaRuntime>()
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::extra_unused_type_parameters)] // the same signature as with the feature
fn is_cuda<R: CubeRuntime>() -> bool {
    false
}

/// The row dots of `slots` with `rows`, each divided by `divisor`.
fn row_dots<R: CubeRuntime>(
    slots: &[CubeTensor<R>],
    rows: CubeTensor<R>,
    divisor: f64,
) -> CubeTensor<R> {
    let tokens = slots[0].meta.shape()[0];
    let output = empty(&rows, [slots.len(), tokens]);
    row_dots_into(slots, rows, output, divisor)
}

/// [`row_dots`] into a given `[S, tokens]` output of any strides.
fn row_dots_into<R: CubeRuntime>(
    slots: &[CubeTensor<R>],
    rows: CubeTensor<R>,
    output: CubeTensor<R>,
    divisor: f64,
) -> CubeTensor<R> {
    let tokens = slots[0].meta.shape()[0];
    let row_stride = match rows.meta.shape()[0] {
        1 => 0,
        _ => rows.meta.strides()[0] as u32,
    };
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&rows.client, tokens * ROW_THREADS, cube_dim);
    let dtype = rows.dtype;
    super::cube_kernels::row_dots_kernel::launch::<R>(
        &rows.client.clone(),
        cube_count,
        cube_dim,
        sequence(slots),
        rows.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        row_stride,
        divisor as f32,
        ROW_THREADS,
        dtype.into(),
    );
    output
}

fn weighted_sum<R: CubeRuntime>(slots: &[CubeTensor<R>], weights: CubeTensor<R>) -> CubeTensor<R> {
    let output = empty_device_dtype::<R>(
        weights.client.clone(),
        weights.device.clone(),
        slots[0].meta.shape().clone(),
        weights.dtype,
    );
    weighted_sum_into(slots, weights, output)
}

/// [`weighted_sum`] into a given `[tokens, d]` output of any strides.
fn weighted_sum_into<R: CubeRuntime>(
    slots: &[CubeTensor<R>],
    weights: CubeTensor<R>,
    output: CubeTensor<R>,
) -> CubeTensor<R> {
    let elements = output.meta.shape().num_elements();
    let cube_dim = CubeDim::new(&weights.client, elements);
    let cube_count = calculate_cube_count_elemwise(&weights.client, elements, cube_dim);
    let dtype = weights.dtype;
    super::cube_kernels::weighted_sum_kernel::launch::<R>(
        &weights.client.clone(),
        cube_count,
        cube_dim,
        sequence(slots),
        weights.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        dtype.into(),
    );
    output
}

/// The sources as one kernel argument (one binding each).
pub(super) fn sequence<R, T>(slots: &[CubeTensor<R>]) -> SequenceArg<R, T>
where
    R: CubeRuntime,
    T: LaunchArg<RuntimeArg<R> = TensorArg<R>>,
{
    let mut sequence = SequenceArg::new();
    for slot in slots {
        sequence.push(slot.clone().into_tensor_arg());
    }
    sequence
}

/// Sources per launch: what the device's storage bindings allow, at most
/// [`MAX_SLOTS_PER_LAUNCH`].
fn slots_per_launch<R: CubeRuntime>(like: &CubeTensor<R>) -> usize {
    let bindings = like.client.properties().hardware.max_bindings as usize;
    bindings
        .saturating_sub(OTHER_BINDINGS)
        .clamp(1, MAX_SLOTS_PER_LAUNCH)
}

/// A new `[rows, width]` tensor on `like`'s device, of its element type, its values unset.
pub(super) fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: [usize; 2]) -> CubeTensor<R> {
    empty_device_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        like.dtype,
    )
}

/// A Burn tensor as the kernels' argument. Transposed views are copied, so that neighbouring
/// threads read neighbouring addresses; row-pitched tensors (CUDA's layout) are read in place.
pub(super) fn cube_tensor<R, F, I, BT, const D: usize>(
    tensor: Tensor<CubeBackend<R, F, I, BT>, D>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    into_contiguous_aligned(tensor.into_primitive().tensor())
}

/// The kernels writing into a row-pitched output, the layout CUDA's allocator gives a
/// `[rows, width]` tensor whose row is not a power-of-two number of bytes (cubecl's
/// `PitchedMemoryLayoutPolicy`). wgpu allocates contiguously, so these tests build the pitched
/// view by hand: its values must be the f64 sums, and its padding must stay untouched.
#[cfg(all(test, feature = "wgpu"))]
#[path = "cube_tests.rs"]
mod wgpu_tests;
