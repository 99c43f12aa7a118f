//! AdamW on the cube backends (CUDA, wgpu) in a few launches per step: the gradients' sum of
//! squares for the global norm ([`squared_norm`]) and the updates ([`update_batch`]) each take a
//! batch of parameters per launch, as many as the device's bindings allow, at most
//! [`MAX_BATCH`]; the sum of squares spreads each gradient over up to [`NORM_PARTS`] cubes, and
//! one more launch adds their partial sums. The tensor-operation path ([`update_plain`](super::rule::update_plain)) launches
//! about a dozen kernels per parameter, and a kernel per parameter still launches one per
//! parameter: nine per layer, as many again for the norm (docs/benchmarks.md, "Kernel launches
//! per training step"). Each element takes the plain path's f32 operations in its order, with
//! the same f32 constants as `flex.rs`.
//!
//! The runners' cube backends (`haares_core::backend::{Wgpu, Cuda}`) are recognised by their types, as
//! `flex.rs` recognises Flex: a backend trait would put a bound on every generic user of
//! [`AdamW`](super::AdamW). Any other backend type takes the plain path.

use std::any::Any;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim, SequenceArg};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};

use super::cube_kernels::{adamw_kernel, sum_of_squares_kernel, total_kernel};
#[cfg(all(test, feature = "wgpu-backend"))]
use super::rule::UpdateRule;
use super::rule::{F32Rule, Moments, Pending};

/// Most parameters one launch takes: the kernels unroll a loop over them.
pub(super) const MAX_BATCH: usize = 16;
/// Bindings of one parameter in an update launch: `p`, `g`, `m`, `v` and the new `p`, `m`, `v`.
const UPDATE_BINDINGS: usize = 7;
/// Threads of a cube that sums a part of one gradient's squares.
pub(super) const NORM_THREADS: usize = 256;
/// Cubes per gradient in the sums of squares: a batch of 16 is 1,024 cubes, several per
/// multiprocessor of any GPU, where one cube per gradient left most of an H200's 132 idle.
pub(super) const NORM_PARTS: usize = 64;

type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// One parameter's update through [`update_batch`]: the updated parameter, with `moments`
/// updated, when `B` is one of the runners' cube backends and every tensor is f32; `None`
/// (nothing changed) otherwise. Only the wgpu tests call it.
#[cfg(all(test, feature = "wgpu-backend"))]
pub(crate) fn update<B: Backend>(
    rule: &UpdateRule,
    value: &Tensor<B, 1>,
    grad: &Tensor<B, 1>,
    moments: &mut Moments<B>,
) -> Option<Tensor<B, 1>> {
    let mut pending = [Pending {
        rule: *rule,
        value: value.clone(),
        grad: grad.clone(),
        moments: moments.clone(),
    }];
    let updated = update_batch(&mut pending)?.pop();
    let [Pending { moments: new, .. }] = pending;
    *moments = new;
    updated
}

/// The updated parameters, in order, with every `moments` updated, when `B` is one of the
/// runners' cube backends and every tensor is f32; `None` (nothing changed) otherwise.
pub(crate) fn update_batch<B: Backend>(pending: &mut [Pending<B>]) -> Option<Vec<Tensor<B, 1>>> {
    #[cfg(feature = "wgpu-backend")]
    if let Some(updated) = update_batch_as::<B, cubecl::wgpu::WgpuRuntime, u32>(pending) {
        return Some(updated);
    }
    #[cfg(feature = "cuda-backend")]
    if let Some(updated) = update_batch_as::<B, cubecl::cuda::CudaRuntime, u8>(pending) {
        return Some(updated);
    }
    None
}

/// The gradients' sum of squares, `[Σ_i Σ g_i²]` (one element), in one launch per batch of
/// gradients and one that adds the batches' partial sums, where squaring, summing and
/// concatenating took three launches per gradient and a Burn sum. `None` (nothing launched)
/// unless `B` is one of the runners' cube backends and every gradient is f32.
pub(crate) fn squared_norm<B: Backend>(gradients: &[Tensor<B, 1>]) -> Option<Tensor<B, 1>> {
    #[cfg(feature = "wgpu-backend")]
    if let Some(norm) = squared_norm_as::<B, cubecl::wgpu::WgpuRuntime, u32>(gradients) {
        return Some(norm);
    }
    #[cfg(feature = "cuda-backend")]
    if let Some(norm) = squared_norm_as::<B, cubecl::cuda::CudaRuntime, u8>(gradients) {
        return Some(norm);
    }
    None
}

