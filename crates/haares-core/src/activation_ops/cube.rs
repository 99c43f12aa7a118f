//! The fused activations as CubeCL kernels on Burn's cube backends (CUDA, wgpu): one launch per
//! operation and direction where the plain tensor operations ([`naive`](super::naive)) launch
//! three to eight (issue 34: a CUDA step costs its launch count).
//!
//! - `swiglu` and `swiglu_backward`: one thread per element, both gradients from one pass.
//! - `causal_softmax` and its backward: one cube per query row (`cube_softmax.rs`).
//! - `rms_norm` and its backward, the same way (`cube_norm.rs`).
//! - `rotary` and its backward: one thread per element (`cube_rotary.rs`).
//! - `causal_attention`: one launch forward, two backward (`cube_attention.rs`).
//! - `cross_entropy`: one cube per row of logits, one launch each way (`cube_cross_entropy.rs`).
//! - the packed projections' joins and splits: one launch each (`cube_packed.rs`).
//!
//! Inputs are read through their strides (no copy of a transposed or pitched view); outputs are
//! allocated contiguous. `tests/cube/activations.rs` (part of `tests/portability.rs`) checks every
//! kernel against f64 sums on wgpu and CUDA.

use burn::tensor::{Int, Tensor};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::ActivationBackend;
use crate::autodiff_node::from_primitive;

/// Threads that share one row in the softmax and RMSNorm kernels.
pub(super) const ROW_THREADS: usize = 64;

impl<R, F, I, BT> ActivationBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn swiglu<const D: usize>(gate: Tensor<Self, D>, up: Tensor<Self, D>) -> Tensor<Self, D> {
        let (gate, up) = (primitive(gate), primitive(up));
        let output = empty_like(&gate);
        let (cube_count, cube_dim) = elementwise(&output);
        kernels::swiglu_kernel::launch::<R>(
            &gate.client.clone(),
            cube_count,
            cube_dim,
            gate.clone().into_tensor_arg(),
            up.into_tensor_arg(),
            output.clone().into_tensor_arg(),
            gate.dtype.into(),
        );
        from_primitive(output)
    }

    fn swiglu_backward<const D: usize>(
        gate: Tensor<Self, D>,
        up: Tensor<Self, D>,
        grad: Tensor<Self, D>,
    ) -> (Tensor<Self, D>, Tensor<Self, D>) {
        let (gate, up, grad) = (primitive(gate), primitive(up), primitive(grad));
        let (gate_grad, up_grad) = (empty_like(&gate), empty_like(&gate));
        let (cube_count, cube_dim) = elementwise(&gate_grad);
        kernels::swiglu_backward_kernel::launch::<R>(
            &gate.client.clone(),
            cube_count,
            cube_dim,
            gate.clone().into_tensor_arg(),
            up.into_tensor_arg(),
            grad.into_tensor_arg(),
            gate_grad.clone().into_tensor_arg(),
            up_grad.clone().into_tensor_arg(),
            gate.dtype.into(),
        );
        (from_primitive(gate_grad), from_primitive(up_grad))
    }

    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        super::cube_norm::rms_norm(x, weight, epsilon)
    }

    fn rms_norm_backward(
        x: Tensor<Self, 2>,
        weight: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        super::cube_norm::rms_norm_backward(x, weight, grad, epsilon)
    }

    fn rotary(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        super::cube_rotary::turn_pairs(x, cos, sin, scale, false)
    }

    fn rotary_backward(
        grad: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        super::cube_rotary::turn_pairs(grad, cos, sin, scale, true)
    }

    fn fuses_causal_attention(head_dim: usize) -> bool {
        head_dim <= super::cube_attention::MAX_HEAD_DIM
    }

    fn causal_attention_forward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
    ) -> (Tensor<Self, 4>, Tensor<Self, 3>) {
        super::cube_attention::causal_attention_forward(query, key, value)
    }

    fn causal_attention_backward(
        query: Tensor<Self, 4>,
        key: Tensor<Self, 4>,
        value: Tensor<Self, 4>,
        output: Tensor<Self, 4>,
        logsumexp: Tensor<Self, 3>,
        grad: Tensor<Self, 4>,
    ) -> [Tensor<Self, 4>; 3] {
        super::cube_attention::causal_attention_backward(query, key, value, output, logsumexp, grad)
    }

    fn fuses_cross_entropy() -> bool {
        true
    }

    fn cross_entropy_forward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
    ) -> (Tensor<Self, 1>, Tensor<Self, 1>) {
        super::cube_cross_entropy::cross_entropy_forward(logits, targets, weights)
    }

    fn cross_entropy_backward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        weights: Tensor<Self, 1>,
        logsumexp: Tensor<Self, 1>,
        grad: Tensor<Self, 1>,
    ) -> Tensor<Self, 2> {
        super::cube_cross_entropy::cross_entropy_backward(logits, targets, weights, logsumexp, grad)
    }

    fn packs_projections() -> bool {
        true
    }

    fn concat_columns(parts: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        match super::cube_packed::takes_parts(parts.len()) {
            true => super::cube_packed::concat_columns(parts),
            false => super::packed::concat_columns(parts),
        }
    }

    fn split_columns(whole: Tensor<Self, 2>, widths: &[usize]) -> Vec<Tensor<Self, 2>> {
        match super::cube_packed::takes_parts(widths.len()) {
            true => super::cube_packed::split_columns(whole, widths),
            false => super::packed::split_columns(whole, widths),
        }
    }

    fn rotary_packed(
        qkv: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        let heads = super::packed::unpack_heads(qkv);
        super::cube_packed::rotary_pack(heads, cos, sin, query_scale, false)
    }

    fn rotary_join(
        gradients: [Tensor<Self, 4>; 3],
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        super::cube_packed::rotary_pack(gradients, cos, sin, query_scale, true)
    }

    fn swiglu_packed_backward(gate_up: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
        super::cube_packed::swiglu_packed_backward(gate_up, grad)
    }

    fn causal_softmax<const D: usize>(scores: Tensor<Self, D>) -> Tensor<Self, D> {
        super::cube_softmax::causal_softmax(scores)
    }

    fn causal_softmax_backward<const D: usize>(
        probabilities: Tensor<Self, D>,
        grad: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        super::cube_softmax::causal_softmax_backward(probabilities, grad)
    }
}

