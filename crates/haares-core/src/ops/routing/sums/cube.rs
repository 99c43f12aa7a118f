//! The slot sums as CubeCL kernels on Burn's cube backends (CUDA, wgpu).
//!
//! Each kernel reads every source of a chunk in one pass: the sources arrive as a CubeCL
//! `Sequence` of tensors (one binding each, never stacked), so a chunk's size is bounded by the
//! device's storage bindings per kernel. A slot's gradient `into + (f · columns[s, ·]) ⊗ rows` is
//! one launch where the tensor operations launch a product, a scalar product and an addition;
//! each element takes the plain operations' f32 steps in their order: the column times `f`, that
//! times the row, plus `into`. [`naive`](super::naive) is the reference they are tested against
//! (`tests/core/slot_sums_checks.rs`, which `tests/portability.rs` runs on every backend).

use burn::tensor::Tensor;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::CubeDim;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::SlotSumsBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{ROW_THREADS, empty};
use crate::ops::routing::cube_shared::{MAX_SLOTS_PER_LAUNCH, cube_tensor, sequence};

/// Bindings a launch needs besides its sources: the other input, the output and metadata.
const OTHER_BINDINGS: usize = 4;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> SlotSumsBackend
    for CubeBackend<R, F, I, BT>
{
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

    /// One launch per wanted slot, the addition included.
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
                    from_primitive(add_scaled_rows(into, &columns, slot, &rows, 1.0))
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

/// The row dots of `slots` with `rows`, each divided by `divisor`.
pub(in crate::ops) fn row_dots<R: CubeRuntime>(
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
    kernels::row_dots_kernel::launch::<R>(
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

/// Sources per launch: what the device's storage bindings allow, at most
/// [`MAX_SLOTS_PER_LAUNCH`].
fn slots_per_launch<R: CubeRuntime>(like: &CubeTensor<R>) -> usize {
    let bindings = like.client.properties().hardware.max_bindings as usize;
    bindings
        .saturating_sub(OTHER_BINDINGS)
        .clamp(1, MAX_SLOTS_PER_LAUNCH)
}

/// `into + (factor · columns[slot, n]) · rows[n, k]` (`rows[0, k]` for one shared row), or the
/// product alone without `into`, as a new `[tokens, d]` tensor.
pub(in crate::ops) fn add_scaled_rows<R: CubeRuntime>(
    into: Option<CubeTensor<R>>,
    columns: &CubeTensor<R>,
    slot: usize,
    rows: &CubeTensor<R>,
    factor: f64,
) -> CubeTensor<R> {
    let tokens = columns.meta.shape()[1];
    let d_model = rows.meta.shape()[1];
    let output = empty(rows, [tokens, d_model]);
    let row_stride = match rows.meta.shape()[0] {
        1 => 0,
        _ => rows.meta.strides()[0] as u32,
    };
    let accumulated = into.is_some();
    let into = into.unwrap_or_else(|| rows.clone());
    let elements = tokens * d_model;
    let client = rows.client.clone();
    let cube_dim = CubeDim::new(&client, elements);
    let cube_count = calculate_cube_count_elemwise(&client, elements, cube_dim);
    kernels::add_scaled_rows_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        into.into_tensor_arg(),
        columns.clone().into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        output.clone().into_tensor_arg(),
        slot as u32,
        row_stride,
        factor as f32,
        accumulated,
        rows.dtype.into(),
    );
    output
}

pub(in crate::ops) mod kernels;

/// The kernels writing into a row-pitched output, the layout CUDA's allocator gives a
/// `[rows, width]` tensor whose row is not a power-of-two number of bytes (cubecl's
/// `PitchedMemoryLayoutPolicy`). wgpu allocates contiguously, so these tests build the pitched
/// view by hand: its values must be the f64 sums, and its padding must stay untouched.
#[cfg(all(test, feature = "wgpu"))]
mod wgpu_tests;
