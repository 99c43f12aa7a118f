//! Causal attention's fused pair, generic over the backend: the forward pass (output and
//! log-sum-exp) and the backward pass from them against f64 written out here, and the
//! differentiable operation's gradients against the same. `core/attention.rs` runs them on NdArray
//! f64 and Flex (the plain operations, `naive`), `portability.rs` on NdArray f32, Flex and the cube
//! backends' kernels (wgpu, CUDA).

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use haares_core::HaaresBackend;

use super::common::{Rng, assert_close_at_scale, tensor_values};

/// `[batch, seq, heads, d_h]`: one position; sequences within one of the kernels' tiles (16,
/// 32 or 64 positions, by head width), exactly one, and across several, ending inside a tile;
/// head widths 8 to 128 (the paper's families' 16–128 and the tiny test models' 8), and widths
/// whose columns the threads of a row share unevenly (36: 5 threads; 100: 13), as they share
/// the other side's tile at 48 (32 keys over 6 threads).
const SHAPES: [[usize; 4]; 11] = [
    [1, 1, 1, 16],
    [2, 5, 3, 8],
    [1, 32, 2, 32],
    [2, 33, 2, 64],
    [1, 70, 1, 128],
    [3, 40, 4, 16],
    [1, 75, 2, 48],
    [1, 100, 1, 64],
    [1, 64, 1, 36],
    [1, 40, 1, 100],
    [2, 130, 2, 16],
];

/// The inputs of one case, as `[batch, seq, heads, d_h]` values.
struct Case {
    shape: [usize; 4],
    query: Vec<f64>,
    key: Vec<f64>,
    value: Vec<f64>,
    grad: Vec<f64>,
}

impl Case {
    /// Scores of spread about 3 (queries of spread `3/√d_h`), so that the softmax is neither
    /// flat nor one-hot.
    fn new(rng: &mut Rng, shape: [usize; 4]) -> Case {
        let count = shape.iter().product();
        let spread = 3.0 / (shape[3] as f64).sqrt();
        Case {
            shape,
            query: rng.normals(count, spread),
            key: rng.normals(count, 1.0),
            value: rng.normals(count, 1.0),
            grad: rng.normals(count, 1.0),
        }
    }

    fn on<B: Backend>(&self, values: &[f64]) -> Tensor<B, 4> {
        Tensor::from_data(
            TensorData::new(values.to_vec(), self.shape),
            &Default::default(),
        )
    }

    /// The case's inputs as `B` holds them (rounded to its float type), for the f64 answer.
    fn rounded<B: Backend>(&self) -> Case {
        let round = |values: &Vec<f64>| tensor_values(self.on::<B>(values));
        Case {
            shape: self.shape,
            query: round(&self.query),
            key: round(&self.key),
            value: round(&self.value),
            grad: round(&self.grad),
        }
    }
}

/// The output, the log-sum-exp and `[∂Q, ∂K, ∂V]` of causal attention in f64 on the host, from
/// the definitions: `s_ij = q_i · k_j` for `j ≤ i`, `p = softmax(s)`, `o_i = Σ_j p_ij v_j`;
/// `∂v_j = Σ_i p_ij ∂o_i`, `∂s_ij = p_ij (∂o_i · v_j − Σ_k p_ik ∂o_i · v_k)`,
/// `∂q_i = Σ_j ∂s_ij k_j`, `∂k_j = Σ_i ∂s_ij q_i`.
fn attention_f64(case: &Case) -> (Vec<f64>, Vec<f64>, [Vec<f64>; 3]) {
    let [batch, seq, heads, d] = case.shape;
    let row = |b: usize, t: usize, h: usize| ((b * seq + t) * heads + h) * d;
    let dot = |x: &[f64], at: usize, y: &[f64], by: usize| -> f64 {
        (0..d).map(|e| x[at + e] * y[by + e]).sum()
    };
    let count = case.query.len();
    let mut output = vec![0.0; count];
    let mut logsumexp = vec![0.0; count / d];
    let mut grads = [vec![0.0; count], vec![0.0; count], vec![0.0; count]];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seq {
                let qi = row(b, i, h);
                let scores: Vec<f64> = (0..=i)
                    .map(|j| dot(&case.query, qi, &case.key, row(b, j, h)))
                    .collect();
                let most = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let total: f64 = scores.iter().map(|s| (s - most).exp()).sum();
                let p: Vec<f64> = scores.iter().map(|s| (s - most).exp() / total).collect();
                logsumexp[qi / d] = most + total.ln();
                let d_p: Vec<f64> = (0..=i)
                    .map(|j| dot(&case.grad, qi, &case.value, row(b, j, h)))
                    .collect();
                let along: f64 = p.iter().zip(&d_p).map(|(p, dp)| p * dp).sum();
                for j in 0..=i {
                    let kj = row(b, j, h);
                    let d_score = p[j] * (d_p[j] - along);
                    for e in 0..d {
                        output[qi + e] += p[j] * case.value[kj + e];
                        grads[0][qi + e] += d_score * case.key[kj + e];
                        grads[1][kj + e] += d_score * case.query[qi + e];
                        grads[2][kj + e] += p[j] * case.grad[qi + e];
                    }
                }
            }
        }
    }
    (output, logsumexp, grads)
}