/// `tensor` as the cube backend's f32 tensor, if `B` is `CubeBackend<R, f32, i32, BT>` and the
/// tensor holds f32.
fn as_cube<B: Backend, R: CubeRuntime, BT: BoolElement>(
    tensor: &Tensor<B, 1>,
) -> Option<&Tensor<Cube<R, BT>, 1>> {
    let cube = (tensor as &dyn Any).downcast_ref::<Tensor<Cube<R, BT>, 1>>()?;
    (cube.dtype() == DType::F32).then_some(cube)
}

/// A cube tensor as `B`'s (the caller has checked that `B` is the cube backend).
fn from_cube<B: Backend, R: CubeRuntime, BT: BoolElement>(
    tensor: CubeTensor<R>,
) -> Option<Tensor<B, 1>> {
    let tensor = Tensor::<Cube<R, BT>, 1>::from_primitive(TensorPrimitive::Float(tensor));
    (Box::new(tensor) as Box<dyn Any>)
        .downcast::<Tensor<B, 1>>()
        .ok()
        .map(|tensor| *tensor)
}

fn contiguous<R: CubeRuntime, BT: BoolElement>(tensor: &Tensor<Cube<R, BT>, 1>) -> CubeTensor<R> {
    into_contiguous(tensor.clone().into_primitive().tensor())
}

fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>, len: usize) -> CubeTensor<R> {
    empty_device_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        [len].into(),
        DType::F32,
    )
}

/// Parameters per launch of a kernel with `per_item` bindings each, `others` more tensors and
/// one more binding (the scalars and metadata): what the device allows, at most [`MAX_BATCH`].
fn batch_size<R: CubeRuntime>(like: &CubeTensor<R>, per_item: usize, others: usize) -> usize {
    let bindings = like.client.properties().hardware.max_bindings as usize;
    (bindings.saturating_sub(others + 1) / per_item).clamp(1, MAX_BATCH)
}

fn sequence<R: CubeRuntime>(
    tensors: &[CubeTensor<R>],
) -> SequenceArg<R, burn_cubecl::cubecl::prelude::Tensor<f32>> {
    let mut sequence = SequenceArg::new();
    for tensor in tensors {
        sequence.push(tensor.clone().into_tensor_arg());
    }
    sequence
}

/// [`squared_norm`] when `B` is `CubeBackend<R, f32, i32, BT>`.
fn squared_norm_as<B: Backend, R: CubeRuntime, BT: BoolElement>(
    gradients: &[Tensor<B, 1>],
) -> Option<Tensor<B, 1>> {
    let cube: Vec<_> = gradients
        .iter()
        .map(as_cube::<B, R, BT>)
        .collect::<Option<_>>()?;
    let gradients: Vec<_> = cube.into_iter().map(contiguous::<R, BT>).collect();
    let like = gradients.first()?.clone();
    // Every cube writes its part, zero where the gradient is shorter than its parts.
    let partials = empty_like(&like, gradients.len() * NORM_PARTS);
    // The gradients, and the partial sums' output.
    let batch = batch_size(&like, 1, 1);
    for (index, chunk) in gradients.chunks(batch).enumerate() {
        sum_of_squares_kernel::launch::<R>(
            &like.client,
            CubeCount::Static(NORM_PARTS as u32, chunk.len() as u32, 1),
            CubeDim::new_1d(NORM_THREADS as u32),
            sequence(chunk),
            partials.clone().into_tensor_arg(),
            (index * batch) as u32,
            NORM_THREADS,
            NORM_PARTS,
        );
    }
    let norm = empty_like(&like, 1);
    total_kernel::launch::<R>(
        &like.client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(NORM_THREADS as u32),
        partials.into_tensor_arg(),
        norm.clone().into_tensor_arg(),
        NORM_THREADS,
    );
    from_cube::<B, R, BT>(norm)
}

/// A parameter's operands on the device: `[p, g, m, v]`, contiguous.
type Operands<R> = [CubeTensor<R>; 4];

