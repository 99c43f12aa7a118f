//! RoPE with its scale as one CubeCL kernel per direction: one thread per element, reading the
//! element, its pair's partner and the position's cosine and sine, where the tensor operations
//! run a matrix product, two products, a sum and a scaling. On a packed projection one kernel
//! turns the query's and key's heads (or their gradients back) and copies the value's, into one
//! `[batch, seq, 3·heads, d_h]` tensor.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::RotaryBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{dense, elementwise, empty_like, empty_shaped, primitive};
use crate::ops::projections::naive::unpack_heads;

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
type Matrix<R, F, I, BT> = Tensor<Cube<R, F, I, BT>, 2>;

impl<R, F, I, BT> RotaryBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rotary(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        turn_pairs(x, cos, sin, scale, false)
    }

    fn rotary_backward(
        grad: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        turn_pairs(grad, cos, sin, scale, true)
    }

    fn rotary_packed(
        qkv: Tensor<Self, 4>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        rotary_pack(unpack_heads(qkv), cos, sin, query_scale, false)
    }

    fn rotary_join(
        gradients: [Tensor<Self, 4>; 3],
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        _quarter_turn: Tensor<Self, 2>,
        query_scale: f64,
    ) -> Tensor<Self, 4> {
        rotary_pack(gradients, cos, sin, query_scale, true)
    }
}

/// `s (x ⊙ cos ± (x P) ⊙ sin)`: [`RotaryBackend::rotary`]
/// or, `back`, its backward pass.
fn turn_pairs<R, F, I, BT>(
    x: Tensor<Cube<R, F, I, BT>, 4>,
    cos: Tensor<Cube<R, F, I, BT>, 2>,
    sin: Tensor<Cube<R, F, I, BT>, 2>,
    scale: f64,
    back: bool,
) -> Tensor<Cube<R, F, I, BT>, 4>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    assert_fits("rotary", x.dims(), cos.dims());
    let (x, cos, sin) = (primitive(x), primitive(cos), primitive(sin));
    let output = empty_like(&x);
    let (cube_count, cube_dim) = elementwise(&output);
    kernels::rotary_kernel::launch::<R>(
        &x.client.clone(),
        cube_count,
        cube_dim,
        x.clone().into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        scale as f32,
        back,
        dense(&[&x]),
        x.dtype.into(),
    );
    from_primitive(output)
}

/// Panics unless heads of `dims` `[batch, seq, heads, d_h]` fit RoPE's `[positions, width]`
/// tables: `seq ≤ positions`, `width = heads · d_h`, `d_h` even.
fn assert_fits(what: &str, dims: [usize; 4], [positions, width]: [usize; 2]) {
    let [_, seq, heads, head_dim] = dims;
    assert!(
        seq <= positions && width == heads * head_dim && head_dim % 2 == 0,
        "{what}: heads {dims:?} do not fit tables of {positions} positions × {width}"
    );
}

/// [`RotaryBackend::rotary_packed`] (the query,
/// key and value views of one packed projection) or, `back`,
/// [`RotaryBackend::rotary_join`] (their three
/// gradients), in one launch: one packed `[batch, seq, 3·heads, d_h]` output.
fn rotary_pack<R, F, I, BT>(
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
    assert_fits("rotary_pack", query.dims(), cos.dims());
    let [query, key, value] = [query, key, value].map(primitive);
    let dense = dense(&[&query, &key, &value]);
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
        dense,
        output.dtype.into(),
    );
    from_primitive(output)
}

// A kernel's branches assign a value declared before them, as CubeCL's expansion needs.
#[allow(unused_assignments)]
pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::element_at;

    /// Element `j` of a head at position `pos`: `y_j = s (x_j c ± t_j s_θ)` with the table's
    /// `c = cos[pos, h d_h + j]`, `s_θ = sin[…]` and the quarter turn `t_{2i} = −x_{2i+1}`,
    /// `t_{2i+1} = x_{2i}`; `back` subtracts. One thread per element of `[batch, seq, heads,
    /// d_h]`.
    #[cube(launch)]
    pub(in crate::ops) fn rotary_kernel<F: Float>(
        x: &Tensor<F>,
        cos: &Tensor<F>,
        sin: &Tensor<F>,
        output: &mut Tensor<F>,
        scale: f32,
        #[comptime] back: bool,
        #[comptime] dense: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= output.len() {
            terminate!();
        }
        let head_dim = output.shape(3);
        let width = output.shape(2) * head_dim;
        let column = ABSOLUTE_POS % width;
        let pos = (ABSOLUTE_POS / width) % output.shape(1);
        let c = cos[pos * cos.stride(0) + column * cos.stride(1)];
        let s = sin[pos * sin.stride(0) + column * sin.stride(1)];
        output[ABSOLUTE_POS] = turned::<F>(x, ABSOLUTE_POS, c, s, F::cast_from(scale), back, dense);
    }

    /// Element `index` (`j` of its head) of `x`, turned by RoPE and scaled:
    /// `s (x_j c ± t_j s_θ)` with the quarter turn `t_{2i} = −x_{2i+1}`, `t_{2i+1} = x_{2i}`;
    /// `back` subtracts. The rotary kernel and the packed one (`rotary_pack_kernel`) call it.
    /// The pair's partner is the next or previous element of the same head, one last-dimension
    /// stride away, so the element is found once (`dense`: at its own index).
    #[cube]
    fn turned<F: Float>(
        x: &Tensor<F>,
        index: usize,
        c: F,
        s: F,
        scale: F,
        #[comptime] back: bool,
        #[comptime] dense: bool,
    ) -> F {
        let at = element_at(x, index, dense);
        let step = x.stride(x.rank() - 1);
        let even = index.is_multiple_of(2);
        let mut partner = F::new(0.0);
        if even {
            partner = F::new(0.0) - x[at + step];
        } else {
            partner = x[at - step];
        }
        let straight = x[at] * c;
        let mut rotated = straight + partner * s;
        if back {
            rotated = straight - partner * s;
        }
        rotated * scale
    }

    /// One thread per element of the packed `[batch, seq, 3·heads, d_h]` output: a query head's
    /// element turned and scaled, a key head's turned, a value head's copied; `back` turns back.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(in crate::ops) fn rotary_pack_kernel<F: Float>(
        query: &Tensor<F>,
        key: &Tensor<F>,
        value: &Tensor<F>,
        cos: &Tensor<F>,
        sin: &Tensor<F>,
        output: &mut Tensor<F>,
        query_scale: f32,
        #[comptime] back: bool,
        #[comptime] dense: bool,
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
            result = turned::<F>(query, index, c, s, F::cast_from(query_scale), back, dense);
        } else if part == 1 {
            result = turned::<F>(key, index, c, s, F::new(1.0), back, dense);
        } else {
            result = value[element_at(value, index, dense)];
        }
        output[ABSOLUTE_POS] = result;
    }
}
