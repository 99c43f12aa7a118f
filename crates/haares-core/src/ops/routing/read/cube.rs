//! A whole read as one CubeCL kernel each way on the cube backends: the scores, the
//! bias, the softmax over slots and the mixture of eq:routingweights forward, all their
//! gradients backward, one cube per token.
//!
//! The composition launches about 30 kernels forward for a read of a few slots: the two slot-sum
//! kernels (`sums/cube.rs`), and around them the `[S, tokens]` arithmetic (every slot's scale and
//! mean square gathered into one tensor, twice; the coefficients; the bias; Burn's softmax in five
//! passes). Here a cube reduces a token's dot products in shared memory, one thread turns them into
//! scores and weights, and the cube then mixes the token's row: one launch, and each slot row is
//! read twice while it is in cache. The backward pass (about 50 launches composed) is one launch
//! too, plus one that sums the tokens' shares of the query's, the key weight's and the bias's
//! gradients (a sum across tokens and two products for the query, a product and two sums for the
//! bias, composed): a token's cube forms both shares of each slot row's gradient in one update.
//! Both kernels form the folded query `q ⊙ w` and add the bias where they use them, so the router
//! launches nothing for either. A read with a norm ([`ReadNorm`]) normalises the token's mixed row
//! in the forward kernel and forms `∂h̃` from `∂y` at the start of the backward kernel; the query's
//! launch sums the gain's gradient too, so the norm launches nothing either.
//! [`compose`](super::naive::compose) and [`compose_backward`](super::naive::compose_backward) stay
//! the reference (`tests/core/read_checks.rs` checks one against the other).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::RoutingPath;
use super::{
    QueryGradients, ReadBackward, ReadBias, ReadForward, ReadGradients, ReadNorm, ReadQuery,
    RoutingBackend, naive,
};
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{ROW_THREADS, empty, is_cuda, plane_reduction};
use crate::ops::routing::cube_shared::{MAX_SLOTS_PER_LAUNCH, cube_tensor, sequence};
use crate::ops::routing::{SlotRows, slot_column};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
/// A `[rows, width]` tensor on the cube backend.
type Rows<R, F, I, BT> = Tensor<Cube<R, F, I, BT>, 2>;
/// A read's gradients, or its inputs back for the composition.
type BackwardOutcome<B> = Result<ReadGradients<B>, UnfusedBackward<B>>;
/// `(∂q, ∂w)`, `∂b` where the bias is wanted and the norm's `∂g` where the read has a norm.
type QueryBiasAndGainGrads<B> = (
    QueryGradients<B>,
    Option<Tensor<B, 1>>,
    Option<Tensor<B, 1>>,
);

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> RoutingBackend
    for CubeBackend<R, F, I, BT>
{
    /// The fused path on CUDA, the reference path on wgpu. On CUDA every check passes, the
    /// operator on the kernels included, and Block AttnRes's fused steps took about two thirds of
    /// the reference path's (docs/notebook/cuda.md). wgpu's kernels pass every check on lavapipe,
    /// a CPU Vulkan, but have not been timed on a GPU.
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

    /// One launch where the read's slots fit one , else the composition.
    fn routing_read_forward(
        slots: &[SlotRows<Self>],
        query: &ReadQuery<Self>,
        bias: Option<&ReadBias<Self>>,
        epsilon: f64,
        norm: Option<&ReadNorm<Self>>,
    ) -> ReadForward<Self> {
        read_forward(slots, query, bias, epsilon, norm)
            .unwrap_or_else(|| naive::compose(slots, query, bias, epsilon, norm))
    }

    /// One launch, and the query's, key weight's and bias's gradients in one more, where the
    /// read's slots fit one launch ; else the composition.
    fn routing_read_backward(
        read: ReadBackward<Self>,
        into: Vec<Option<Tensor<Self, 2>>>,
        wanted: &[bool],
        mean_squares_wanted: &[bool],
    ) -> ReadGradients<Self> {
        read_backward(read, into, wanted, mean_squares_wanted).unwrap_or_else(|(read, into)| {
            naive::compose_backward(read, into, wanted, mean_squares_wanted)
        })
    }
}

/// Threads that sum one column of the query's per-token gradients (a multiple of the kernel's
/// groups of partial sums).
pub(in crate::ops) const QUERY_THREADS: usize = 256;

/// Bindings of a launch besides its tensors: the buffer of metadata and scalars (a uniform on
/// wgpu, which the storage-buffer limit does not count; counted here to stay on the safe side).
const OTHER_BINDINGS: usize = 1;

