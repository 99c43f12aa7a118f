//! The matrix product (`ops::matmul`): Flex's direct `gemm` path against f64
//! computed here and against Burn's `matmul`, on every layout and threading path it takes; its
//! autodiff node and `matmul_transposed_rhs`'s against Burn's autodiff of `matmul`; `project`
//! against Burn's `Linear`.

use burn::backend::{Autodiff, Flex};
use burn::nn::LinearConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use haares_core::ops::MatmulBackend;
use haares_core::ops::matmul::naive;
use haares_core::swiglu::project;

use crate::common::{Ad64, Rng, max_abs_diff, tensor, tensor_values};
use crate::matmul_checks::nodes_agree_with_autodiff_of_matmul;

/// A random `[..., rows, columns]` operand, stored as given or stored transposed (its last two
/// dimensions swapped) and handed over as a transposed view, as attention's `Kᵀ` and the
/// backward pass's `Aᵀ` and `Bᵀ` are.
fn operand<B: Backend, const D: usize>(
    rng: &mut Rng,
    dims: [usize; D],
    stored_transposed: bool,
) -> Tensor<B, D> {
    let values = rng.normals(dims.iter().product(), 1.0);
    match stored_transposed {
        false => tensor(values, dims),
        true => {
            let mut stored = dims;
            stored.swap(D - 1, D - 2);
            tensor::<B, D>(values, stored).swap_dims(D - 2, D - 1)
        }
    }
}

/// `a · b` over the last two dimensions in f64, with `Σ_k |a_ik| |b_kj|` beside each element:
/// the scale an f32 sum of `k` products is accurate to.
fn product_f64(a: &[f64], b: &[f64], matrices: usize, [m, k, n]: [usize; 3]) -> [Vec<f64>; 2] {
    let (mut product, mut scale) = (vec![0.0; matrices * m * n], vec![0.0; matrices * m * n]);
    for matrix in 0..matrices {
        let (a, b) = (&a[matrix * m * k..], &b[matrix * k * n..]);
        for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
            let at = matrix * m * n + i * n + j;
            for l in 0..k {
                product[at] += a[i * k + l] * b[l * n + j];
                scale[at] += (a[i * k + l] * b[l * n + j]).abs();
            }
        }
    }
    [product, scale]
}

/// Flex's product of `[batch, m, k] · [batch, k, n]` operands, in every storage order, against
/// f64 (to within the rounding of an f32 sum of `k` products) and against Burn's `matmul`.
fn check_flex_product<const D: usize>(rng: &mut Rng, batch: [usize; D], [m, k, n]: [usize; 3]) {
    let dims = |rows, columns| -> [usize; 4] {
        let mut dims = [1, 1, rows, columns];
        dims[..D].copy_from_slice(&batch);
        dims
    };
    let matrices = batch.iter().product();
    for (lhs_transposed, rhs_transposed) in [(false, false), (true, false), (false, true)] {
        let lhs = operand::<Flex, 4>(rng, dims(m, k), lhs_transposed);
        let rhs = operand::<Flex, 4>(rng, dims(k, n), rhs_transposed);
        let what = format!(
            "batch {batch:?}, [{m}, {k}] · [{k}, {n}], transposed lhs {lhs_transposed}, rhs \
             {rhs_transposed}"
        );
        let ours = tensor_values(Flex::matmul(lhs.clone(), rhs.clone()));
        let (a, b) = (tensor_values(lhs.clone()), tensor_values(rhs.clone()));
        let [exact, scale] = product_f64(&a, &b, matrices, [m, k, n]);
        for (at, ((ours, exact), scale)) in ours.iter().zip(&exact).zip(&scale).enumerate() {
            let bound = (k + 2) as f64 * f64::from(f32::EPSILON) * scale + 1e-30;
            assert!(
                (ours - exact).abs() <= bound,
                "{what}: element {at} is {ours:e}, expected {exact:e} (bound {bound:e})"
            );
        }
        let burns = tensor_values(naive::matmul(lhs, rhs));
        let largest = scale.iter().fold(0.0f64, |m, s| m.max(*s));
        let diff = max_abs_diff(&ours, &burns);
        assert!(
            diff <= 4.0 * f64::from(f32::EPSILON) * largest,
            "{what}: {diff:e} from Burn's matmul"
        );
    }
}

/// Every threading path: one small matrix; matrices large enough to split over threads (≥ 192³
/// multiply-adds), into bands of rows (taller than wide), of columns (wider than tall), with a
/// last band narrower than the others, and a batch of them; a batch too small to split, and a
/// batch split a matrix per task (≥ 128³ in all); sizes off the SIMD width; a depth taken in
/// chunks (a transposed left operand, taller than wide, `k` over 256), with a partial last chunk,
/// split into bands and a matrix per task.
#[test]
fn flex_matmul_agrees_with_f64_and_with_burns_matmul() {
    let mut rng = Rng::new(301);
    check_flex_product(&mut rng, [], [5, 7, 3]);
    check_flex_product(&mut rng, [], [1, 1, 1]);
    check_flex_product(&mut rng, [], [197, 203, 190]);
    check_flex_product(&mut rng, [], [70, 301, 413]);
    check_flex_product(&mut rng, [], [413, 301, 70]);
    check_flex_product(&mut rng, [2], [130, 260, 257]);
    check_flex_product(&mut rng, [2, 3], [17, 16, 19]);
    check_flex_product(&mut rng, [4, 8], [64, 33, 65]);
    check_flex_product(&mut rng, [2], [300, 520, 40]);
}

