//! AdamW on the cube backends (CUDA, wgpu): each gradient's sum of squares for the global norm as
//! one kernel ([`squared_norms`]), and the update of one parameter as one kernel: it reads `p`,
//! `g`, `m` and `v` once and writes the new three, where the tensor-operation path
//! ([`update_plain`](super::rule::update_plain)) launches a kernel per operation, about a dozen
//! per parameter (docs/benchmarks.md, "Kernel launches per training step"). Each element takes the
//! plain path's f32 operations in its order, with the same f32 constants as `flex.rs`.
//!
//! The runners' cube backends (`WgpuUnfused`, `CudaUnfused`) are recognised by their types, as
//! `flex.rs` recognises Flex: a backend trait would put a bound on every generic user of
//! [`AdamW`](super::AdamW). Any other backend type takes the plain path.

use std::any::Any;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};

use super::rule::{F32Rule, Moments, UpdateRule};

/// The updated parameter, with `moments` updated, when `B` is one of the runners' cube backends
/// and every tensor is f32; `None` (nothing changed) otherwise.
pub(crate) fn update<B: Backend>(
    rule: &UpdateRule,
    value: &Tensor<B, 1>,
    grad: &Tensor<B, 1>,
    moments: &mut Moments<B>,
) -> Option<Tensor<B, 1>> {
    #[cfg(feature = "wgpu")]
    if let Some(updated) =
        update_as::<B, cubecl::wgpu::WgpuRuntime, u32>(rule, value, grad, moments)
    {
        return Some(updated);
    }
    #[cfg(feature = "cuda")]
    if let Some(updated) = update_as::<B, cubecl::cuda::CudaRuntime, u8>(rule, value, grad, moments)
    {
        return Some(updated);
    }
    None
}

/// Threads of the one cube that sums one gradient's squares.
const NORM_THREADS: usize = 256;

/// Every gradient's sum of squares, `[Σ g₀², Σ g₁², …]`, as one tensor of the gradients' count:
/// one kernel launch per gradient, each writing its own entry, where squaring, summing and
/// concatenating took three. `None` (nothing launched) unless `B` is one of the runners' cube
/// backends and every gradient is f32.
pub(crate) fn squared_norms<B: Backend>(gradients: &[Tensor<B, 1>]) -> Option<Tensor<B, 1>> {
    #[cfg(feature = "wgpu")]
    if let Some(norms) = squared_norms_as::<B, cubecl::wgpu::WgpuRuntime, u32>(gradients) {
        return Some(norms);
    }
    #[cfg(feature = "cuda")]
    if let Some(norms) = squared_norms_as::<B, cubecl::cuda::CudaRuntime, u8>(gradients) {
        return Some(norms);
    }
    None
}

/// [`squared_norms`] when `B` is `CubeBackend<R, f32, i32, BT>`.
fn squared_norms_as<B: Backend, R: CubeRuntime, BT: BoolElement>(
    gradients: &[Tensor<B, 1>],
) -> Option<Tensor<B, 1>> {
    type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;
    let cube: Vec<&Tensor<Cube<R, BT>, 1>> = gradients
        .iter()
        .map(|g| (g as &dyn Any).downcast_ref::<Tensor<Cube<R, BT>, 1>>())
        .collect::<Option<_>>()?;
    let first = cube.first()?;
    if cube.iter().any(|g| g.dtype() != DType::F32) {
        return None;
    }
    let like = (*first).clone().into_primitive().tensor();
    let norms = empty_device_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        [cube.len()].into(),
        DType::F32,
    );
    for (index, gradient) in cube.iter().enumerate() {
        let gradient = into_contiguous((*gradient).clone().into_primitive().tensor());
        kernels::sum_of_squares_kernel::launch::<R>(
            &like.client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(NORM_THREADS as u32),
            gradient.into_tensor_arg(),
            norms.clone().into_tensor_arg(),
            index as u32,
            NORM_THREADS,
        );
    }
    let norms = Tensor::<Cube<R, BT>, 1>::from_primitive(TensorPrimitive::Float(norms));
    (Box::new(norms) as Box<dyn Any>)
        .downcast::<Tensor<B, 1>>()
        .ok()
        .map(|norms| *norms)
}

