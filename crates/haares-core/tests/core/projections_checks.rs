//! The packed projections' checks (`ops::projections`), generic over the backend: the joins and
//! splits against f64 written out here, on strided inputs; and each packed sublayer (attention over
//! one query–key–value product, SwiGLU over one gate–up product) against the separate projections
//! it replaces, its output and the gradients of the input and of every weight.
//! `core/projections.rs` runs them on Flex and NdArray f64, `portability.rs` on NdArray f32, Flex
//! and the cube backends' kernels.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use haares_core::HaaresBackend;
use haares_core::rotary::RotaryTable;

use super::common::{Rng, assert_close_at_scale, tensor_values};
use super::rotary_checks::rotated_f64;
use super::swiglu_checks::swiglu_f64;

/// `[batch, seq, heads, d_h]`: one pair; odd lengths; the paper's d_h = 32; a head wider than
/// the cube backends' fused attention takes (128), which they run as the plain operations.
const HEAD_SHAPES: [[usize; 4]; 4] = [[1, 1, 1, 2], [2, 5, 3, 4], [2, 9, 4, 32], [1, 3, 1, 136]];
const MAX_SEQ: usize = 16;

fn tensor<B: Backend, const D: usize>(values: &[f64], shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values.to_vec(), shape), &Default::default())
}

/// `[rows, width]` values, and the same as a transposed view (a strided operand).
fn matrix_and_view<B: Backend>(
    rng: &mut Rng,
    rows: usize,
    width: usize,
) -> (Vec<f64>, Tensor<B, 2>) {
    let values = rng.normals(rows * width, 1.0);
    let transposed: Vec<f64> = (0..width * rows)
        .map(|at| values[(at % rows) * width + at / rows])
        .collect();
    (
        values,
        tensor::<B, 2>(&transposed, [width, rows]).transpose(),
    )
}

/// Row `r` of `[rows, Σ widths]` from the parts' rows, side by side.
fn side_by_side(parts: &[Vec<f64>], widths: &[usize], rows: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|row| {
            parts
                .iter()
                .zip(widths)
                .flat_map(move |(part, &width)| part[row * width..(row + 1) * width].to_vec())
        })
        .collect()
}

