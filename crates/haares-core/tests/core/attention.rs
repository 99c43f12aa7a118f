//! Causal attention (`ops::attention`) on NdArray f64 and Flex f32: the plain pair (the output
//! with each query's log-sum-exp, and the backward pass from them; the reference of the cube
//! backends' kernels) and the differentiable operation against f64 written out (the checks:
//! `attention_checks.rs`; on Flex the fused pass); the fused pass on every layout it reads and its
//! fallback for other float types; and the swap of heads and positions, Flex's copy against Burn's
//! `swap_dims` on inputs laid out every way attention hands them over, and the autodiff node's
//! gradient against Burn's autodiff of `swap_dims`.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use haares_core::HaaresBackend;
use haares_core::ops::AttentionBackend;
use haares_core::ops::attention::naive;

use crate::attention_checks::{attention_gradients_agree_with_f64, attention_pair_agrees_with_f64};
use crate::common::{Ad64, B64, Rng, tensor_values};

fn random<B: Backend>(rng: &mut Rng, shape: [usize; 4]) -> Tensor<B, 4> {
    let values = rng.normals(shape.iter().product(), 1.0);
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// Inputs of shape `[2, 5, 3, 4]` (or `[0, 5, 3, 4]`), each with its label: contiguous, a swapped
/// view (strided, runs of 4 intact), a narrowed one (starting inside its buffer), one whose last
/// dimension is strided (the plain fallback), and an empty one.
fn inputs<B: Backend>(rng: &mut Rng) -> Vec<(&'static str, Tensor<B, 4>)> {
    vec![
        ("contiguous", random(rng, [2, 5, 3, 4])),
        ("swapped view", random(rng, [2, 3, 5, 4]).swap_dims(1, 2)),
        ("narrowed", random(rng, [3, 5, 3, 4]).narrow(0, 1, 2)),
        (
            "strided last dim",
            random(rng, [2, 5, 4, 3]).swap_dims(2, 3),
        ),
        ("empty", random(rng, [0, 5, 3, 4])),
    ]
}

#[test]
fn flex_swaps_heads_like_burns_swap_dims() {
    let mut rng = Rng::new(61);
    for (label, x) in inputs::<Flex>(&mut rng) {
        let swapped = Flex::swap_heads(x.clone());
        let expected = naive::swap_heads(x);
        assert_eq!(swapped.dims(), expected.dims(), "{label}");
        // A copy: the same numbers, bit for bit.
        assert_eq!(tensor_values(swapped), tensor_values(expected), "{label}");
    }
    // f64 takes the plain view.
    let x = random::<Flex>(&mut rng, [2, 5, 3, 4]).cast(burn::tensor::DType::F64);
    let expected = tensor_values(naive::swap_heads(x.clone()));
    assert_eq!(tensor_values(Flex::swap_heads(x)), expected);
}

/// `Σ w ⊙ f(x)` for random `w`, so that every element's gradient differs.
fn gradient_through<B: AutodiffBackend>(
    x: Tensor<B, 4>,
    swap: fn(Tensor<B, 4>) -> Tensor<B, 4>,
) -> Vec<f64> {
    let x = x.require_grad();
    let output = swap(x.clone());
    let shape = output.dims();
    let weights = Rng::new(7).normals(shape.iter().product(), 1.0);
    let weights = Tensor::from_data(TensorData::new(weights, shape), &Default::default());
    let grads = (output * weights).sum().backward();
    tensor_values(x.grad(&grads).expect("a tracked input has a gradient"))
}

fn node_agrees_with_autodiff_of_swap_dims<B: AutodiffBackend + HaaresBackend>() {
    let mut rng = Rng::new(62);
    for (label, x) in inputs::<B>(&mut rng) {
        let node = gradient_through(x.clone(), B::swap_heads);
        let plain = gradient_through(x, naive::swap_heads);
        assert_eq!(node, plain, "{label}");
    }
}

#[test]
fn the_node_agrees_with_autodiff_of_swap_dims_on_flex() {
    node_agrees_with_autodiff_of_swap_dims::<Autodiff<Flex>>();
}

#[test]
fn the_node_agrees_with_autodiff_of_swap_dims_in_f64() {
    node_agrees_with_autodiff_of_swap_dims::<Ad64>();
}

/// Causal attention's plain pair (the output with each query's log-sum-exp, and the backward
/// pass from them; the reference of the cube backends' kernels) and the differentiable operation
/// against f64 written out.
#[test]
fn causal_attention_agrees_with_f64_on_flex_and_in_f64() {
    attention_pair_agrees_with_f64::<B64>(1e-12);
    attention_pair_agrees_with_f64::<Flex>(2e-5);
    attention_gradients_agree_with_f64::<Ad64>(1e-12);
    attention_gradients_agree_with_f64::<Autodiff<Flex>>(2e-5);
}

/// Flex's fused pass reads its inputs through their strides: a layout whose last dimension is
/// strided (read element by element) gives the same bits as the contiguous one (read in runs),
/// forward and backward; f64 takes the plain pair.
#[test]
fn flex_fused_attention_reads_every_layout_and_leaves_f64_to_the_plain_pair() {
    let mut rng = Rng::new(63);
    let shape = [2, 37, 3, 24];
    let values: Vec<Vec<f64>> = (0..4).map(|_| rng.normals(2 * 37 * 3 * 24, 0.5)).collect();
    let contiguous = |v: &Vec<f64>| tensor::<Flex>(v.clone(), shape);
    // Stored `[d_h, batch, seq, heads]`, viewed as `[batch, seq, heads, d_h]`.
    let strided_last = |v: &Vec<f64>| {
        let [b, t, h, e] = shape;
        let mut stored = vec![0.0; v.len()];
        for (at, &x) in v.iter().enumerate() {
            stored[(at % e) * b * t * h + at / e] = x;
        }
        tensor::<Flex>(stored, [e, b, t, h]).permute([1, 2, 3, 0])
    };
    let run = |make: &dyn Fn(&Vec<f64>) -> Tensor<Flex, 4>| {
        let [q, k, v, g] = [0, 1, 2, 3].map(|i| make(&values[i]));
        let (output, sums) = Flex::causal_attention_forward(q.clone(), k.clone(), v.clone());
        let grads = Flex::causal_attention_backward(q, k, v, output.clone(), sums.clone(), g);
        let mut all = vec![tensor_values(output), tensor_values(sums)];
        all.extend(grads.into_iter().map(tensor_values));
        all
    };
    let strided = run(&strided_last);
    assert_eq!(strided, run(&contiguous));

    let f64_inputs = [0, 1, 2].map(|i| contiguous(&values[i]).cast(DType::F64));
    let [q, k, v] = f64_inputs.clone();
    let (output, sums) = Flex::causal_attention_forward(q, k, v);
    let [q, k, v] = f64_inputs;
    let (plain_output, plain_sums) = naive::causal_attention_forward(q, k, v);
    assert_eq!(output.dtype(), DType::F64);
    assert_eq!(tensor_values(output), tensor_values(plain_output));
    assert_eq!(tensor_values(sums), tensor_values(plain_sums));
}

fn tensor<B: Backend>(values: Vec<f64>, shape: [usize; 4]) -> Tensor<B, 4> {
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}