/// [`update`] when `B` is `CubeBackend<R, f32, i32, BT>`.
fn update_as<B: Backend, R: CubeRuntime, BT: BoolElement>(
    rule: &UpdateRule,
    value: &Tensor<B, 1>,
    grad: &Tensor<B, 1>,
    moments: &mut Moments<B>,
) -> Option<Tensor<B, 1>> {
    type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;
    let value = (value as &dyn Any).downcast_ref::<Tensor<Cube<R, BT>, 1>>()?;
    let grad = (grad as &dyn Any).downcast_ref::<Tensor<Cube<R, BT>, 1>>()?;
    let moments = (moments as &mut dyn Any).downcast_mut::<Moments<Cube<R, BT>>>()?;
    let tensors = [value, grad, &moments.exp_avg, &moments.exp_avg_sq];
    let len = value.dims()[0];
    if tensors
        .iter()
        .any(|t| t.dtype() != DType::F32 || t.dims()[0] != len)
    {
        return None;
    }
    let [p, g, m, v] = tensors.map(|t| into_contiguous(t.clone().into_primitive().tensor()));
    let [new_p, new_m, new_v] = launch_update(&F32Rule::new(rule), [p, g, m, v]);
    let tensor =
        |t: CubeTensor<R>| Tensor::<Cube<R, BT>, 1>::from_primitive(TensorPrimitive::Float(t));
    // Converted back before the moments change, so that `None` always means nothing changed.
    let updated = (Box::new(tensor(new_p)) as Box<dyn Any>)
        .downcast::<Tensor<B, 1>>()
        .ok()?;
    moments.exp_avg = tensor(new_m);
    moments.exp_avg_sq = tensor(new_v);
    Some(*updated)
}

/// Launches [`kernels::adamw_kernel`] on contiguous `[p, g, m, v]` of one length; returns the new
/// `[p, m, v]`.
fn launch_update<R: CubeRuntime>(rule: &F32Rule, inputs: [CubeTensor<R>; 4]) -> [CubeTensor<R>; 3] {
    let like = &inputs[0];
    let elements = like.meta.shape().num_elements();
    let outputs = [(); 3].map(|_| {
        empty_device_dtype::<R>(
            like.client.clone(),
            like.device.clone(),
            like.meta.shape().clone(),
            like.dtype,
        )
    });
    let client = like.client.clone();
    let cube_dim = CubeDim::new(&client, elements);
    let cube_count = calculate_cube_count_elemwise(&client, elements, cube_dim);
    let [p, g, m, v] = inputs;
    let [out_p, out_m, out_v] = outputs.clone();
    kernels::adamw_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        p.into_tensor_arg(),
        g.into_tensor_arg(),
        m.into_tensor_arg(),
        v.into_tensor_arg(),
        out_p.into_tensor_arg(),
        out_m.into_tensor_arg(),
        out_v.into_tensor_arg(),
        rule.beta1,
        rule.one_minus_beta1,
        rule.beta2,
        rule.one_minus_beta2,
        rule.bias2_root,
        rule.epsilon,
        rule.step_size,
        rule.decay.unwrap_or(1.0),
        rule.clip.unwrap_or(1.0),
    );
    outputs
}