/// `B`'s `concat_columns` and `split_columns` (one to four parts), `rotary_packed`, `rotary_join`
/// and `swiglu_packed` (both directions) against f64 written out, to within `relative` of the
/// largest value.
pub fn packed_primitives_agree_with_f64<B: HaaresBackend>(relative: f64) {
    let mut rng = Rng::new(90);
    for widths in [
        vec![3, 5],
        vec![4, 1, 6],
        vec![32, 32, 32],
        vec![5],
        vec![2, 3, 4, 1],
    ] {
        let rows = 7;
        let (parts, views): (Vec<_>, Vec<_>) = widths
            .iter()
            .map(|&width| matrix_and_view::<B>(&mut rng, rows, width))
            .unzip();
        let joined = B::concat_columns(views);
        let exact = side_by_side(&parts, &widths, rows);
        let what = format!("concat_columns of {widths:?}");
        assert_close_at_scale(&tensor_values(joined), &exact, relative, &what);

        let total = widths.iter().sum();
        let (whole, view) = matrix_and_view::<B>(&mut rng, rows, total);
        for (at, part) in B::split_columns(view, &widths).into_iter().enumerate() {
            let start: usize = widths[..at].iter().sum();
            let exact: Vec<f64> = (0..rows)
                .flat_map(|row| {
                    whole[row * total + start..row * total + start + widths[at]].to_vec()
                })
                .collect();
            let what = format!("split_columns of {widths:?}, part {at}");
            assert_close_at_scale(&tensor_values(part), &exact, relative, &what);
        }
    }

    for shape in HEAD_SHAPES {
        let [batch, seq, heads, head_dim] = shape;
        let table = RotaryTable::<B>::new(head_dim, heads, MAX_SEQ, 10_000.0, &Default::default());
        let (cos, sin, turn) = table.tables();
        let count = batch * seq * heads * head_dim;
        let grads: Vec<Vec<f64>> = (0..3).map(|_| rng.normals(count, 1.0)).collect();
        let scale = 1.0 / (head_dim as f64).sqrt();
        let gradients = [0, 1, 2].map(|at| tensor::<B, 4>(&grads[at], shape));
        let joined = tensor_values(B::rotary_join(gradients, cos, sin, turn, scale));
        let turned = [
            rotated_f64(&grads[0], shape, scale, true),
            rotated_f64(&grads[1], shape, 1.0, true),
            grads[2].clone(),
        ];
        // Each token's heads: the queries', then the keys', then the values'.
        let width = heads * head_dim;
        let exact = side_by_side(&turned, &[width; 3], batch * seq);
        let what = format!("rotary_join, shape {shape:?}");
        assert_close_at_scale(&joined, &exact, relative, &what);

        // Forward, from a packed projection: its parts are every token's thirds.
        let packed = side_by_side(&grads, &[width; 3], batch * seq);
        let part = |at: usize| -> Vec<f64> {
            packed
                .chunks(3 * width)
                .flat_map(|token| token[at * width..(at + 1) * width].to_vec())
                .collect()
        };
        let qkv = tensor::<B, 4>(&packed, [batch, seq, 3 * heads, head_dim]);
        let (cos, sin, turn) = table.tables();
        let turned = tensor_values(B::rotary_packed(qkv, cos, sin, turn, scale));
        let parts = [
            rotated_f64(&part(0), shape, scale, false),
            rotated_f64(&part(1), shape, 1.0, false),
            part(2),
        ];
        let exact = side_by_side(&parts, &[width; 3], batch * seq);
        let what = format!("rotary_packed, shape {shape:?}");
        assert_close_at_scale(&turned, &exact, relative, &what);
    }

    let [rows, width] = [9, 13];
    let (gate_up, view) = matrix_and_view::<B>(&mut rng, rows, 2 * width);
    let gate_up: Vec<f64> = gate_up.iter().map(|g| 4.0 * g).collect();
    let view = view.mul_scalar(4.0);
    let half = |start: usize| -> Vec<f64> {
        (0..rows)
            .flat_map(|row| {
                gate_up[row * 2 * width + start..row * 2 * width + start + width].to_vec()
            })
            .collect()
    };
    let grad = rng.normals(rows * width, 1.0);
    let [output, gate_grad, up_grad] = swiglu_f64(&half(0), &half(width), &grad);
    let packed = tensor_values(B::swiglu_packed(view.clone()));
    assert_close_at_scale(&packed, &output, relative, "swiglu_packed");
    let back = B::swiglu_packed_backward(view, tensor::<B, 2>(&grad, [rows, width]));
    let exact = side_by_side(&[gate_grad, up_grad], &[width, width], rows);
    assert_close_at_scale(
        &tensor_values(back),
        &exact,
        relative,
        "swiglu_packed_backward",
    );
}

/// The input's and the weights' gradients, flattened, after the output.
type Gradients = Vec<Vec<f64>>;

/// The output and gradients of `Σ output ⊙ r` for a random weighting `r`, with the input tracked
/// or not.
fn run<B: AutodiffBackend, const D: usize>(
    x: &Tensor<B, 2>,
    weights: &[Tensor<B, 2>],
    track_x: bool,
    forward: impl Fn(Tensor<B, 2>, Vec<Tensor<B, 2>>) -> Tensor<B, D>,
    weighting: &[f64],
) -> Gradients {
    let x = match track_x {
        true => x.clone().require_grad(),
        false => x.clone(),
    };
    let weights: Vec<_> = weights.iter().map(|w| w.clone().require_grad()).collect();
    let output = forward(x.clone(), weights.clone());
    let shape = output.dims();
    let mut values = vec![tensor_values(output.clone())];
    let grads = (output * tensor::<B, D>(weighting, shape)).sum().backward();
    if track_x {
        values.push(tensor_values(x.grad(&grads).expect("x is tracked")));
    }
    for weight in &weights {
        values.push(tensor_values(
            weight.grad(&grads).expect("weights are tracked"),
        ));
    }
    values
}

