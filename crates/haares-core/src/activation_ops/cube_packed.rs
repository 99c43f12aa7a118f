//! The packed operations' joins and splits ([`super::packed`]) as one CubeCL kernel each, where
//! Burn's `cat` launches one copy per part and the split weights' gradients one copy each
//! (`cube.rs` has the other activations and the shared pieces). Every kernel takes one thread
//! per element, reads through strides and writes a contiguous output.
//!
//! - `concat_columns` and `split_columns`: two or three parts, the backbone's most (other counts
//!   take the plain forms).
//! - `rotary_packed` and `rotary_join`: the query's and key's heads turned by RoPE (or their
//!   gradients turned back) and the value's copied, into one `[batch, seq, 3·heads, d_h]` tensor.
//! - `swiglu_packed_backward`: both of SwiGLU's gradients into the packed halves.

use burn::tensor::{Shape, Tensor};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::cube::{elementwise, empty_like, primitive};
use crate::autodiff_node::from_primitive;

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
type Matrix<R, F, I, BT> = Tensor<Cube<R, F, I, BT>, 2>;

/// A contiguous `shape` tensor of `like`'s type on its device.
fn empty_shaped<R: CubeRuntime>(like: &CubeTensor<R>, shape: Vec<usize>) -> CubeTensor<R> {
    empty_device_contiguous_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        like.dtype,
    )
}

/// Whether the join and split kernels take `parts` parts: two or three, the backbone's most.
pub(super) fn takes_parts(parts: usize) -> bool {
    (2..=3).contains(&parts)
}

/// [`ActivationBackend::concat_columns`](super::ActivationBackend::concat_columns) in one launch.
pub(super) fn concat_columns<R, F, I, BT>(parts: Vec<Matrix<R, F, I, BT>>) -> Matrix<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let count = parts.len();
    let parts: Vec<_> = parts.into_iter().map(primitive).collect();
    let rows = parts[0].meta.shape()[0];
    assert!(
        parts.iter().all(|part| part.meta.shape()[0] == rows),
        "concat_columns: the parts' rows differ"
    );
    let total = parts.iter().map(|part| part.meta.shape()[1]).sum();
    let output = empty_shaped(&parts[0], vec![rows, total]);
    let third = parts.get(2).unwrap_or(&parts[0]).clone();
    let (cube_count, cube_dim) = elementwise(&output);
    kernels::concat_columns_kernel::launch::<R>(
        &output.client.clone(),
        cube_count,
        cube_dim,
        parts[0].clone().into_tensor_arg(),
        parts[1].clone().into_tensor_arg(),
        third.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        count == 3,
        output.dtype.into(),
    );
    from_primitive(output)
}

/// [`ActivationBackend::split_columns`](super::ActivationBackend::split_columns) in one launch.
pub(super) fn split_columns<R, F, I, BT>(
    whole: Matrix<R, F, I, BT>,
    widths: &[usize],
) -> Vec<Matrix<R, F, I, BT>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let count = widths.len();
    let whole = primitive(whole);
    let [rows, total] = [whole.meta.shape()[0], whole.meta.shape()[1]];
    assert_eq!(
        widths.iter().sum::<usize>(),
        total,
        "split_columns: widths {widths:?} do not add up to {total} columns"
    );
    let parts: Vec<_> = widths
        .iter()
        .map(|&width| empty_shaped(&whole, vec![rows, width]))
        .collect();
    // Two parts: a one-element stand-in for the third, never written.
    let third = parts
        .get(2)
        .cloned()
        .unwrap_or_else(|| empty_shaped(&whole, vec![1, 1]));
    let (cube_count, cube_dim) = elementwise(&whole);
    kernels::split_columns_kernel::launch::<R>(
        &whole.client.clone(),
        cube_count,
        cube_dim,
        whole.clone().into_tensor_arg(),
        parts[0].clone().into_tensor_arg(),
        parts[1].clone().into_tensor_arg(),
        third.into_tensor_arg(),
        count == 3,
        whole.dtype.into(),
    );
    parts.into_iter().map(from_primitive).collect()
}

/// [`ActivationBackend::rotary_packed`](super::ActivationBackend::rotary_packed) (the query,
/// key and value views of one packed projection) or, `back`,
/// [`ActivationBackend::rotary_join`](super::ActivationBackend::rotary_join) (their three
/// gradients), in one launch: one packed `[batch, seq, 3·heads, d_h]` output.
pub(super) fn rotary_pack<R, F, I, BT>(
    [query, key, value]: [Tensor<Cube<R, F, I, BT>, 4>; 3],
    cos: Matrix<R, F, I, BT>,
    sin: Matrix<R, F, I, BT>,
    query_scale: f64,
    back: bool,
) -> Tensor<Cube<R, F, I, BT>, 4>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [batch, seq, heads, head_dim] = query.dims();
    super::cube_rotary::assert_fits("rotary_pack", query.dims(), cos.dims());
    let [query, key, value] = [query, key, value].map(primitive);
    let output = empty_shaped(&query, vec![batch, seq, 3 * heads, head_dim]);
    let (cube_count, cube_dim) = elementwise(&output);
    kernels::rotary_pack_kernel::launch::<R>(
        &output.client.clone(),
        cube_count,
        cube_dim,
        query.into_tensor_arg(),
        key.into_tensor_arg(),
        value.into_tensor_arg(),
        primitive(cos).into_tensor_arg(),
        primitive(sin).into_tensor_arg(),
        output.clone().into_tensor_arg(),
        query_scale as f32,
        back,
        output.dtype.into(),
    );
    from_primitive(output)
}

