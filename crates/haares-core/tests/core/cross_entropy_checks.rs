//! The tied head's weighted cross-entropy, generic over the backend: the fused pair (losses with
//! each row's log-sum-exp, and the backward pass from them), the loss's total over rows, and both
//! differentiable operations against f64 written out here. `core/cross_entropy.rs` runs them on
//! NdArray f64 and Flex (the plain operations), `portability.rs` on NdArray f32, Flex and the cube
//! backends' kernels (wgpu, CUDA).

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use haares_core::HaaresBackend;

use super::common::{Rng, assert_close_at_scale, tensor_values};

/// `[rows, vocab]`: one entry; vocabularies below, between and past a cube's 64 threads, the
/// character tokeniser's 256 among them.
const SHAPES: [[usize; 2]; 4] = [[1, 1], [5, 70], [33, 256], [3, 1000]];

/// One case: logits of spread 8, targets anywhere in the vocabulary, weights 1, 0 (a pad) and
/// 0.5, and the incoming gradient of each row's loss.
struct Case {
    shape: [usize; 2],
    logits: Vec<f64>,
    targets: Vec<usize>,
    weights: Vec<f64>,
    grad: Vec<f64>,
}

impl Case {
    fn new(rng: &mut Rng, shape: [usize; 2]) -> Case {
        let [rows, vocab] = shape;
        Case {
            shape,
            logits: rng.normals(rows * vocab, 8.0),
            targets: (0..rows).map(|_| rng.below(vocab)).collect(),
            weights: (0..rows).map(|row| [1.0, 0.0, 0.5][row % 3]).collect(),
            grad: rng.normals(rows, 1.0),
        }
    }

    fn logits_on<B: Backend>(&self, transposed: bool) -> Tensor<B, 2> {
        let [rows, vocab] = self.shape;
        let device = Default::default();
        match transposed {
            false => Tensor::from_data(TensorData::new(self.logits.clone(), self.shape), &device),
            true => {
                let stored = (0..rows * vocab)
                    .map(|at| self.logits[(at % rows) * vocab + at / rows])
                    .collect::<Vec<_>>();
                let data = TensorData::new(stored, [vocab, rows]);
                Tensor::<B, 2>::from_data(data, &device).transpose()
            }
        }
    }

    fn rows_on<B: Backend>(&self, values: &[f64]) -> Tensor<B, 1> {
        Tensor::from_data(
            TensorData::new(values.to_vec(), [values.len()]),
            &Default::default(),
        )
    }

    fn targets_on<B: Backend>(&self) -> Tensor<B, 1, Int> {
        let ids = self.targets.iter().map(|&t| t as i64).collect::<Vec<_>>();
        Tensor::from_data(
            TensorData::new(ids, [self.targets.len()]),
            &Default::default(),
        )
    }
}

/// Each row's weighted loss `w (lse − x_t)`, its log-sum-exp, and `∂x = g w (softmax − onehot)`
/// for the rows' incoming gradients `grad`, in f64 on the host from `logits` as `B` holds them.
fn cross_entropy_f64(case: &Case, logits: &[f64], grad: &[f64]) -> [Vec<f64>; 3] {
    let vocab = case.shape[1];
    let [mut losses, mut sums, mut grads] = [vec![], vec![], vec![]];
    for (row, x) in logits.chunks(vocab).enumerate() {
        let most = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let lse = most + x.iter().map(|v| (v - most).exp()).sum::<f64>().ln();
        let (target, weight) = (case.targets[row], case.weights[row]);
        losses.push(weight * (lse - x[target]));
        sums.push(lse);
        for (k, v) in x.iter().enumerate() {
            let onehot = if k == target { 1.0 } else { 0.0 };
            grads.push(grad[row] * weight * ((v - lse).exp() - onehot));
        }
    }
    [losses, sums, grads]
}