/// Whether a read of `count` slots fits one launch of a kernel with `per_slot` tensors per slot
/// and `others` more. CUDA takes 1,024 bindings; wgpu what the adapter allows (a few dozen on
/// lavapipe), so there the larger HAARES reads are composed.
fn fits<R: CubeRuntime>(
    like: &CubeTensor<R>,
    count: usize,
    per_slot: usize,
    others: usize,
) -> bool {
    let bindings = like.client.properties().hardware.max_bindings as usize;
    count <= MAX_SLOTS_PER_LAUNCH && per_slot * count + others + OTHER_BINDINGS <= bindings
}

/// The bits of the slots for which `has` holds, bit `s` for slot `s`.
fn mask<T>(items: &[T], has: impl Fn(&T) -> bool) -> u32 {
    items
        .iter()
        .enumerate()
        .filter(|(_, item)| has(item))
        .fold(0, |mask, (slot, _)| mask | (1 << slot))
}

/// The slots' tensors on the device: raws, scales (the mean square standing in where a slot has
/// none: its bit in the mask is clear and the kernels read no scale), mean squares, and the scale
/// mask.
type DeviceSlots<R> = (
    Vec<CubeTensor<R>>,
    Vec<CubeTensor<R>>,
    Vec<CubeTensor<R>>,
    u32,
);

fn device_slots<R, F, I, BT>(slots: &[SlotRows<Cube<R, F, I, BT>>]) -> DeviceSlots<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let raws = slots.iter().map(|s| cube_tensor(s.raw.clone())).collect();
    let mean_squares: Vec<_> = slots
        .iter()
        .map(|s| cube_tensor(s.mean_square.clone()))
        .collect();
    let scales = slots
        .iter()
        .zip(&mean_squares)
        .map(|(s, stand_in)| {
            s.scale
                .clone()
                .map_or_else(|| stand_in.clone(), cube_tensor)
        })
        .collect();
    (
        raws,
        scales,
        mean_squares,
        mask(slots, |s| s.scale.is_some()),
    )
}

/// One cube of [`ROW_THREADS`] per token.
fn per_token<R: CubeRuntime>(like: &CubeTensor<R>, tokens: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&like.client, tokens * ROW_THREADS, cube_dim);
    (cube_count, cube_dim)
}

/// The forward pass of a read in one launch, or `None` where its slots do not fit one (more than
/// [`MAX_SLOTS_PER_LAUNCH`], or more bindings than the device has); the caller then composes it.
fn read_forward<R, F, I, BT>(
    slots: &[SlotRows<Cube<R, F, I, BT>>],
    query: &ReadQuery<Cube<R, F, I, BT>>,
    bias: Option<&ReadBias<Cube<R, F, I, BT>>>,
    epsilon: f64,
    norm: Option<&ReadNorm<Cube<R, F, I, BT>>>,
) -> Option<ReadForward<Cube<R, F, I, BT>>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let d_model = query.query.dims()[0];
    let [query, key_weight] = rows_of(query);
    // Per slot its rows, scale and mean square; the query, the key weight, the bias, the gain
    // and four outputs.
    if !fits(&query, slots.len(), 3, 8) {
        return None;
    }
    let [tokens, _] = slots[0].raw.dims();
    let (raws, scales, mean_squares, scaled) = device_slots(slots);
    let biased_slots = bias.map_or(0, |bias| mask(&bias.slots, |takes| *takes));
    let bias = bias.map_or_else(|| query.clone(), |bias| cube_tensor(bias.value.clone()));
    let (mixture, weights, scores) = (
        empty(&query, [tokens, d_model]),
        empty(&query, [slots.len(), tokens]),
        empty(&query, [slots.len(), tokens]),
    );
    // Without a norm, the query stands in for the gain and a one-element tensor for its output.
    let gain = norm.map_or_else(|| query.clone(), |norm| row_of(&norm.gain));
    let normed = empty(
        &query,
        if norm.is_some() {
            [tokens, d_model]
        } else {
            [1, 1]
        },
    );
    let (cube_count, cube_dim) = per_token(&query, tokens);
    let (client, dtype) = (query.client.clone(), query.dtype);
    kernels::read_forward_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        sequence(&raws),
        sequence(&scales),
        sequence(&mean_squares),
        query.into_tensor_arg(),
        key_weight.into_tensor_arg(),
        bias.into_tensor_arg(),
        gain.into_tensor_arg(),
        mixture.clone().into_tensor_arg(),
        weights.clone().into_tensor_arg(),
        scores.clone().into_tensor_arg(),
        normed.clone().into_tensor_arg(),
        scaled,
        biased_slots,
        epsilon as f32,
        norm.map_or(0.0, |norm| norm.epsilon as f32),
        norm.is_some(),
        ROW_THREADS,
        plane_reduction(&client, ROW_THREADS),
        dtype.into(),
    );
    Some(ReadForward {
        normed: norm.map(|_| from_primitive(normed)),
        mixture: from_primitive(mixture),
        weights: from_primitive(weights),
        scores: from_primitive(scores),
    })
}

