//! RoPE's checks (`ops::rotary`), generic over the backend: the operation and its backward pass
//! against the rotation written out in f64 on the host from App. A's definition (pair `(2i, 2i+1)`
//! of each head turned by `pos · 10000^(−2i/d_h)`), against the plain operations, on a strided
//! input, and the node's gradient against Burn's autodiff of the plain operations. `core/rotary.rs`
//! runs them on Flex and NdArray f64, `portability.rs` on NdArray f32, Flex and the cube backends'
//! kernels.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use haares_core::HaaresBackend;
use haares_core::ops::rotary::naive;
use haares_core::rotary::RotaryTable;

use super::common::{Rng, max_abs_diff, tensor_values};

/// `[batch, seq, heads, d_h]`: one pair; odd sequence lengths; the paper's d_h = 32 among them;
/// positions over two of Flex's tasks (32 rows of 512 a task), the second starting mid-sequence.
const SHAPES: [[usize; 4]; 4] = [[1, 1, 1, 2], [2, 5, 3, 4], [2, 9, 4, 32], [3, 12, 8, 64]];
const MAX_SEQ: usize = 16;
const BASE: f64 = 10_000.0;

fn tensor<B: Backend, const D: usize>(values: Vec<f64>, shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

/// `s · R(±θ) x` pair by pair in f64, for `[batch, seq, heads, d_h]` values in row-major order.
pub fn rotated_f64(x: &[f64], shape: [usize; 4], scale: f64, back: bool) -> Vec<f64> {
    let [_, seq, heads, head_dim] = shape;
    let mut y = vec![0.0; x.len()];
    for (at, pair) in x.chunks(2).enumerate() {
        let element = 2 * at;
        let i = (element % head_dim) / 2;
        let pos = element / (heads * head_dim) % seq;
        let angle = pos as f64 * BASE.powf(-2.0 * i as f64 / head_dim as f64);
        let (c, s) = (angle.cos(), if back { -angle.sin() } else { angle.sin() });
        y[element] = scale * (pair[0] * c - pair[1] * s);
        y[element + 1] = scale * (pair[1] * c + pair[0] * s);
    }
    y
}

fn assert_within(actual: &[f64], expected: &[f64], tolerance: f64, what: &str) {
    let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(actual, expected);
    assert!(
        diff <= tolerance * scale,
        "{what}: max difference {diff:e} at scale {scale:e}"
    );
}

/// `B`'s RoPE and its backward pass against f64 (to within `relative` of the largest value) and
/// the plain operations (within `plain_relative`: their quarter turn is a matrix product, TF32 on
/// CUDA), at scales 1 and `1/√d_h`; and on a strided view.
pub fn rotary_agrees_with_f64_and_the_plain_operations<B: HaaresBackend>(
    relative: f64,
    plain_relative: f64,
) {
    let mut rng = Rng::new(80);
    for shape in SHAPES {
        let [batch, seq, heads, head_dim] = shape;
        let table = RotaryTable::<B>::new(head_dim, heads, MAX_SEQ, BASE, &Default::default());
        let tables = || {
            (
                table.cos.clone(),
                table.sin.clone(),
                table.quarter_turn.clone(),
            )
        };
        let count = batch * seq * heads * head_dim;
        let x = tensor::<B, 4>(rng.normals(count, 2.0), shape);
        let values = tensor_values(x.clone());
        for scale in [1.0, 1.0 / (head_dim as f64).sqrt()] {
            let what = |name: &str| format!("{name}, shape {shape:?}, scale {scale}");
            let (cos, sin, turn) = tables();
            let fused = tensor_values(B::rotary(x.clone(), cos, sin, turn, scale));
            let exact = rotated_f64(&values, shape, scale, false);
            assert_within(&fused, &exact, relative, &what("rotary vs f64"));
            let (cos, sin, turn) = tables();
            let plain = tensor_values(naive::rotary(x.clone(), cos, sin, turn, scale));
            assert_within(&fused, &plain, plain_relative, &what("rotary vs plain"));

            let (cos, sin, turn) = tables();
            let back = tensor_values(B::rotary_backward(x.clone(), cos, sin, turn, scale));
            let exact = rotated_f64(&values, shape, scale, true);
            assert_within(&back, &exact, relative, &what("rotary_backward vs f64"));
        }
        // The same values as a view with the positions and heads swapped back into place.
        let view = tensor::<B, 4>(values.clone(), [batch, heads, seq, head_dim]).swap_dims(1, 2);
        let (cos, sin, turn) = tables();
        let strided = tensor_values(B::rotary(view.clone(), cos, sin, turn, 1.0));
        let exact = rotated_f64(&tensor_values(view), shape, 1.0, false);
        assert_within(
            &strided,
            &exact,
            relative,
            &format!("rotary of a view, {shape:?}"),
        );
    }
}

/// The node's gradient against Burn's autodiff of the plain operations.
pub fn rotary_node_agrees_with_autodiff_of_the_plain_operations<B>(tolerance: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    let mut rng = Rng::new(81);
    for shape in SHAPES {
        let [batch, seq, heads, head_dim] = shape;
        let table = RotaryTable::<B>::new(head_dim, heads, MAX_SEQ, BASE, &Default::default());
        let count = batch * seq * heads * head_dim;
        let (x, weights) = (rng.normals(count, 2.0), rng.normals(count, 1.0));
        let scale = 1.0 / (head_dim as f64).sqrt();
        let gradient = |fused: bool| {
            let input = tensor::<B, 4>(x.clone(), shape).require_grad();
            let (cos, sin, turn) = (
                table.cos.clone(),
                table.sin.clone(),
                table.quarter_turn.clone(),
            );
            let output = match fused {
                true => B::rotary(input.clone(), cos, sin, turn, scale),
                false => naive::rotary(input.clone(), cos, sin, turn, scale),
            };
            let grads = (output * tensor::<B, 4>(weights.clone(), shape))
                .sum()
                .backward();
            tensor_values(input.grad(&grads).expect("x is tracked"))
        };
        let what = format!("rotary ∂x, shape {shape:?}");
        assert_within(&gradient(true), &gradient(false), tolerance, &what);
    }
}
