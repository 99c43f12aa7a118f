//! SwiGLU as CubeCL kernels on Burn's cube backends (CUDA, wgpu): one thread per element, one
//! launch each way where the tensor operations launch four to eight, and the packed projection's
//! backward pass writing both gradients into the halves they belong to.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::SwigluBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{dense, elementwise, empty_like, primitive};

impl<R, F, I, BT> SwigluBackend for CubeBackend<R, F, I, BT>
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
            up.clone().into_tensor_arg(),
            output.clone().into_tensor_arg(),
            dense(&[&gate, &up]),
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
            up.clone().into_tensor_arg(),
            grad.clone().into_tensor_arg(),
            gate_grad.clone().into_tensor_arg(),
            up_grad.clone().into_tensor_arg(),
            dense(&[&gate, &up, &grad]),
            gate.dtype.into(),
        );
        (from_primitive(gate_grad), from_primitive(up_grad))
    }

    fn swiglu_packed_backward(gate_up: Tensor<Self, 2>, grad: Tensor<Self, 2>) -> Tensor<Self, 2> {
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
}

/// The kernels, in a module of their own because CubeCL's `Tensor` is not Burn's.
pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::{at, element_at};

    /// `σ(x) = 1 / (1 + e^{−x})`.
    #[cube]
    fn sigmoid<F: Float>(x: F) -> F {
        F::new(1.0) / (F::new(1.0) + (F::new(0.0) - x).exp())
    }

    /// `h = g σ(g) ⊙ u`, one thread per element.
    #[cube(launch)]
    pub(in crate::ops) fn swiglu_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        output: &mut Tensor<F>,
        #[comptime] dense: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= output.len() {
            terminate!();
        }
        let g = gate[element_at(gate, ABSOLUTE_POS, dense)];
        output[ABSOLUTE_POS] = g * sigmoid::<F>(g) * up[element_at(up, ABSOLUTE_POS, dense)];
    }

    /// `∂u = ∂h ⊙ g σ(g)` and `∂g = ∂h ⊙ u ⊙ (σ(g) + g σ(g) (1 − σ(g)))`, one thread per element.
    #[cube(launch)]
    pub(in crate::ops) fn swiglu_backward_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        grad: &Tensor<F>,
        gate_grad: &mut Tensor<F>,
        up_grad: &mut Tensor<F>,
        #[comptime] dense: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        if ABSOLUTE_POS >= gate_grad.len() {
            terminate!();
        }
        let g = gate[element_at(gate, ABSOLUTE_POS, dense)];
        let u = up[element_at(up, ABSOLUTE_POS, dense)];
        let dh = grad[element_at(grad, ABSOLUTE_POS, dense)];
        let (silu, slope) = silu_slope::<F>(g);
        up_grad[ABSOLUTE_POS] = dh * silu;
        gate_grad[ABSOLUTE_POS] = dh * u * slope;
    }

    /// `SiLU(g) = g σ(g)` and its slope `σ(g) + g σ(g) (1 − σ(g))`.
    #[cube]
    pub(in crate::ops) fn silu_slope<F: Float>(g: F) -> (F, F) {
        let s = sigmoid::<F>(g);
        let silu = g * s;
        (silu, s + silu * (F::new(1.0) - s))
    }

    /// One thread per element of `grad` `[rows, d_ff]`: `∂U = ∂h ⊙ g σ(g)` and
    /// `∂G = ∂h ⊙ u ⊙ (σ(g) + g σ(g) (1 − σ(g)))` into the packed halves.
    #[cube(launch)]
    pub(in crate::ops) fn swiglu_packed_backward_kernel<F: Float>(
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
        let dh = grad[at(grad, row, column)];
        let (silu, slope) = silu_slope::<F>(g);
        output[row * 2 * width + column] = dh * u * slope;
        output[row * 2 * width + width + column] = dh * silu;
    }
}
