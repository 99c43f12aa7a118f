//! SwiGLU's checks (`ops::swiglu`), generic over the backend: the backend's operation and its
//! backward pass against f64 computed here and against the reference (the plain tensor
//! operations), NaN in and out, and the autodiff node's gradients against Burn's autodiff of the
//! reference. `core/swiglu.rs` runs them on NdArray f64 and Flex, `portability.rs` on NdArray f32
//! and the cube backends' kernels (wgpu, CUDA).

use burn::tensor::backend::AutodiffBackend;
use haares_core::HaaresBackend;
use haares_core::ops::swiglu::naive;

use super::common::{
    Rng, assert_close, assert_within_scale, gradient, tensor, tensor_values, weighted_total,
};

/// Elementwise shapes: below and past a SIMD vector, with and without a remainder.
/// The last is two of Flex's parallel tasks (16384 elements each), the second one partial.
const SHAPES: [[usize; 2]; 4] = [[1, 1], [7, 5], [33, 131], [67, 256]];

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

/// `B`'s SwiGLU and its backward against f64 (to within `relative`, a few roundings of the
/// backend's float type) and against the plain operations; transposed operands too.
pub fn swiglu_agrees_with_f64_and_the_plain_operations<B: HaaresBackend>(relative: f64) {
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

/// NaN in a gate comes out as NaN, as from the plain operations.
pub fn swiglu_propagates_nan<B: HaaresBackend>() {
    let gate = tensor::<B, 1>(vec![f64::NAN, 1.0], [2]);
    let values = tensor_values(B::swiglu(gate, tensor(vec![1.0, 1.0], [2])));
    assert!(
        values[0].is_nan() && values[1].is_finite(),
        "swiglu: {values:?}"
    );
}

/// The node's gradients against Burn's autodiff through the reference (which checks the
/// backward formulas as well as the node), with one input tracked or both.
pub fn swiglu_node_agrees_with_autodiff_of_the_reference<B>(tolerance: f64)
where
    B: AutodiffBackend + HaaresBackend,
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
}
