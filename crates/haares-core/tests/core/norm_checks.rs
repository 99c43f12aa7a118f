//! RMSNorm's checks (`ops::norm`), generic over the backend: the backend's operation and its
//! backward pass against f64 computed here and against the reference, and the autodiff node's
//! gradients against Burn's autodiff of the reference. `core/norm.rs` runs them on NdArray f64
//! and Flex, `portability.rs` on NdArray f32 and the cube backends' kernels.

use burn::tensor::backend::AutodiffBackend;
use haares_core::HaaresBackend;
use haares_core::ops::norm::naive;

use super::common::{Rng, assert_within_scale, gradient, tensor, tensor_values, weighted_total};

/// RMSNorm's `[rows, d]`: one element; widths below, between and above a cube's 64 threads,
/// the paper's 128 among them; rows over several of Flex's tasks (170 rows of 96 a task, the
/// last one partial) and over several of the cube backward pass's blocks of 16 (33 rows: the
/// last block partial; 400: 25 whole blocks), whose shares of `∂w` are added up; a row wider than
/// the cube backward pass keeps in shared memory (3,072), whose rows write their shares one by
/// one.
const NORM_SHAPES: [[usize; 2]; 6] = [[1, 1], [5, 70], [33, 128], [3, 300], [400, 96], [3, 3100]];

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
pub fn rms_norm_agrees_with_f64_and_the_plain_operations<B: HaaresBackend>(relative: f64) {
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
        let grad_view = tensor::<B, 2>(dy.clone(), [d, rows]).transpose();
        let [exact, exact_dx, exact_dw] = rms_norm_f64(
            &tensor_values(view.clone()),
            &rounded(w.clone()),
            &tensor_values(grad_view.clone()),
        );
        let strided = tensor_values(B::rms_norm(view.clone(), weight(), EPSILON));
        assert_within_scale(
            &strided,
            &exact,
            relative,
            0.0,
            &what("rms_norm, transposed"),
        );
        // The backward pass reads both through their strides too.
        let (dx, dw) = B::rms_norm_backward(view, weight(), grad_view, EPSILON);
        let what_dx = what("rms_norm ∂x, transposed");
        assert_within_scale(&tensor_values(dx), &exact_dx, relative, 0.1, &what_dx);
        let what_dw = what("rms_norm ∂w, transposed");
        assert_within_scale(&tensor_values(dw), &exact_dw, relative, terms, &what_dw);
    }
}

/// The node's gradients, the input's and the gain's, against Burn's autodiff through the
/// reference.
pub fn rms_norm_node_agrees_with_autodiff_of_the_reference<B>(tolerance: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    let mut rng = Rng::new(92);
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
}