const GRADIENTS: [&str; 3] = ["∂Q", "∂K", "∂V"];

/// `B`'s forward pass (output and log-sum-exp) and backward pass against f64, to within
/// `relative` at each tensor's scale; once more with every input a strided view (the heads'
/// dimension stored first).
pub fn attention_pair_agrees_with_f64<B: HaaresBackend>(relative: f64) {
    let mut rng = Rng::new(83);
    for shape in SHAPES {
        let case = Case::new(&mut rng, shape);
        let (output, logsumexp, grads) = attention_f64(&case.rounded::<B>());
        for strided in [false, true] {
            let input = |values: &Vec<f64>| match strided {
                false => case.on::<B>(values),
                true => heads_first_view::<B>(values, shape),
            };
            let what = |name: &str| format!("{name}, shape {shape:?}, strided {strided}");
            let (query, key, value) = (input(&case.query), input(&case.key), input(&case.value));
            let (fused, sums) =
                B::causal_attention_forward(query.clone(), key.clone(), value.clone());
            let fused_values = tensor_values(fused.clone());
            assert_close_at_scale(&fused_values, &output, relative, &what("output"));
            let sums_values = tensor_values(sums.clone());
            assert_close_at_scale(&sums_values, &logsumexp, relative, &what("log-sum-exp"));
            let grad = input(&case.grad);
            let fused_grads = B::causal_attention_backward(query, key, value, fused, sums, grad);
            for ((fused, exact), name) in fused_grads.into_iter().zip(&grads).zip(GRADIENTS) {
                let fused = tensor_values(fused);
                assert_close_at_scale(&fused, exact, relative, &what(name));
            }
        }
    }
}

/// `[batch, seq, heads, d_h]` values stored as `[batch, heads, seq, d_h]` and read through a
/// view with the middle dimensions swapped.
fn heads_first_view<B: Backend>(values: &[f64], shape: [usize; 4]) -> Tensor<B, 4> {
    let [batch, seq, heads, d] = shape;
    let mut stored = vec![0.0; values.len()];
    for b in 0..batch {
        for t in 0..seq {
            for h in 0..heads {
                let from = ((b * seq + t) * heads + h) * d;
                let to = ((b * heads + h) * seq + t) * d;
                stored[to..to + d].copy_from_slice(&values[from..from + d]);
            }
        }
    }
    let data = TensorData::new(stored, [batch, heads, seq, d]);
    Tensor::<B, 4>::from_data(data, &Default::default()).swap_dims(1, 2)
}

/// `B::causal_attention` as a differentiable operation (the fused node where `B` fuses it, the
/// plain operations' nodes elsewhere): the output and the gradients of `Σ ∂O ⊙ O` against f64,
/// with the value tracked or not.
pub fn attention_gradients_agree_with_f64<B>(relative: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    let mut rng = Rng::new(84);
    for shape in SHAPES {
        let case = Case::new(&mut rng, shape);
        let (output, _, grads) = attention_f64(&case.rounded::<B>());
        for value_tracked in [true, false] {
            let what = |name: &str| format!("{name}, shape {shape:?}, ∂V wanted {value_tracked}");
            let query = case.on::<B>(&case.query).require_grad();
            let key = case.on::<B>(&case.key).require_grad();
            let value = match value_tracked {
                true => case.on::<B>(&case.value).require_grad(),
                false => case.on::<B>(&case.value),
            };
            let result = B::causal_attention(query.clone(), key.clone(), value.clone());
            let result_values = tensor_values(result.clone());
            assert_close_at_scale(&result_values, &output, relative, &what("output"));
            let gradients = (result * case.on::<B>(&case.grad)).sum().backward();
            let tracked = [Some(&query), Some(&key), value_tracked.then_some(&value)];
            for ((input, exact), name) in tracked.into_iter().zip(&grads).zip(GRADIENTS) {
                match input {
                    Some(input) => {
                        let grad = input
                            .grad(&gradients)
                            .expect("a tracked input has a gradient");
                        assert_close_at_scale(&tensor_values(grad), exact, relative, &what(name));
                    }
                    None => assert!(value.grad(&gradients).is_none(), "{}", what(name)),
                }
            }
        }
    }
}