/// A read's backward pass handed back, with the gradients to add to, for the composition.
pub(super) type UnfusedBackward<B> = (ReadBackward<B>, Vec<Option<Tensor<B, 2>>>);

/// The backward pass of a read in one launch and the query's, key weight's and bias's gradients in
/// one more, or its inputs back where its slots do not fit one launch. Each wanted slot's gradient
/// is its `into` plus both shares (mixture and scores), formed in one update. A slot whose rows
/// are the previous slot's (`same_rows`: HAARES's early-half detail after its cumulative sum)
/// gives its gradient in that slot's entry where [`merged_into_previous`] allows, so that Burn
/// does not add the two in a launch of its own.
fn read_backward<R, F, I, BT>(
    read: ReadBackward<Cube<R, F, I, BT>>,
    into: Vec<Option<Rows<R, F, I, BT>>>,
    wanted: &[bool],
    mean_squares_wanted: &[bool],
) -> BackwardOutcome<Cube<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let count = read.slots.len();
    let d_model = read.query.query.dims()[0];
    let (bias_wanted, fold) = (read.bias_wanted, read.fold_mean_squares);
    let grad = cube_tensor(read.mixture_grad.clone());
    // Per slot its rows, scale, mean square and earlier gradient; seven more inputs, three
    // outputs. (A norm's mixture is formed again from the slots, and its gradient held in slot
    // 0's gradient rows, so that a read of five slots still fits lavapipe's 31 bindings.)
    if !fits(&grad, count, 4, 10) {
        return Err((read, into));
    }
    let [tokens, _] = read.slots[0].raw.dims();
    let (raws, scales, mean_squares, scaled) = device_slots(&read.slots);
    let accumulated = mask(&into, Option::is_some);
    let merged = merged_into_previous(&read.same_rows, wanted, &into);
    let into: Vec<_> = into
        .into_iter()
        .map(|sum| sum.map_or_else(|| grad.clone(), cube_tensor))
        .collect();
    let [query, key_weight] = rows_of(&read.query);
    let weights_grad = read.weights_grad.map(cube_tensor);
    let extra = weights_grad.is_some();
    let weights_grad = weights_grad.unwrap_or_else(|| grad.clone());
    // Each token's share of `∂u`, of `∂b` in one more column where it is wanted, and of the
    // norm's `∂g` in `d` more where the read has a norm.
    let with_norm = read.norm.is_some();
    let columns = d_model + usize::from(bias_wanted) + if with_norm { d_model } else { 0 };
    let (raw_grads, query_rows) = (
        empty(&grad, [count * tokens, d_model]),
        empty(&grad, [tokens, columns]),
    );
    // Without a norm, the query stands in for the gain.
    let (gain, norm_epsilon) = match &read.norm {
        Some(norm) => (row_of(&norm.norm.gain), norm.norm.epsilon as f32),
        None => (query.clone(), 0.0),
    };
    // A folded read writes no mean-square gradient: its output is a one-element stand-in.
    let mean_square_shape = if fold { [1, 1] } else { [count, tokens] };
    let mean_square_grads = empty(&grad, mean_square_shape);
    let (cube_count, cube_dim) = per_token(&grad, tokens);
    let (client, dtype) = (grad.client.clone(), grad.dtype);
    kernels::read_backward_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        sequence(&raws),
        sequence(&scales),
        sequence(&mean_squares),
        sequence(&into),
        query.clone().into_tensor_arg(),
        key_weight.clone().into_tensor_arg(),
        cube_tensor(read.weights).into_tensor_arg(),
        cube_tensor(read.scores).into_tensor_arg(),
        grad.into_tensor_arg(),
        weights_grad.into_tensor_arg(),
        gain.into_tensor_arg(),
        raw_grads.clone().into_tensor_arg(),
        mean_square_grads.clone().into_tensor_arg(),
        query_rows.clone().into_tensor_arg(),
        scaled,
        accumulated,
        mask(wanted, |w| *w),
        mask(&merged, |merged| *merged),
        mask(&read.biased_slots, |takes| *takes),
        read.epsilon as f32,
        norm_epsilon,
        extra,
        fold,
        bias_wanted,
        with_norm,
        ROW_THREADS,
        plane_reduction(&client, ROW_THREADS),
        dtype.into(),
    );
    let (query, bias, gain) = query_gradients(&query_rows, &query, &key_weight, bias_wanted);
    let own = (0..count).map(|slot| wanted[slot] && !merged[slot]);
    let mean_squares_wanted = mean_squares_wanted.iter().map(|&wanted| wanted && !fold);
    Ok(ReadGradients {
        raws: slot_rows(from_primitive(raw_grads), own, tokens),
        mean_squares: slot_columns(
            from_primitive(mean_square_grads),
            mean_squares_wanted,
            tokens,
        ),
        query,
        bias,
        gain,
    })
}