/// [`update_batch`] when `B` is `CubeBackend<R, f32, i32, BT>`.
fn update_batch_as<B: Backend, R: CubeRuntime, BT: BoolElement>(
    pending: &mut [Pending<B>],
) -> Option<Vec<Tensor<B, 1>>> {
    let mut operands: Vec<Operands<R>> = Vec::with_capacity(pending.len());
    for item in pending.iter() {
        let tensors = [
            &item.value,
            &item.grad,
            &item.moments.exp_avg,
            &item.moments.exp_avg_sq,
        ];
        let cube: Vec<_> = tensors
            .into_iter()
            .map(as_cube::<B, R, BT>)
            .collect::<Option<_>>()?;
        let len = cube[0].dims()[0];
        if cube.iter().any(|t| t.dims()[0] != len) {
            return None;
        }
        operands.push([0, 1, 2, 3].map(|at| contiguous::<R, BT>(cube[at])));
    }
    let like = operands.first()?[0].clone();
    let batch = batch_size(&like, UPDATE_BINDINGS, 0);
    let rules: Vec<F32Rule> = pending
        .iter()
        .map(|item| F32Rule::new(&item.rule))
        .collect();
    let mut outputs: Vec<[CubeTensor<R>; 3]> = Vec::with_capacity(pending.len());
    let mut start = 0;
    while start < pending.len() {
        // A launch shares its constants and its decay factor: a batch ends where a rule differs
        // in either (a parameter that does not decay joins any), or at the batch size.
        let (mut end, mut decay) = (start + 1, rules[start].decay);
        while end < pending.len() && end - start < batch && rules[end].joins(&rules[start], decay) {
            decay = decay.or(rules[end].decay);
            end += 1;
        }
        outputs.extend(launch_update(&rules[start..end], &operands[start..end]));
        start = end;
    }
    let mut updated = Vec::with_capacity(pending.len());
    for (item, [p, m, v]) in pending.iter_mut().zip(outputs) {
        updated.push(from_cube::<B, R, BT>(p)?);
        item.moments = Moments {
            exp_avg: from_cube::<B, R, BT>(m)?,
            exp_avg_sq: from_cube::<B, R, BT>(v)?,
        };
    }
    Some(updated)
}

/// Launches [`adamw_kernel`] on a batch of parameters whose rules agree but for their decay;
/// returns each one's new `[p, m, v]`.
fn launch_update<R: CubeRuntime>(
    rules: &[F32Rule],
    operands: &[Operands<R>],
) -> Vec<[CubeTensor<R>; 3]> {
    let like = &operands[0][0];
    let lens: Vec<usize> = operands.iter().map(|o| o[0].meta.shape()[0]).collect();
    let outputs: Vec<[CubeTensor<R>; 3]> = lens
        .iter()
        .map(|&len| [(); 3].map(|_| empty_like(like, len)))
        .collect();
    let input = |at: usize| -> Vec<_> { operands.iter().map(|o| o[at].clone()).collect() };
    let output = |at: usize| -> Vec<_> { outputs.iter().map(|o| o[at].clone()).collect() };
    let decayed = rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| rule.decay.is_some())
        .fold(0u32, |mask, (item, _)| mask | (1 << item));
    let decay = rules.iter().find_map(|rule| rule.decay).unwrap_or(1.0);
    let rule = &rules[0];
    let elements: usize = lens.iter().sum();
    let client = like.client.clone();
    let cube_dim = CubeDim::new(&client, elements);
    let cube_count = calculate_cube_count_elemwise(&client, elements, cube_dim);
    adamw_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        sequence(&input(0)),
        sequence(&input(1)),
        sequence(&input(2)),
        sequence(&input(3)),
        sequence(&output(0)),
        sequence(&output(1)),
        sequence(&output(2)),
        rule.beta1,
        rule.one_minus_beta1,
        rule.beta2,
        rule.one_minus_beta2,
        rule.bias2_root,
        rule.epsilon,
        rule.step_size,
        decayed,
        decay,
        rule.clip.unwrap_or(1.0),
    );
    outputs
}

/// The kernels against the plain operations on wgpu (lavapipe in CI): `cargo test -p haares-train
/// --features wgpu --lib`.
#[cfg(all(test, feature = "wgpu-backend"))]
mod wgpu_tests {
    use burn::tensor::{Tensor, TensorData};

    use super::super::rule::{AdamWSettings, Moments, Pending, UpdateRule, update_plain};
    use crate::run::optim::checks;

    type Wgpu = haares_core::backend::Wgpu;

    /// More elements than one cube holds.
    #[test]
    #[ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
    fn the_kernel_gives_the_plain_operations_bits() {
        checks::gives_the_plain_operations_bits(super::update::<Wgpu>, 70_001);
    }

    #[cfg(feature = "ndarray")]
    #[test]
    fn other_backends_take_the_plain_operations() {
        checks::leaves_other_backends_alone(super::update);
    }