/// The kernels, in a module of their own because CubeCL's `Tensor` is not Burn's.
pub(crate) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    /// Where element `index` of the row-major order of `tensor`'s shape lies in its buffer.
    #[cube]
    pub(in crate::activation_ops) fn strided<F: Float>(tensor: &Tensor<F>, index: usize) -> usize {
        let rank = tensor.rank();
        let mut rest = index;
        let mut offset = 0;
        for i in 0..rank {
            let dim = rank - 1 - i;
            offset += (rest % tensor.shape(dim)) * tensor.stride(dim);
            rest /= tensor.shape(dim);
        }
        offset
    }

    /// `σ(x) = 1 / (1 + e^{−x})`.
    #[cube]
    fn sigmoid<F: Float>(x: F) -> F {
        F::new(1.0) / (F::new(1.0) + (F::new(0.0) - x).exp())
    }

    /// `h = g σ(g) ⊙ u`, one thread per element.
    #[cube(launch)]
    pub(in crate::activation_ops) fn swiglu_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        output: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= output.len() {
            terminate!();
        }
        let g = gate[strided(gate, ABSOLUTE_POS)];
        output[ABSOLUTE_POS] = g * sigmoid::<F>(g) * up[strided(up, ABSOLUTE_POS)];
    }

    /// `∂u = ∂h ⊙ g σ(g)` and `∂g = ∂h ⊙ u ⊙ (σ(g) + g σ(g) (1 − σ(g)))`, one thread per element.
    #[cube(launch)]
    pub(in crate::activation_ops) fn swiglu_backward_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        grad: &Tensor<F>,
        gate_grad: &mut Tensor<F>,
        up_grad: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= gate_grad.len() {
            terminate!();
        }
        let g = gate[strided(gate, ABSOLUTE_POS)];
        let u = up[strided(up, ABSOLUTE_POS)];
        let dh = grad[strided(grad, ABSOLUTE_POS)];
        let (silu, slope) = silu_slope::<F>(g);
        up_grad[ABSOLUTE_POS] = dh * silu;
        gate_grad[ABSOLUTE_POS] = dh * u * slope;
    }

    /// `SiLU(g) = g σ(g)` and its slope `σ(g) + g σ(g) (1 − σ(g))`.
    #[cube]
    pub(in crate::activation_ops) fn silu_slope<F: Float>(g: F) -> (F, F) {
        let s = sigmoid::<F>(g);
        let silu = g * s;
        (silu, s + silu * (F::new(1.0) - s))
    }

    /// Reduces `partials[0..threads]` into `partials[0]`, by sum or by maximum; every thread of
    /// the cube calls it. One thread adds the 64 partials: a tree would need a runtime loop
    /// bound, and it is not what a row's time goes into.
    #[cube]
    pub(crate) fn reduce<F: Float>(
        partials: &mut SharedMemory<F>,
        lane: usize,
        #[comptime] threads: usize,
        #[comptime] maximum: bool,
    ) {
        sync_cube();
        if lane == 0 {
            let mut total = partials[0];
            for thread in 1..threads {
                let value = partials[thread];
                if maximum {
                    if value > total {
                        total = value;
                    }
                } else {
                    total += value;
                }
            }
            partials[0] = total;
        }
        sync_cube();
    }
}

/// A Burn tensor as the kernels' argument, read through its strides.
pub(super) fn primitive<R, F, I, BT, const D: usize>(
    tensor: Tensor<CubeBackend<R, F, I, BT>, D>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    tensor.into_primitive().tensor()
}

/// A contiguous output of `like`'s shape and type.
pub(super) fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    empty_device_contiguous_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        like.meta.shape().clone(),
        like.dtype,
    )
}

/// One thread per element of `output`.
pub(super) fn elementwise<R: CubeRuntime>(output: &CubeTensor<R>) -> (CubeCount, CubeDim) {
    let elements = output.meta.shape().num_elements();
    let cube_dim = CubeDim::new(&output.client, elements);
    (
        calculate_cube_count_elemwise(&output.client, elements, cube_dim),
        cube_dim,
    )
}

/// One cube of [`ROW_THREADS`] per row of `output`'s last dimension.
pub(super) fn per_row<R: CubeRuntime>(output: &CubeTensor<R>) -> (CubeCount, CubeDim) {
    let shape = output.meta.shape();
    let rows = shape.num_elements() / shape[shape.num_dims() - 1].max(1);
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    (
        calculate_cube_count_elemwise(&output.client, rows * ROW_THREADS, cube_dim),
        cube_dim,
    )
}