/// Slot `s`'s `[tokens, d]` rows of the slot-major `all` where `wanted` says so.
fn slot_rows<B: Backend>(
    all: Tensor<B, 2>,
    wanted: impl Iterator<Item = bool>,
    tokens: usize,
) -> Vec<Option<Tensor<B, 2>>> {
    let rows = |slot: usize| all.clone().narrow(0, slot * tokens, tokens);
    wanted
        .enumerate()
        .map(|(slot, wanted)| wanted.then(|| rows(slot)))
        .collect()
}

/// Slot `s`'s `[tokens, 1]` column of the `[slots, tokens]` `all` where `wanted` says so.
fn slot_columns<B: Backend>(
    all: Tensor<B, 2>,
    wanted: impl Iterator<Item = bool>,
    tokens: usize,
) -> Vec<Option<Tensor<B, 2>>> {
    wanted
        .enumerate()
        .map(|(slot, wanted)| wanted.then(|| slot_column(&all, slot, tokens)))
        .collect()
}

/// Which slots give their gradient in the previous slot's entry: those whose rows are the
/// previous slot's tensor, where that slot has its own entry (its rows are no earlier slot's),
/// both want a gradient, and the later one has no accumulated gradient of its own to add to.
fn merged_into_previous<T>(same_rows: &[usize], wanted: &[bool], into: &[Option<T>]) -> Vec<bool> {
    (0..wanted.len())
        .map(|slot| {
            slot > 0
                && same_rows.get(slot) == Some(&(slot - 1))
                && same_rows.get(slot - 1) == Some(&(slot - 1))
                && wanted[slot - 1]
                && wanted[slot]
                && into[slot].is_none()
        })
        .collect()
}

/// The query and the key weight as `[1, d]` rows, as the kernels index them.
fn rows_of<R, F, I, BT>(query: &ReadQuery<Cube<R, F, I, BT>>) -> [CubeTensor<R>; 2]
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    [&query.query, &query.key_weight].map(row_of)
}

/// A `[d]` vector as a `[1, d]` row, as the kernels index it.
fn row_of<R, F, I, BT>(vector: &Tensor<Cube<R, F, I, BT>, 1>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let d_model = vector.dims()[0];
    cube_tensor(vector.clone().reshape([1, d_model]))
}

/// `(∂q, ∂w)` from the backward kernel's per-token rows of `∂u`, `∂b` from the column after them
/// where the bias is wanted, and the norm's `∂g` from the `d` columns after those where the rows
/// have them, in one launch.
fn query_gradients<R, F, I, BT>(
    rows: &CubeTensor<R>,
    query: &CubeTensor<R>,
    key_weight: &CubeTensor<R>,
    bias_wanted: bool,
) -> QueryBiasAndGainGrads<Cube<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (columns, d_model) = (rows.meta.shape()[1], query.meta.shape()[1]);
    let [query_grad, key_weight_grad] = [(); 2].map(|_| empty(rows, [1, d_model]));
    let bias_grad = empty(rows, [1, 1]);
    let bias_columns = usize::from(bias_wanted);
    let with_norm = columns > d_model + bias_columns;
    let gain_grad = empty(rows, if with_norm { [1, d_model] } else { [1, 1] });
    let cube_dim = CubeDim::new_1d(QUERY_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&rows.client, columns * QUERY_THREADS, cube_dim);
    kernels::query_gradients_kernel::launch::<R>(
        &rows.client,
        cube_count,
        cube_dim,
        rows.clone().into_tensor_arg(),
        query.clone().into_tensor_arg(),
        key_weight.clone().into_tensor_arg(),
        query_grad.clone().into_tensor_arg(),
        key_weight_grad.clone().into_tensor_arg(),
        bias_grad.clone().into_tensor_arg(),
        gain_grad.clone().into_tensor_arg(),
        bias_columns as u32,
        QUERY_THREADS,
        rows.dtype.into(),
    );
    let vector = |row, width| from_primitive::<Cube<R, F, I, BT>, 2>(row).reshape([width]);
    let query = QueryGradients {
        query: vector(query_grad, d_model),
        key_weight: vector(key_weight_grad, d_model),
    };
    (
        query,
        bias_wanted.then(|| vector(bias_grad, 1)),
        with_norm.then(|| vector(gain_grad, d_model)),
    )
}

pub(in crate::ops) mod kernels;