fn assert_all_close(packed: &Gradients, separate: &Gradients, tolerance: f64, what: &str) {
    let names = ["output", "first gradient", "second", "third", "fourth"];
    for (at, (a, b)) in packed.iter().zip(separate).enumerate() {
        assert_close_at_scale(a, b, tolerance, &format!("{what}: {}", names[at]));
    }
}

/// Each packed sublayer against the separate projections it replaces (in `B`'s own operations):
/// attention with RoPE over `[W_q W_k W_v]`, SwiGLU over `[W_gate W_up]`; output and every
/// gradient, the input tracked and not.
pub fn packed_sublayers_agree_with_the_separate_projections<B>(tolerance: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    let mut rng = Rng::new(91);
    for shape in HEAD_SHAPES {
        let [batch, seq, heads, head_dim] = shape;
        let d = heads * head_dim;
        let table = RotaryTable::<B>::new(head_dim, heads, MAX_SEQ, 10_000.0, &Default::default());
        let x = tensor::<B, 2>(&rng.normals(batch * seq * d, 1.0), [batch * seq, d]);
        let weights: Vec<_> = (0..3)
            .map(|_| tensor::<B, 2>(&rng.normals(d * d, 0.5), [d, d]))
            .collect();
        let weighting = rng.normals(batch * seq * d, 1.0);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let packed = |x, weights| {
            let qkv = B::projections(x, weights).reshape([batch, seq, 3 * heads, head_dim]);
            let (cos, sin, turn) = table.tables();
            B::causal_attention_packed(qkv, cos, sin, turn, scale)
        };
        let separate = |x: Tensor<B, 2>, weights: Vec<Tensor<B, 2>>| {
            let heads_of = |w| B::matmul(x.clone(), w).reshape(shape);
            let [q, k, v] = <[Tensor<B, 2>; 3]>::try_from(weights)
                .expect("three weights")
                .map(heads_of);
            B::causal_attention(table.apply(q, scale), table.apply(k, 1.0), v)
        };
        for track_x in [true, false] {
            let what = format!("packed attention, {shape:?}, x tracked: {track_x}");
            let a = run(&x, &weights, track_x, packed, &weighting);
            let b = run(&x, &weights, track_x, separate, &weighting);
            assert_all_close(&a, &b, tolerance, &what);
        }
    }

    for [rows, d, d_ff] in [[1, 2, 3], [9, 8, 21], [40, 32, 96]] {
        let x = tensor::<B, 2>(&rng.normals(rows * d, 1.0), [rows, d]);
        let weights: Vec<_> = (0..2)
            .map(|_| tensor::<B, 2>(&rng.normals(d * d_ff, 1.0), [d, d_ff]))
            .collect();
        let weighting = rng.normals(rows * d_ff, 1.0);
        let packed = |x, weights| B::swiglu_packed(B::projections(x, weights));
        let separate = |x: Tensor<B, 2>, weights: Vec<Tensor<B, 2>>| {
            let [gate, up] = <[Tensor<B, 2>; 2]>::try_from(weights).expect("two weights");
            B::swiglu(B::matmul(x.clone(), gate), B::matmul(x, up))
        };
        for track_x in [true, false] {
            let what = format!("packed SwiGLU, [{rows}, {d}] → {d_ff}, x tracked: {track_x}");
            let a = run(&x, &weights, track_x, packed, &weighting);
            let b = run(&x, &weights, track_x, separate, &weighting);
            assert_all_close(&a, &b, tolerance, &what);
        }
    }
}