/// An operand that starts inside its buffer (a narrowed view) and a product with nothing to sum
/// over, which is zero.
#[test]
fn flex_matmul_reads_offset_views_and_sums_nothing_to_zero() {
    let mut rng = Rng::new(302);
    let stored = operand::<Flex, 2>(&mut rng, [9, 6], false);
    let (lhs, rhs) = (
        stored.narrow(0, 3, 4),
        operand::<Flex, 2>(&mut rng, [6, 5], true),
    );
    let ours = tensor_values(Flex::matmul(lhs.clone(), rhs.clone()));
    let (a, b) = (tensor_values(lhs), tensor_values(rhs));
    let [exact, scale] = product_f64(&a, &b, 1, [4, 6, 5]);
    for ((ours, exact), scale) in ours.iter().zip(&exact).zip(&scale) {
        assert!((ours - exact).abs() <= 8.0 * f64::from(f32::EPSILON) * scale);
    }
    let empty = Flex::matmul(
        Tensor::<Flex, 2>::zeros([3, 0], &Default::default()),
        Tensor::<Flex, 2>::zeros([0, 4], &Default::default()),
    );
    assert_eq!(empty.dims(), [3, 4]);
    assert_eq!(tensor_values(empty), vec![0.0; 12]);
}

/// Operands Flex's path does not take (batches that broadcast, f64) give Burn's result.
#[test]
fn flex_matmul_hands_other_operands_to_burn() {
    let mut rng = Rng::new(303);
    let lhs = operand::<Flex, 3>(&mut rng, [2, 3, 4], false);
    let rhs = operand::<Flex, 3>(&mut rng, [1, 4, 5], false);
    let ours = Flex::matmul(lhs.clone(), rhs.clone());
    assert_eq!(ours.dims(), [2, 3, 5]);
    assert_eq!(tensor_values(ours), tensor_values(lhs.matmul(rhs)));

    let (lhs, rhs) = (
        operand::<Flex, 2>(&mut rng, [3, 4], false).cast(DType::F64),
        operand::<Flex, 2>(&mut rng, [4, 2], false).cast(DType::F64),
    );
    let ours = Flex::matmul(lhs.clone(), rhs.clone());
    assert_eq!(ours.dtype(), DType::F64);
    assert_eq!(tensor_values(ours), tensor_values(lhs.matmul(rhs)));
}

#[test]
fn nodes_agree_with_autodiff_of_matmul_in_f64() {
    nodes_agree_with_autodiff_of_matmul::<Ad64>(1e-13);
}

#[test]
fn nodes_agree_with_autodiff_of_matmul_on_flex() {
    nodes_agree_with_autodiff_of_matmul::<Autodiff<Flex>>(2e-6);
}

/// `project` of token rows is Burn's `Linear` of `[batch, seq, d]`, bias included: output and
/// every gradient, in f64.
#[test]
fn project_is_burns_linear() {
    let device = Default::default();
    let layer = LinearConfig::new(6, 4).init::<Ad64>(&device);
    assert!(layer.bias.is_some(), "the check covers the bias");
    let mut rng = Rng::new(305);
    let x = rng.normals(2 * 3 * 6, 1.0);
    let weights = rng.normals(2 * 3 * 4, 1.0);
    let run = |linear: bool| {
        let input = tensor::<Ad64, 3>(x.clone(), [2, 3, 6]).require_grad();
        let output = match linear {
            true => layer.forward(input.clone()),
            false => project(&layer, input.clone().reshape([6, 6])).reshape([2, 3, 4]),
        };
        let values = tensor_values(output.clone());
        let grads = (output * tensor::<Ad64, 3>(weights.clone(), [2, 3, 4]))
            .sum()
            .backward();
        let bias = layer.bias.as_ref().expect("checked above").val();
        [
            values,
            tensor_values(input.grad(&grads).expect("input gradient")),
            tensor_values(layer.weight.val().grad(&grads).expect("weight gradient")),
            tensor_values(bias.grad(&grads).expect("bias gradient")),
        ]
    };
    let (ours, burns) = (run(false), run(true));
    for (what, (ours, burns)) in ["output", "∂x", "∂W", "∂b"]
        .iter()
        .zip(ours.iter().zip(&burns))
    {
        assert!(
            max_abs_diff(ours, burns) <= 1e-12,
            "{what}: {ours:?} vs {burns:?}"
        );
    }
}