    fn tensor(values: Vec<f32>) -> Tensor<Wgpu, 1> {
        let len = values.len();
        Tensor::from_data(TensorData::new(values, [len]), &Default::default())
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 7.0)
            .collect()
    }

    fn bits(tensor: &Tensor<Wgpu, 1>) -> Vec<u32> {
        let values = tensor.to_data().to_vec::<f32>().unwrap();
        values.iter().map(|x| x.to_bits()).collect()
    }

    /// More parameters than one launch takes, of lengths below, at and above a cube, decaying
    /// and not, one with constants of its own in the middle and one with a decay factor of its
    /// own after a parameter that does not decay (a launch ends at each): after two steps (the
    /// second clipped), every parameter and moment has the plain operations' bits.
    #[test]
    #[ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
    fn a_batch_gives_each_parameters_plain_bits() {
        let lengths: Vec<usize> = (0..37)
            .map(|i| [1, 255, 256, 257, 3_001][i % 5] + i)
            .collect();
        let settings = AdamWSettings::default();
        let other = AdamWSettings {
            beta1: 0.8,
            ..settings
        };
        // Parameter 21 does not decay and starts a launch; 22 decays by the default factor, 23
        // by another one, which must end that launch.
        let heavier = AdamWSettings {
            weight_decay: 0.1,
            ..settings
        };
        let start = |len: usize| Pending {
            rule: UpdateRule::new(&settings, 1, false),
            value: tensor(values(len, 1)),
            grad: tensor(vec![0.0; len]),
            moments: Moments {
                exp_avg: tensor(vec![0.0; len]),
                exp_avg_sq: tensor(vec![0.0; len]),
            },
        };
        let mut batched: Vec<_> = lengths.iter().map(|&len| start(len)).collect();
        let mut plain = batched.clone();
        for step in 1..=2u64 {
            let clip = if step == 2 { 0.37 } else { 1.0 };
            for items in [&mut batched, &mut plain] {
                for (at, item) in items.iter_mut().enumerate() {
                    let own = match at {
                        20 => &other,
                        23 => &heavier,
                        _ => &settings,
                    };
                    item.rule = UpdateRule::new(own, step, at % 3 != 0).with_clip(clip);
                    item.grad = tensor(values(item.grad.dims()[0], at + step as usize));
                }
            }
            let updated = super::update_batch(&mut batched).expect("wgpu takes the kernels");
            for ((item, value), reference) in batched.iter_mut().zip(updated).zip(&mut plain) {
                item.value = value;
                reference.value = update_plain(
                    &reference.rule,
                    reference.value.clone(),
                    reference.grad.clone(),
                    &mut reference.moments,
                );
            }
            for (at, (item, reference)) in batched.iter().zip(&plain).enumerate() {
                let what = format!("parameter {at}, step {step}");
                assert_eq!(bits(&item.value), bits(&reference.value), "p, {what}");
                let (m, v) = (&item.moments, &reference.moments);
                assert_eq!(bits(&m.exp_avg), bits(&v.exp_avg), "m, {what}");
                assert_eq!(bits(&m.exp_avg_sq), bits(&v.exp_avg_sq), "v, {what}");
            }
        }
    }

    /// Gradients shorter than, as long as, and longer than the cube, and longer than all of a
    /// gradient's parts (64 × 256 elements, so a thread takes several runs), more of them than
    /// one launch takes: their sum of squares against f64's.
    #[test]
    #[ignore = "needs a wgpu adapter: cargo test --workspace -- --ignored wgpu"]
    fn the_squared_norm_matches_the_f64_sum() {
        let lengths: Vec<usize> = (0..40).map(|i| [1, 255, 256, 257, 70_001][i % 5]).collect();
        let gradients: Vec<Tensor<Wgpu, 1>> = lengths
            .iter()
            .enumerate()
            .map(|(seed, &len)| tensor(values(len, seed)))
            .collect();
        let norm = super::squared_norm(&gradients).expect("wgpu takes the kernel");
        let norm = norm.to_data().to_vec::<f32>().unwrap();
        assert_eq!(norm.len(), 1);
        let exact: f64 = lengths
            .iter()
            .enumerate()
            .flat_map(|(seed, &len)| values(len, seed))
            .map(|x| f64::from(x).powi(2))
            .sum();
        let error = (f64::from(norm[0]) - exact).abs() / exact;
        assert!(error < 1e-5, "{} against {exact}", norm[0]);
    }

    #[cfg(feature = "ndarray")]
    #[test]
    fn other_backends_take_the_plain_norm() {
        let ones =
            burn::tensor::Tensor::<burn::backend::NdArray<f32>, 1>::ones([4], &Default::default());
        assert!(super::squared_norm(&[ones]).is_none());
    }
}