/// [`ActivationBackend::swiglu_packed_backward`](super::ActivationBackend::swiglu_packed_backward)
/// in one launch.
pub(super) fn swiglu_packed_backward<R, F, I, BT>(
    gate_up: Matrix<R, F, I, BT>,
    grad: Matrix<R, F, I, BT>,
) -> Matrix<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (gate_up, grad) = (primitive(gate_up), primitive(grad));
    let output = empty_like(&gate_up);
    let (cube_count, cube_dim) = elementwise(&grad);
    kernels::swiglu_packed_backward_kernel::launch::<R>(
        &output.client.clone(),
        cube_count,
        cube_dim,
        gate_up.into_tensor_arg(),
        grad.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        output.dtype.into(),
    );
    from_primitive(output)
}

// A kernel's branches assign a value declared before them, as CubeCL's expansion needs.
#[allow(unused_assignments)]
pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::activation_ops::cube::kernels::{silu_slope, strided};
    use crate::activation_ops::cube_rotary::kernels::turned;

    /// `x[row, column]` through its strides.
    #[cube]
    fn at<F: Float>(x: &Tensor<F>, row: usize, column: usize) -> usize {
        row * x.stride(0) + column * x.stride(1)
    }

    /// `output = [a b c]` (`[a b]` without `three`), one thread per element of `output`.
    #[cube(launch)]
    pub(in crate::activation_ops) fn concat_columns_kernel<F: Float>(
        a: &Tensor<F>,
        b: &Tensor<F>,
        c: &Tensor<F>,
        output: &mut Tensor<F>,
        #[comptime] three: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= output.len() {
            terminate!();
        }
        let total = output.shape(1);
        let row = ABSOLUTE_POS / total;
        let column = ABSOLUTE_POS % total;
        let (first, second) = (a.shape(1), a.shape(1) + b.shape(1));
        let mut value = F::new(0.0);
        if column < first {
            value = a[at(a, row, column)];
        } else if column < second || !three {
            value = b[at(b, row, column - first)];
        } else {
            value = c[at(c, row, column - second)];
        }
        output[ABSOLUTE_POS] = value;
    }

    /// `[a b c] = whole` (`[a b]` without `three`), one thread per element of `whole`.
    #[cube(launch)]
    pub(in crate::activation_ops) fn split_columns_kernel<F: Float>(
        whole: &Tensor<F>,
        a: &mut Tensor<F>,
        b: &mut Tensor<F>,
        c: &mut Tensor<F>,
        #[comptime] three: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let total = whole.shape(1);
        if ABSOLUTE_POS >= whole.shape(0) * total {
            terminate!();
        }
        let row = ABSOLUTE_POS / total;
        let column = ABSOLUTE_POS % total;
        let value = whole[at(whole, row, column)];
        let (first, second) = (a.shape(1), a.shape(1) + b.shape(1));
        if column < first {
            a[row * first + column] = value;
        } else if column < second || !three {
            b[row * b.shape(1) + column - first] = value;
        } else {
            c[row * c.shape(1) + column - second] = value;
        }
    }

    /// One thread per element of the packed `[batch, seq, 3·heads, d_h]` output: a query head's
    /// element turned and scaled, a key head's turned, a value head's copied; `back` turns back.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::activation_ops) fn rotary_pack_kernel<F: Float>(
        query: &Tensor<F>,
        key: &Tensor<F>,
        value: &Tensor<F>,
        cos: &Tensor<F>,
        sin: &Tensor<F>,
        output: &mut Tensor<F>,
        query_scale: f32,
        #[comptime] back: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= output.len() {
            terminate!();
        }
        let head_dim = output.shape(3);
        let heads = output.shape(2) / 3;
        let e = ABSOLUTE_POS % head_dim;
        let packed_head = (ABSOLUTE_POS / head_dim) % (3 * heads);
        let token = ABSOLUTE_POS / (head_dim * 3 * heads);
        let pos = token % output.shape(1);
        let head = packed_head % heads;
        let part = packed_head / heads;
        let index = (token * heads + head) * head_dim + e;
        let column = head * head_dim + e;
        let c = cos[pos * cos.stride(0) + column * cos.stride(1)];
        let s = sin[pos * sin.stride(0) + column * sin.stride(1)];
        let mut result = F::new(0.0);
        if part == 0 {
            result = turned::<F>(query, index, c, s, F::cast_from(query_scale), back);
        } else if part == 1 {
            result = turned::<F>(key, index, c, s, F::new(1.0), back);
        } else {
            result = value[strided(value, index)];
        }
        output[ABSOLUTE_POS] = result;
    }

    /// One thread per element of `grad` `[rows, d_ff]`: `∂U = ∂h ⊙ g σ(g)` and
    /// `∂G = ∂h ⊙ u ⊙ (σ(g) + g σ(g) (1 − σ(g)))` into the packed halves.
    #[cube(launch)]
    pub(in crate::activation_ops) fn swiglu_packed_backward_kernel<F: Float>(
        gate_up: &Tensor<F>,
        grad: &Tensor<F>,
        output: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= grad.len() {
            terminate!();
        }
        let width = grad.shape(1);
        let row = ABSOLUTE_POS / width;
        let column = ABSOLUTE_POS % width;
        let g = gate_up[at(gate_up, row, column)];
        let u = gate_up[at(gate_up, row, width + column)];
        let dh = grad[strided(grad, ABSOLUTE_POS)];
        let (silu, slope) = silu_slope::<F>(g);
        output[row * 2 * width + column] = dh * u * slope;
        output[row * 2 * width + width + column] = dh * silu;
    }
}
