//! The fused activations' (and RMSNorm's) checks, generic over the backend: the primitives against f64 computed
//! here and against the plain tensor operations, and the autodiff nodes' gradients against Burn's
//! autodiff of the plain operations. `core/activations.rs` runs them on Flex and NdArray f64,
//! `portability.rs` on the cube backends' kernels (wgpu, CUDA).

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use haares_core::ActivationBackend;
use haares_core::activation_ops::naive;

use super::common::{Rng, max_abs_diff, tensor_values};

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
pub fn swiglu_f64(gate: &[f64], up: &[f64], grad: &[f64]) -> [Vec<f64>; 3] {
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

/// `∂x = y (∂y − Σ_k y_k ∂y_k)` per row of `[..., seq]` values, in f64 on the host.
fn causal_softmax_backward_f64(probabilities: &[f64], grad: &[f64], seq: usize) -> Vec<f64> {
    let mut result = Vec::with_capacity(grad.len());
    for (y, dy) in probabilities.chunks(seq).zip(grad.chunks(seq)) {
        let dot: f64 = y.iter().zip(dy).map(|(y, dy)| y * dy).sum();
        result.extend(y.iter().zip(dy).map(|(y, dy)| y * (dy - dot)));
    }
    result
}

/// `B`'s SwiGLU and its backward against f64 (to within `relative`, a few roundings of the
/// backend's float type) and against the plain operations; transposed operands too.
pub fn swiglu_agrees_with_f64_and_the_plain_operations<B: ActivationBackend>(relative: f64) {
    let mut rng = Rng::new(77);
    for shape in SHAPES {
        let count = shape[0] * shape[1];
        let gate = gates(&mut rng, count);
        let (up, grad) = (rng.normals(count, 1.0), rng.normals(count, 1.0));
        let on = |values: &Vec<f64>| tensor::<B, 2>(values.clone(), shape);
        // The f64 answers from the rounded inputs the backend sees.
        let rounded = |values: &Vec<f64>| tensor_values(on(values));
        let [exact, exact_gate, exact_up] =
            swiglu_f64(&rounded(&gate), &rounded(&up), &rounded(&grad));
        let what = |name: &str| format!("{name}, shape {shape:?}");

        let fused = tensor_values(B::swiglu(on(&gate), on(&up)));
        // Within 1e-34 absolutely: past g ≈ −88, where e^{−g} overflows f32, an f32 σ stops
        // (at Flex's `simd::exp` range, or at a GPU's flush of subnormals to zero) where f64's
        // goes on falling.
        assert_close(&fused, &exact, relative, 1e-34, &what("swiglu vs f64"));
        let plain = tensor_values(naive::swiglu(on(&gate), on(&up)));
        assert_within_scale(&fused, &plain, relative, 0.0, &what("swiglu vs plain"));

        let (gate_grad, up_grad) = B::swiglu_backward(on(&gate), on(&up), on(&grad));
        // ∂gate's slope `σ + g σ (1 − σ)` crosses zero near g ≈ −1.28, where its sum cancels:
        // compared at the size of its terms, |∂h u|.
        let gate_grad = tensor_values(gate_grad);
        let (up_rounded, grad_rounded) = (rounded(&up), rounded(&grad));
        for (at, (actual, expected)) in gate_grad.iter().zip(&exact_gate).enumerate() {
            let terms = (grad_rounded[at] * up_rounded[at]).abs();
            let bound = (relative * expected.abs().max(terms)).max(1e-34);
            assert!(
                (actual - expected).abs() <= bound,
                "{}: element {at} is {actual:e}, expected {expected:e}",
                what("swiglu ∂gate vs f64")
            );
        }
        let up_grad = tensor_values(up_grad);
        assert_close(
            &up_grad,
            &exact_up,
            relative,
            1e-34,
            &what("swiglu ∂up vs f64"),
        );

        // Transposed views: read through their strides, or copied first, never misread.
        let transposed =
            |values: &Vec<f64>| tensor::<B, 2>(values.clone(), [shape[1], shape[0]]).transpose();
        let (gate_t, up_t) = (transposed(&gate), transposed(&up));
        let [exact, ..] = swiglu_f64(
            &tensor_values(gate_t.clone()),
            &tensor_values(up_t.clone()),
            &tensor_values(up_t.clone()),
        );
        let strided = tensor_values(B::swiglu(gate_t, up_t));
        assert_close(
            &strided,
            &exact,
            relative,
            1e-34,
            &what("swiglu, transposed"),
        );
    }
}

/// `B`'s causal softmax and its backward against f64 and against the plain operations (which
/// mask the huge scores above the diagonal that the fused forms must not read); a strided view
/// of the scores too. `relative` bounds the probabilities against the plain operations and the
/// gradient at its scale; against f64 the bound is ten times wider (below).
pub fn causal_softmax_agrees_with_f64_and_the_plain_operations<B: ActivationBackend>(
    relative: f64,
) {
    let mut rng = Rng::new(78);
    for shape in SCORE_SHAPES {
        let count = shape.iter().product::<usize>();
        let (scores, grad) = (causal_scores(&mut rng, shape), rng.normals(count, 1.0));
        let on = |values: &Vec<f64>| tensor::<B, 3>(values.clone(), shape);
        let rounded = |values: &Vec<f64>| tensor_values(on(values));
        let exact = causal_softmax_f64(&rounded(&scores), shape[2]);
        let what = |name: &str| format!("{name}, shape {shape:?}");

        let fused = B::causal_softmax(on(&scores));
        let fused_values = tensor_values(fused.clone());
        // The f32 difference `x − max` alone is off by up to 2⁻²⁴·|x − max| (≈ 4e−6 at a distance
        // of 64), which `e^{x − max}` turns into a relative error of the same size.
        let what_f64 = what("causal_softmax vs f64");
        assert_close(&fused_values, &exact, 10.0 * relative, 1e-37, &what_f64);
        let plain = tensor_values(naive::causal_softmax(on(&scores)));
        let what_plain = what("causal_softmax vs plain");
        assert_close(&fused_values, &plain, relative, 1e-37, &what_plain);

        let fused_grad = tensor_values(B::causal_softmax_backward(fused, on(&grad)));
        let exact_grad = causal_softmax_backward_f64(&fused_values, &rounded(&grad), shape[2]);
        // `∂y − Σ y ∂y` cancels: compared at the scale of `∂y` (about 1) or the result's.
        let what_grad = what("causal_softmax_backward vs f64");
        assert_within_scale(&fused_grad, &exact_grad, relative, 1.0, &what_grad);

        // The scores as a view with the matrices' dimension moved: `[seq, matrices, seq]` values
        // read as `[matrices, seq, seq]`.
        let [matrices, seq, _] = shape;
        let values = rng.normals(count, 4.0);
        let view = tensor::<B, 3>(values, [seq, matrices, seq]).swap_dims(0, 1);
        let exact = causal_softmax_f64(&tensor_values(view.clone()), seq);
        let strided = tensor_values(B::causal_softmax(view));
        let what_view = what("causal_softmax of a strided view vs f64");
        assert_close(&strided, &exact, 10.0 * relative, 1e-37, &what_view);
    }
}

/// RMSNorm's `[rows, d]`: one element; widths below, between and above a cube's 64 threads,
/// the paper's 128 among them.
const NORM_SHAPES: [[usize; 2]; 4] = [[1, 1], [5, 70], [33, 128], [3, 300]];
const EPSILON: f64 = 1e-6;

/// `y = x / rms ⊙ w` and its gradients `(∂x, ∂w)` in f64 on the host, with
/// `rms = sqrt(mean(x²) + ε)` per row, from the formulas of the chain rule written out.
fn rms_norm_f64(x: &[f64], w: &[f64], dy: &[f64]) -> [Vec<f64>; 3] {
    let d = w.len();
    let (mut y, mut dx, mut dw) = (vec![], vec![], vec![0.0; d]);
    for (x, dy) in x.chunks(d).zip(dy.chunks(d)) {
        let rms = (x.iter().map(|v| v * v).sum::<f64>() / d as f64 + EPSILON).sqrt();
        // ∂L/∂x_j = w_j ∂y_j / rms − x_j Σ_k w_k ∂y_k x_k / (d rms³)
        let along: f64 = (0..d).map(|k| w[k] * dy[k] * x[k]).sum();
        for j in 0..d {
            y.push(x[j] / rms * w[j]);
            dx.push(w[j] * dy[j] / rms - x[j] * along / (d as f64 * rms.powi(3)));
            dw[j] += dy[j] * x[j] / rms;
        }
    }
    [y, dx, dw]
}

/// `B`'s RMSNorm and its backward against f64 (to within `relative` at each tensor's scale) and
/// against the plain operations; a transposed input too.
pub fn rms_norm_agrees_with_f64_and_the_plain_operations<B: ActivationBackend>(relative: f64) {
    let mut rng = Rng::new(79);
    for shape in NORM_SHAPES {
        let [rows, d] = shape;
        let x = rng.normals(rows * d, 3.0);
        let w: Vec<f64> = rng.normals(d, 0.3).iter().map(|v| 1.0 + v).collect();
        let dy = rng.normals(rows * d, 1.0);
        let on = |values: &Vec<f64>| tensor::<B, 2>(values.clone(), shape);
        let weight = || tensor::<B, 1>(w.clone(), [d]);
        let rounded =
            |values: Vec<f64>| tensor_values(tensor::<B, 1>(values.clone(), [values.len()]));
        let [exact, exact_dx, exact_dw] = rms_norm_f64(
            &rounded(x.clone()),
            &rounded(w.clone()),
            &rounded(dy.clone()),
        );
        let what = |name: &str| format!("{name}, shape {shape:?}");

        let fused = tensor_values(B::rms_norm(on(&x), weight(), EPSILON));
        assert_within_scale(&fused, &exact, relative, 0.0, &what("rms_norm vs f64"));
        let plain = tensor_values(naive::rms_norm(on(&x), weight(), EPSILON));
        assert_within_scale(&fused, &plain, relative, 0.0, &what("rms_norm vs plain"));

        let (dx, dw) = B::rms_norm_backward(on(&x), weight(), on(&dy), EPSILON);
        let (dx, dw) = (tensor_values(dx), tensor_values(dw));
        // ∂x's two terms cancel (at d = 1 exactly: x̂ is constant): compared at the size of the
        // first, w ∂y / rms ≈ 0.3 here.
        let what_dx = what("rms_norm ∂x vs f64");
        assert_within_scale(&dx, &exact_dx, relative, 0.1, &what_dx);
        // ∂w sums `rows` terms of either sign: compared at the scale of their sizes.
        let terms = (rows as f64).sqrt();
        assert_within_scale(&dw, &exact_dw, relative, terms, &what("rms_norm ∂w vs f64"));

        let view = tensor::<B, 2>(x.clone(), [d, rows]).transpose();
        let [exact, ..] = rms_norm_f64(
            &tensor_values(view.clone()),
            &rounded(w.clone()),
            &rounded(dy.clone()),
        );
        let strided = tensor_values(B::rms_norm(view, weight(), EPSILON));
        assert_within_scale(
            &strided,
            &exact,
            relative,
            0.0,
            &what("rms_norm, transposed"),
        );
    }
}

/// NaN in a gate or a visible score comes out as NaN, as from the plain operations.
pub fn nan_propagates<B: ActivationBackend>() {
    let gate = tensor::<B, 1>(vec![f64::NAN, 1.0], [2]);
    let values = tensor_values(B::swiglu(gate, tensor(vec![1.0, 1.0], [2])));
    assert!(
        values[0].is_nan() && values[1].is_finite(),
        "swiglu: {values:?}"
    );
    let scores = tensor::<B, 3>(vec![0.0, 5.0, f64::NAN, 1.0], [1, 2, 2]);
    let values = tensor_values(B::causal_softmax(scores));
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
pub fn nodes_agree_with_autodiff_of_the_plain_operations<B>(tolerance: f64)
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
    for shape in NORM_SHAPES {
        let [rows, d] = shape;
        let (x, w) = (rng.normals(rows * d, 3.0), rng.normals(d, 1.0));
        let seed = rng.next_u64();
        let inputs = || {
            let x = tensor::<B, 2>(x.clone(), shape).require_grad();
            (x, tensor::<B, 1>(w.clone(), [d]).require_grad())
        };
        let (fused_x, fused_w) = inputs();
        let fused = B::rms_norm(fused_x.clone(), fused_w.clone(), EPSILON);
        let fused = weighted_total(fused, seed).backward();
        let (plain_x, plain_w) = inputs();
        let plain = naive::rms_norm(plain_x.clone(), plain_w.clone(), EPSILON);
        let plain = weighted_total(plain, seed).backward();
        let what = format!("rms_norm, shape {shape:?}");
        let (fused_grad, plain_grad) = (gradient(&fused_x, &fused), gradient(&plain_x, &plain));
        // ∂x cancels as above: at the size of its first term.
        assert_within_scale(&fused_grad, &plain_grad, tolerance, 0.1, &what);
        let (fused_grad, plain_grad) = (gradient(&fused_w, &fused), gradient(&plain_w, &plain));
        assert_within_scale(&fused_grad, &plain_grad, tolerance, 0.0, &what);
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