/// `B`'s forward pass (losses, log-sum-exp) and backward pass against f64, to within `relative`
/// at each tensor's scale, for contiguous and transposed logits.
pub fn cross_entropy_pair_agrees_with_f64<B: HaaresBackend>(relative: f64) {
    let mut rng = Rng::new(85);
    for shape in SHAPES {
        let case = Case::new(&mut rng, shape);
        for transposed in [false, true] {
            let what = |name: &str| format!("{name}, shape {shape:?}, transposed {transposed}");
            let logits = case.logits_on::<B>(transposed);
            let held = tensor_values(logits.clone());
            let [losses, sums, grads] = cross_entropy_f64(&case, &held, &case.grad);
            let (targets, weights) = (case.targets_on::<B>(), case.rows_on::<B>(&case.weights));
            let total = B::summed_cross_entropy(logits.clone(), targets.clone(), weights.clone());
            let exact_total = vec![losses.iter().sum::<f64>()];
            assert_close_at_scale(
                &tensor_values(total),
                &exact_total,
                relative,
                &what("total"),
            );
            let (fused, fused_sums) =
                B::cross_entropy_forward(logits.clone(), targets.clone(), weights.clone());
            let fused = tensor_values(fused);
            assert_close_at_scale(&fused, &losses, relative, &what("losses"));
            let fused_sum_values = tensor_values(fused_sums.clone());
            assert_close_at_scale(&fused_sum_values, &sums, relative, &what("log-sum-exp"));
            let grad = case.rows_on::<B>(&case.grad);
            let fused = B::cross_entropy_backward(logits, targets, weights, fused_sums, grad);
            assert_close_at_scale(&tensor_values(fused), &grads, relative, &what("∂logits"));
        }
    }
}

/// `B::cross_entropy` as a differentiable operation (the fused node where `B` fuses it, the
/// plain operations elsewhere): the losses and `∂(Σ g ⊙ losses)/∂logits` against f64.
pub fn cross_entropy_gradient_agrees_with_f64<B>(relative: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    let mut rng = Rng::new(86);
    for shape in SHAPES {
        let case = Case::new(&mut rng, shape);
        let logits = case.logits_on::<B>(false).require_grad();
        let [losses, _, grads] =
            cross_entropy_f64(&case, &tensor_values(logits.clone()), &case.grad);
        let weights = case.rows_on::<B>(&case.weights);
        let result = B::cross_entropy(logits.clone(), case.targets_on::<B>(), weights);
        let what = |name: &str| format!("{name}, shape {shape:?}");
        assert_close_at_scale(
            &tensor_values(result.clone()),
            &losses,
            relative,
            &what("losses"),
        );
        let gradients = (result * case.rows_on::<B>(&case.grad)).sum().backward();
        let grad = logits.grad(&gradients).expect("the logits are tracked");
        assert_close_at_scale(&tensor_values(grad), &grads, relative, &what("∂logits"));
    }
}

/// `B::summed_cross_entropy` as a differentiable operation (one node over the fused pair and the
/// loss's total where `B` fuses the cross-entropy): the total and `∂(g · total)/∂logits`, which
/// hands every row the same `g`, against f64.
pub fn summed_cross_entropy_gradient_agrees_with_f64<B>(relative: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    let mut rng = Rng::new(87);
    for shape in SHAPES.into_iter().chain([[600, 3]]) {
        let case = Case::new(&mut rng, shape);
        let logits = case.logits_on::<B>(false).require_grad();
        let g = rng.normals(1, 1.0)[0];
        let every_row = vec![g; shape[0]];
        let [losses, _, grads] =
            cross_entropy_f64(&case, &tensor_values(logits.clone()), &every_row);
        let weights = case.rows_on::<B>(&case.weights);
        let total = B::summed_cross_entropy(logits.clone(), case.targets_on::<B>(), weights);
        assert_eq!(
            total.dims(),
            [1],
            "the total of shape {shape:?} is one value"
        );
        let what = |name: &str| format!("{name}, shape {shape:?}");
        let exact_total = vec![losses.iter().sum::<f64>()];
        assert_close_at_scale(
            &tensor_values(total.clone()),
            &exact_total,
            relative,
            &what("total"),
        );
        let gradients = (total * g).sum().backward();
        let grad = logits.grad(&gradients).expect("the logits are tracked");
        assert_close_at_scale(&tensor_values(grad), &grads, relative, &what("∂logits"));
    }
}