/// The kernel, in a module of its own because CubeCL's `Tensor` is not Burn's.
mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    /// One element of [`update_plain`](super::super::rule::update_plain) per thread, in its
    /// order: `g ← g·clip`, `m ← β₁m + (1 − β₁)g`, `v ← β₂v + (1 − β₂)g²`, `p ← p·decay − (m /
    /// (√v / √(1 − β₂ᵗ) + ε))·step`. `decay` and `clip` are 1 where the plain path skips the
    /// product (`x·1 = x` exactly).
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn adamw_kernel(
        p: &Tensor<f32>,
        g: &Tensor<f32>,
        m: &Tensor<f32>,
        v: &Tensor<f32>,
        out_p: &mut Tensor<f32>,
        out_m: &mut Tensor<f32>,
        out_v: &mut Tensor<f32>,
        beta1: f32,
        one_minus_beta1: f32,
        beta2: f32,
        one_minus_beta2: f32,
        bias2_root: f32,
        epsilon: f32,
        step_size: f32,
        decay: f32,
        clip: f32,
    ) {
        if ABSOLUTE_POS >= out_p.len() {
            terminate!();
        }
        let at = ABSOLUTE_POS;
        let grad = g[at] * clip;
        let exp_avg = m[at] * beta1 + grad * one_minus_beta1;
        let exp_avg_sq = v[at] * beta2 + (grad * grad) * one_minus_beta2;
        let denominator = f32::sqrt(exp_avg_sq) / bias2_root + epsilon;
        out_p[at] = p[at] * decay - (exp_avg / denominator) * step_size;
        out_m[at] = exp_avg;
        out_v[at] = exp_avg_sq;
    }

    /// `norms[index] = Σ g²` with one cube: each thread sums the squares at its stride, then
    /// thread 0 adds the threads' sums in order.
    #[cube(launch)]
    pub(super) fn sum_of_squares_kernel(
        g: &Tensor<f32>,
        norms: &mut Tensor<f32>,
        index: u32,
        #[comptime] threads: usize,
    ) {
        let lane = UNIT_POS_X as usize;
        let mut partials = SharedMemory::<f32>::new(threads);
        let mut sum = f32::new(0.0);
        let mut at = lane;
        while at < g.len() {
            let x = g[at];
            sum += x * x;
            at += threads;
        }
        partials[lane] = sum;
        sync_cube();
        if lane == 0 {
            let mut total = partials[0];
            for thread in 1..threads {
                total += partials[thread];
            }
            norms[index as usize] = total;
        }
    }
}

/// The kernel against the plain operations on wgpu (lavapipe in CI): `cargo test -p haares-train
/// --features wgpu --lib`.
#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use crate::run::optim::checks;

    /// More elements than one cube holds.
    #[test]
    fn the_kernel_gives_the_plain_operations_bits() {
        checks::gives_the_plain_operations_bits(
            super::update::<crate::backend::WgpuUnfused>,
            70_001,
        );
    }

    #[cfg(feature = "ndarray")]
    #[test]
    fn other_backends_take_the_plain_operations() {
        checks::leaves_other_backends_alone(super::update);
    }

    /// Gradients shorter than, as long as, and longer than the cube, against f64 sums.
    #[test]
    fn squared_norms_match_f64_sums() {
        use burn::tensor::{Tensor, TensorData};
        type Wgpu = crate::backend::WgpuUnfused;
        let device = Default::default();
        let lengths = [1, 255, 256, 257, 70_001];
        let values = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect()
        };
        let gradients: Vec<Tensor<Wgpu, 1>> = lengths
            .iter()
            .map(|&len| Tensor::from_data(TensorData::new(values(len), [len]), &device))
            .collect();
        let norms = super::squared_norms(&gradients).expect("wgpu takes the kernel");
        let norms = norms.to_data().to_vec::<f32>().unwrap();
        for (len, norm) in lengths.iter().zip(norms) {
            let exact: f64 = values(*len).iter().map(|&x| (x as f64) * (x as f64)).sum();
            let error = (norm as f64 - exact).abs() / exact;
            assert!(error < 1e-5, "{len} elements: {norm} against {exact}");
        }
    }

    #[cfg(feature = "ndarray")]
    #[test]
    fn other_backends_take_the_plain_norm() {
        let ones =
            burn::tensor::Tensor::<burn::backend::NdArray<f32>, 1>::ones([4], &Default::default());
        assert!(super::squared_norms(&[ones]).is_none());
    }
}
