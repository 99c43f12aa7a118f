//! The fused activations (`activation_ops`): Flex's SIMD loops against f64 computed here and
//! against the plain tensor operations, and the autodiff nodes' gradients against Burn's autodiff
//! of the plain operations, on NdArray f64 and Flex f32.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use haares_core::ActivationBackend;
use haares_core::activation_ops::naive;

use crate::common::{Ad64, B64, Rng, max_abs_diff, tensor_values};

/// Elementwise shapes: below and past a SIMD vector, with and without a remainder.
/// The last is two of Flex's parallel tasks (16384 elements each), the second one partial.
const SHAPES: [[usize; 2]; 4] = [[1, 1], [7, 5], [33, 131], [67, 256]];
/// Score shapes `[matrices, seq, seq]`.
/// Flex's softmax tasks hold whole matrices: 56 of 17 × 17, so 60 are two tasks, the second
/// partial; 128 × 128 is one matrix a task.
const SCORE_SHAPES: [[usize; 3]; 4] = [[1, 1, 1], [3, 2, 2], [60, 17, 17], [4, 128, 128]];

fn tensor<B: Backend, const D: usize>(values: Vec<f64>, shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// Gates over the whole range SiLU sees, its tails included: normals of spread 6, with every
/// seventh value from a fixed list of extremes.
fn gates(rng: &mut Rng, count: usize) -> Vec<f64> {
    const EXTREMES: [f64; 8] = [0.0, -0.0, 1e-6, -30.0, 30.0, -87.0, 88.0, -100.0];
    (0..count)
        .map(|at| match at % 7 {
            3 => EXTREMES[(at / 7) % EXTREMES.len()],
            _ => 6.0 * rng.normal(),
        })
        .collect()
}

/// Scores with the entries above each diagonal set huge, so that a loop which read them would
/// be far off.
fn causal_scores(rng: &mut Rng, shape: [usize; 3]) -> Vec<f64> {
    let seq = shape[2];
    (0..shape.iter().product::<usize>())
        .map(|at| match (at % seq) > (at / seq) % seq {
            true => 1e4,
            false => 8.0 * rng.normal(),
        })
        .collect()
}

/// `|a − b| ≤ max(tolerance · |b|, absolute)` for every element.
fn assert_close(actual: &[f64], expected: &[f64], tolerance: f64, absolute: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (at, (a, b)) in actual.iter().zip(expected).enumerate() {
        let bound = (tolerance * b.abs()).max(absolute);
        assert!(
            (a - b).abs() <= bound,
            "{what}: element {at} is {a:e}, expected {b:e} (bound {bound:e})"
        );
    }
}

/// `max |a − b| ≤ tolerance · max(max |b|, floor)`: for results that cancel, compared at the
/// tensor's scale.
fn assert_within_scale(actual: &[f64], expected: &[f64], tolerance: f64, floor: f64, what: &str) {
    let scale = expected.iter().fold(floor, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(actual, expected);
    assert!(
        diff <= tolerance * scale,
        "{what}: max difference {diff:e} at scale {scale:e}"
    );
}

/// `g σ(g) u` and its gradients `(∂gate, ∂up)` in f64 on the host, with `σ(g) = 1 / (1 + e^{−g})`,
/// accurate in both tails (the tanh identity of the f64 backends loses digits below g ≈ −20).
fn swiglu_f64(gate: &[f64], up: &[f64], grad: &[f64]) -> [Vec<f64>; 3] {
    let mut answers = [vec![], vec![], vec![]];
    for ((&g, &u), &dh) in gate.iter().zip(up).zip(grad) {
        let s = 1.0 / (1.0 + (-g).exp());
        answers[0].push(g * s * u);
        answers[1].push(dh * u * (s + g * s * (1.0 - s)));
        answers[2].push(dh * g * s);
    }
    answers
}

/// The causal softmax of `[matrices, seq, seq]` scores in f64 on the host.
fn causal_softmax_f64(scores: &[f64], seq: usize) -> Vec<f64> {
    let mut probabilities = vec![0.0; scores.len()];
    for (row, (x, y)) in scores
        .chunks(seq)
        .zip(probabilities.chunks_mut(seq))
        .enumerate()
    {
        let visible = &x[..row % seq + 1];
        let largest = visible.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let total: f64 = visible.iter().map(|v| (v - largest).exp()).sum();
        for (y, x) in y.iter_mut().zip(visible) {
            *y = (x - largest).exp() / total;
        }
    }
    probabilities
}

/// Flex's SwiGLU loops against f64 (to within a few f32 roundings) and against the plain f32
/// operations; transposed operands take the plain path.
#[test]
fn flex_swiglu_agrees_with_f64_and_with_the_plain_operations() {
    let mut rng = Rng::new(77);
    for shape in SHAPES {
        let count = shape[0] * shape[1];
        let gate = gates(&mut rng, count);
        let (up, grad) = (rng.normals(count, 1.0), rng.normals(count, 1.0));
        let on_flex = |values: &Vec<f64>| tensor::<Flex, 2>(values.clone(), shape);
        // The f64 answers from the f32-rounded inputs the loops see.
        let rounded = |values: &Vec<f64>| tensor_values(on_flex(values));
        let [exact, exact_gate, exact_up] =
            swiglu_f64(&rounded(&gate), &rounded(&up), &rounded(&grad));
        let what = |name: &str| format!("{name}, shape {shape:?}");

        let fused = tensor_values(Flex::swiglu(on_flex(&gate), on_flex(&up)));
        // Within 1e-34 absolutely: past g ≈ −88, where e^{−g} overflows f32, the loops' σ stops at
        // ≈ 4e−39 (`simd::exp`'s range) where f64's goes on falling.
        assert_close(&fused, &exact, 1e-6, 1e-34, &what("swiglu vs f64"));
        let plain = tensor_values(naive::swiglu(on_flex(&gate), on_flex(&up)));
        assert_within_scale(&fused, &plain, 1e-6, 0.0, &what("swiglu vs plain f32"));

        let (gate_grad, up_grad) =
            Flex::swiglu_backward(on_flex(&gate), on_flex(&up), on_flex(&grad));
        // ∂gate's slope `σ + g σ (1 − σ)` crosses zero near g ≈ −1.28, where its sum cancels:
        // compared at the size of its terms, |∂h u|.
        let gate_grad = tensor_values(gate_grad);
        for (at, (actual, expected)) in gate_grad.iter().zip(&exact_gate).enumerate() {
            let terms = (rounded(&grad)[at] * rounded(&up)[at]).abs();
            let bound = (1e-6 * expected.abs().max(terms)).max(1e-34);
            assert!(
                (actual - expected).abs() <= bound,
                "{}: element {at} is {actual:e}, expected {expected:e}",
                what("swiglu ∂gate vs f64")
            );
        }
        let up_grad = tensor_values(up_grad);
        assert_close(&up_grad, &exact_up, 1e-6, 1e-34, &what("swiglu ∂up vs f64"));

        let transposed =
            |values: &Vec<f64>| tensor::<Flex, 2>(values.clone(), [shape[1], shape[0]]).transpose();
        let strided = Flex::swiglu(transposed(&gate), transposed(&up));
        let plain = naive::swiglu(transposed(&gate), transposed(&up));
        let what = what("swiglu, transposed");
        assert_close(
            &tensor_values(strided),
            &tensor_values(plain),
            0.0,
            0.0,
            &what,
        );
    }
}

/// Flex's causal softmax loops against f64 and against the plain f32 operations (which mask
/// the huge scores above the diagonal that the loops must not read).
#[test]
fn flex_causal_softmax_agrees_with_f64_and_with_the_plain_operations() {
    let mut rng = Rng::new(78);
    for shape in SCORE_SHAPES {
        let count = shape.iter().product::<usize>();
        let (scores, grad) = (causal_scores(&mut rng, shape), rng.normals(count, 1.0));
        let on_flex = |values: &Vec<f64>| tensor::<Flex, 3>(values.clone(), shape);
        let rounded = |values: &Vec<f64>| tensor_values(on_flex(values));
        let exact = causal_softmax_f64(&rounded(&scores), shape[2]);
        let what = |name: &str| format!("{name}, shape {shape:?}");

        let fused = Flex::causal_softmax(on_flex(&scores));
        let fused_values = tensor_values(fused.clone());
        // The f32 difference `x − max` alone is off by up to 2⁻²⁴·|x − max| (≈ 4e−6 at a distance
        // of 64), which `e^{x − max}` turns into a relative error of the same size.
        let what_f64 = what("causal_softmax vs f64");
        assert_close(&fused_values, &exact, 1e-5, 1e-37, &what_f64);
        let plain = tensor_values(naive::causal_softmax(on_flex(&scores)));
        let what_plain = what("causal_softmax vs plain f32");
        assert_close(&fused_values, &plain, 1e-6, 1e-37, &what_plain);

        let fused_grad = tensor_values(Flex::causal_softmax_backward(fused, on_flex(&grad)));
        let exact_grad = naive::causal_softmax_backward(
            tensor::<B64, 3>(fused_values, shape),
            tensor::<B64, 3>(rounded(&grad), shape),
        );
        // `∂y − Σ y ∂y` cancels: compared at the scale of `∂y` (about 1) or the result's.
        let what = what("causal_softmax_backward vs f64");
        assert_within_scale(&fused_grad, &tensor_values(exact_grad), 1e-6, 1.0, &what);
    }
}

/// NaN in a gate or a visible score comes out as NaN, as from the plain operations.
#[test]
fn flex_loops_propagate_nan() {
    let gate = tensor::<Flex, 1>(vec![f64::NAN, 1.0], [2]);
    let values = tensor_values(Flex::swiglu(gate, tensor(vec![1.0, 1.0], [2])));
    assert!(
        values[0].is_nan() && values[1].is_finite(),
        "swiglu: {values:?}"
    );
    let scores = tensor::<Flex, 3>(vec![0.0, 5.0, f64::NAN, 1.0], [1, 2, 2]);
    let values = tensor_values(Flex::causal_softmax(scores));
    assert_eq!(
        &values[..2],
        &[1.0, 0.0],
        "the first row sees only its own key"
    );
    assert!(
        values[2..].iter().all(|p| p.is_nan()),
        "a NaN score spoils its row: {values:?}"
    );
}

/// `Σ w ⊙ output` for random `w` drawn from `seed`, so that every output element's gradient
/// differs.
fn weighted_total<B: Backend, const D: usize>(output: Tensor<B, D>, seed: u64) -> Tensor<B, 1> {
    let shape = output.dims();
    let weights = Rng::new(seed).normals(shape.iter().product(), 1.0);
    (output * tensor::<B, D>(weights, shape)).sum()
}

fn gradient<B: AutodiffBackend, const D: usize>(
    tensor: &Tensor<B, D>,
    grads: &B::Gradients,
) -> Vec<f64> {
    tensor_values(tensor.grad(grads).expect("a tracked input has a gradient"))
}

/// The nodes' gradients against Burn's autodiff through the plain operations (which checks the
/// `*_backward` formulas as well as the nodes), with one input of SwiGLU tracked or both.
fn nodes_agree_with_autodiff_of_the_plain_operations<B>(tolerance: f64)
where
    B: AutodiffBackend + ActivationBackend,
{
    let mut rng = Rng::new(91);
    for shape in SHAPES {
        let count = shape[0] * shape[1];
        let (gate, up) = (gates(&mut rng, count), rng.normals(count, 1.0));
        for up_tracked in [true, false] {
            let inputs = || {
                let gate = tensor::<B, 2>(gate.clone(), shape).require_grad();
                let up = tensor::<B, 2>(up.clone(), shape);
                (gate, if up_tracked { up.require_grad() } else { up })
            };
            let seed = rng.next_u64();
            let (fused_gate, fused_up) = inputs();
            let fused = B::swiglu(fused_gate.clone(), fused_up.clone());
            let fused = weighted_total(fused, seed).backward();
            let (plain_gate, plain_up) = inputs();
            let plain = naive::swiglu(plain_gate.clone(), plain_up.clone());
            let plain = weighted_total(plain, seed).backward();
            let what = format!("swiglu, shape {shape:?}, up tracked {up_tracked}");
            let (fused_grad, plain_grad) =
                (gradient(&fused_gate, &fused), gradient(&plain_gate, &plain));
            assert_within_scale(&fused_grad, &plain_grad, tolerance, 0.0, &what);
            match up_tracked {
                true => {
                    let (fused_grad, plain_grad) =
                        (gradient(&fused_up, &fused), gradient(&plain_up, &plain));
                    assert_within_scale(&fused_grad, &plain_grad, tolerance, 0.0, &what);
                }
                false => assert!(fused_up.grad(&fused).is_none(), "{what}: ∂up"),
            }
        }
    }
    for shape in SCORE_SHAPES {
        let scores = causal_scores(&mut rng, shape);
        let seed = rng.next_u64();
        let input = || tensor::<B, 3>(scores.clone(), shape).require_grad();
        let (fused_scores, plain_scores) = (input(), input());
        let fused = weighted_total(B::causal_softmax(fused_scores.clone()), seed).backward();
        let plain = weighted_total(naive::causal_softmax(plain_scores.clone()), seed).backward();
        let (fused, plain) = (
            gradient(&fused_scores, &fused),
            gradient(&plain_scores, &plain),
        );
        // Saturated rows have gradients near zero: at least the scale of `w` (about 1).
        let what = format!("causal_softmax ∂scores, shape {shape:?}");
        assert_within_scale(&fused, &plain, tolerance, 1.0, &what);
    }
}

#[test]
fn nodes_agree_with_autodiff_of_the_plain_operations_in_f64() {
    nodes_agree_with_autodiff_of_the_plain_operations::<Ad64>(1e-12);
}

#[test]
fn nodes_agree_with_autodiff_of_the_plain_operations_on_flex() {
    nodes_agree_with_autodiff_of_the_plain_operations::<Autodiff<Flex>>(2e-6);
}
