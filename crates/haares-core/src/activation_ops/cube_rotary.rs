//! RoPE with its scale as one CubeCL kernel per direction (`cube.rs` has the other activations):
//! one thread per element, reading the element, its pair's partner and the position's cosine and
//! sine, where the tensor operations run a matrix product, two products, a sum and a scaling.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::cube::{elementwise, empty_like, primitive};
use crate::autodiff_node::from_primitive;

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// `s (x ⊙ cos ± (x P) ⊙ sin)`: [`ActivationBackend::rotary`](super::ActivationBackend::rotary)
/// or, `back`, its backward pass.
pub(super) fn turn_pairs<R, F, I, BT>(
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
        x.dtype.into(),
    );
    from_primitive(output)
}

/// Panics unless heads of `dims` `[batch, seq, heads, d_h]` fit RoPE's `[positions, width]`
/// tables: `seq ≤ positions`, `width = heads · d_h`, `d_h` even.
pub(super) fn assert_fits(what: &str, dims: [usize; 4], [positions, width]: [usize; 2]) {
    let [_, seq, heads, head_dim] = dims;
    assert!(
        seq <= positions && width == heads * head_dim && head_dim % 2 == 0,
        "{what}: heads {dims:?} do not fit tables of {positions} positions × {width}"
    );
}

// A kernel's branches assign a value declared before them, as CubeCL's expansion needs.
#[allow(unused_assignments)]
pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::activation_ops::cube::kernels::strided;

    /// Element `j` of a head at position `pos`: `y_j = s (x_j c ± t_j s_θ)` with the table's
    /// `c = cos[pos, h d_h + j]`, `s_θ = sin[…]` and the quarter turn `t_{2i} = −x_{2i+1}`,
    /// `t_{2i+1} = x_{2i}`; `back` subtracts. One thread per element of `[batch, seq, heads,
    /// d_h]`.
    #[cube(launch)]
    pub(in crate::activation_ops) fn rotary_kernel<F: Float>(
        x: &Tensor<F>,
        cos: &Tensor<F>,
        sin: &Tensor<F>,
        output: &mut Tensor<F>,
        scale: f32,
        #[comptime] back: bool,
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
        output[ABSOLUTE_POS] = turned::<F>(x, ABSOLUTE_POS, c, s, F::cast_from(scale), back);
    }

    /// Element `index` (`j` of its head) of `x`, turned by RoPE and scaled:
    /// `s (x_j c ± t_j s_θ)` with the quarter turn `t_{2i} = −x_{2i+1}`, `t_{2i+1} = x_{2i}`;
    /// `back` subtracts. The rotary kernel and the packed one (`cube_packed.rs`) call it.
    #[cube]
    pub(in crate::activation_ops) fn turned<F: Float>(
        x: &Tensor<F>,
        index: usize,
        c: F,
        s: F,
        scale: F,
        #[comptime] back: bool,
    ) -> F {
        let even = index.is_multiple_of(2);
        let mut partner = F::new(0.0);
        if even {
            partner = F::new(0.0) - x[strided(x, index + 1)];
        } else {
            partner = x[strided(x, index - 1)];
        }
        let straight = x[strided(x, index)] * c;
        let mut rotated = straight + partner * s;
        if back {
            rotated = straight - partner * s;
        }
        rotated * scale
    }
}
