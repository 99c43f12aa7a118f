//! The routing operator's primitives as CubeCL kernels on Burn's cube backends (CUDA, wgpu).
//!
//! Each kernel reads every source of a chunk in one pass: the sources arrive as a CubeCL
//! `Sequence` of tensors (one binding each, never stacked), so a chunk's size is bounded by the
//! device's storage bindings per kernel. [`naive`](super::naive) is the reference they are
//! tested against (`tests/cube/kernels.rs`, part of `tests/portability.rs`, on wgpu and CUDA).

use burn::tensor::{Shape, Tensor};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeDim, LaunchArg, SequenceArg, TensorArg};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::{RoutingBackend, from_primitive};
use crate::config::RoutingPath;

/// Threads that share one token row in [`row_dots_kernel`].
const ROW_THREADS: usize = 64;
/// Most sources one launch reads (fewer where the device allows fewer bindings).
const MAX_SLOTS_PER_LAUNCH: usize = 16;
/// Bindings a launch needs besides its sources: the other input, the output and metadata.
const OTHER_BINDINGS: usize = 4;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> RoutingBackend
    for CubeBackend<R, F, I, BT>
{
    /// The reference path: on an H100 (CUDA) the weighted-sum kernel returned wrong sums for
    /// one-slot reads in tests/cube/kernels.rs, for a cause not yet found, and no hardware GPU has
    /// passed the kernel checks yet (lavapipe, a CPU Vulkan, has). `RoutingPath::Fused` still
    /// selects the kernels (docs/benchmarks.md).
    fn auto_routing() -> RoutingPath {
        RoutingPath::Reference
    }

    fn row_dots(slots: &[Tensor<Self, 2>], rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let rows = cube_tensor(rows);
        let chunk = slots_per_launch(&rows);
        let slots: Vec<_> = slots.iter().cloned().map(cube_tensor).collect();
        let parts = slots
            .chunks(chunk)
            .map(|chunk| from_primitive(row_dots(chunk, rows.clone())))
            .collect();
        Tensor::cat(parts, 0)
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
}

/// The kernels, in a module of their own because CubeCL's `Tensor` is not Burn's.
mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    /// `out[s, n] = Σ_k slots[s][n, k] · rows[n, k]`, where `rows` advances by `row_stride` per token
    /// (0 for one row shared by all tokens). One
    /// cube per token row: its threads stride over `k`, and shared memory reduces their partial sums.
    #[cube(launch)]
    pub(super) fn row_dots_kernel<F: Float>(
        slots: &Sequence<Tensor<F>>,
        rows: &Tensor<F>,
        output: &mut Tensor<F>,
        row_stride: u32,
        #[comptime] threads: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let count = comptime![slots.len()];
        let token = CUBE_POS;
        if token >= output.shape(1) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let d_model = rows.shape(1);
        let row_offset = token * (row_stride as usize);
        let mut partials = SharedMemory::<F>::new(count * threads);
        #[unroll]
        for slot in 0..count {
            let source = slots.index(slot);
            let mut sum = F::new(0.0);
            let mut k = lane;
            while k < d_model {
                sum += source[token * source.stride(0) + k * source.stride(1)]
                    * rows[row_offset + k * rows.stride(1)];
                k += threads;
            }
            partials[slot * threads + lane] = sum;
        }
        sync_cube();
        if lane < count {
            let mut total = F::new(0.0);
            for thread in 0..threads {
                total += partials[lane * threads + thread];
            }
            output[lane * output.stride(0) + token * output.stride(1)] = total;
        }
    }

    /// `out[n, k] = Σ_s weights[s, n] · slots[s][n, k]`: one thread per output element, reading each
    /// source once.
    #[cube(launch)]
    pub(super) fn weighted_sum_kernel<F: Float>(
        slots: &Sequence<Tensor<F>>,
        weights: &Tensor<F>,
        output: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        let count = comptime![slots.len()];
        if ABSOLUTE_POS >= output.len() {
            terminate!();
        }
        let d_model = output.shape(1);
        let token = ABSOLUTE_POS / d_model;
        let k = ABSOLUTE_POS % d_model;
        let mut sum = F::new(0.0);
        #[unroll]
        for slot in 0..count {
            let source = slots.index(slot);
            sum += weights[slot * weights.stride(0) + token * weights.stride(1)]
                * source[token * source.stride(0) + k * source.stride(1)];
        }
        output[ABSOLUTE_POS] = sum;
    }
}

fn row_dots<R: CubeRuntime>(slots: &[CubeTensor<R>], rows: CubeTensor<R>) -> CubeTensor<R> {
    let tokens = slots[0].meta.shape()[0];
    let row_stride = match rows.meta.shape()[0] {
        1 => 0,
        _ => rows.meta.strides()[0] as u32,
    };
    let output = empty_device_dtype::<R>(
        rows.client.clone(),
        rows.device.clone(),
        Shape::new([slots.len(), tokens]),
        rows.dtype,
    );
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&rows.client, tokens * ROW_THREADS, cube_dim);
    let dtype = rows.dtype;
    kernels::row_dots_kernel::launch::<R>(
        &rows.client.clone(),
        cube_count,
        cube_dim,
        sequence(slots),
        rows.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        row_stride,
        ROW_THREADS,
        dtype.into(),
    );
    output
}

fn weighted_sum<R: CubeRuntime>(slots: &[CubeTensor<R>], weights: CubeTensor<R>) -> CubeTensor<R> {
    let shape = slots[0].meta.shape().clone();
    let elements = shape.num_elements();
    let output = empty_device_dtype::<R>(
        weights.client.clone(),
        weights.device.clone(),
        shape,
        weights.dtype,
    );
    let cube_dim = CubeDim::new(&weights.client, elements);
    let cube_count = calculate_cube_count_elemwise(&weights.client, elements, cube_dim);
    let dtype = weights.dtype;
    kernels::weighted_sum_kernel::launch::<R>(
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
fn sequence<R, T>(slots: &[CubeTensor<R>]) -> SequenceArg<R, T>
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

fn cube_tensor<R, F, I, BT>(tensor: Tensor<CubeBackend<R, F, I, BT>, 2>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    into_contiguous(tensor.into_primitive().tensor())
}
