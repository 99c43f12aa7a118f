//! The causal softmax's checks (`ops::softmax`), generic over the backend: the backend's
//! operation and its backward pass against f64 computed here and against the reference, NaN in
//! and out, and the autodiff node's gradient against Burn's autodiff of the reference.
//! `core/softmax.rs` runs them on NdArray f64 and Flex, `portability.rs` on NdArray f32 and the
//! cube backends' kernels.

use burn::tensor::backend::AutodiffBackend;
use haares_core::HaaresBackend;
use haares_core::ops::softmax::naive;

use super::common::{
    Rng, assert_close, assert_within_scale, gradient, tensor, tensor_values, weighted_total,
};

/// Score shapes `[matrices, seq, seq]`.
/// Flex's softmax tasks hold whole matrices: 56 of 17 × 17, so 60 are two tasks, the second
/// partial; 128 × 128 is one matrix a task.
const SCORE_SHAPES: [[usize; 3]; 4] = [[1, 1, 1], [3, 2, 2], [60, 17, 17], [4, 128, 128]];

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

/// `B`'s causal softmax and its backward against f64 and against the plain operations (which
/// mask the huge scores above the diagonal that the fused forms must not read); a strided view
/// of the scores too. `relative` bounds the probabilities against the plain operations and the
/// gradient at its scale; against f64 the bound is ten times wider (below).
pub fn causal_softmax_agrees_with_f64_and_the_plain_operations<B: HaaresBackend>(relative: f64) {
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

/// NaN in a visible score spoils its row, as from the plain operations.
pub fn causal_softmax_propagates_nan<B: HaaresBackend>() {
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

/// The node's gradient against Burn's autodiff through the reference.
pub fn causal_softmax_node_agrees_with_autodiff_of_the_reference<B>(tolerance: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    let mut rng = Rng::new(93);
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
