//! The block accumulator's write as one operation (`SourceWriteBackend::signed_sum`,
//! `ops::routing::write`): Flex's loop against the plain operations, and the autodiff node's
//! gradients against Burn's autodiff of the plain operations, with the term's gradient accumulated
//! before the node's or after it.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use haares_core::HaaresBackend;
use haares_core::ops::SourceWriteBackend;
use haares_core::ops::routing::write::naive;

use crate::common::{Ad64, Rng, max_abs_diff, tensor_values};

/// Signs of the half split, of the random-sign ablation (both ±1), and two others.
const SIGNS: [f64; 4] = [1.0, -1.0, 0.5, -2.5];

fn random<B: Backend, const D: usize>(rng: &mut Rng, shape: [usize; D]) -> Tensor<B, D> {
    let values = rng.normals(shape.iter().product(), 1.0);
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

fn flex_agrees_with_the_plain_operations(dtype: DType) {
    let mut rng = Rng::new(71);
    // The last shape is two of the loop's tasks (16384 elements each), the second one partial.
    for shape in [[1, 1, 1], [2, 7, 5], [3, 67, 129]] {
        let cast = |t: Tensor<Flex, 3>| t.cast(dtype);
        let (sum, term) = (cast(random(&mut rng, shape)), cast(random(&mut rng, shape)));
        // A swapped view is not contiguous: the plain operation runs.
        let strided =
            cast(random::<Flex, 3>(&mut rng, [shape[0], shape[2], shape[1]])).swap_dims(1, 2);
        for sign in SIGNS {
            for (label, term) in [("contiguous", term.clone()), ("strided", strided.clone())] {
                let looped = tensor_values(Flex::signed_sum(sum.clone(), term.clone(), sign));
                let plain = tensor_values(naive::signed_sum(sum.clone(), term, sign));
                let what = format!("{dtype:?} {shape:?} sign {sign} {label}");
                if sign.abs() == 1.0 {
                    // One rounding either way: the same number.
                    assert_eq!(looped, plain, "{what}");
                } else {
                    // A fused multiply–add against a product and a sum: within an ulp or two.
                    let scale = plain.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    let bound = if dtype == DType::F32 { 1e-6 } else { 1e-14 };
                    assert!(max_abs_diff(&looped, &plain) <= bound * scale, "{what}");
                }
            }
        }
    }
}

#[test]
fn flex_signed_sum_agrees_with_the_plain_operations_in_f32() {
    flex_agrees_with_the_plain_operations(DType::F32);
}

#[test]
fn flex_signed_sum_agrees_with_the_plain_operations_in_f64() {
    flex_agrees_with_the_plain_operations(DType::F64);
}

/// Gradients of `Σ w₁ ⊙ f(sum, term) + Σ w₂ ⊙ term²` with respect to `sum` and `term`, the
/// term's second use built before `f` or after it (so that its gradient reaches the container
/// before the node's backward pass or after it).
fn gradients<B: AutodiffBackend>(
    f: fn(Tensor<B, 3>, Tensor<B, 3>, f64) -> Tensor<B, 3>,
    sign: f64,
    other_use_first: bool,
) -> [Vec<f64>; 2] {
    let mut rng = Rng::new(72);
    let shape = [2, 9, 5];
    let (sum, term) = (
        random::<B, 3>(&mut rng, shape),
        random::<B, 3>(&mut rng, shape),
    );
    let (sum, term) = (sum.require_grad(), term.require_grad());
    let (w1, w2) = (
        random::<B, 3>(&mut rng, shape),
        random::<B, 3>(&mut rng, shape),
    );
    let other = || (term.clone() * term.clone() * w2.clone()).sum();
    let loss = if other_use_first {
        let other = other();
        (f(sum.clone(), term.clone(), sign) * w1).sum() + other
    } else {
        let main = (f(sum.clone(), term.clone(), sign) * w1).sum();
        main + other()
    };
    let grads = loss.backward();
    [&sum, &term].map(|x| tensor_values(x.grad(&grads).expect("tracked")))
}

fn node_agrees_with_autodiff_of_the_plain_operations<B>(tolerance: f64)
where
    B: AutodiffBackend + HaaresBackend,
{
    for sign in SIGNS {
        for other_use_first in [true, false] {
            let node = gradients::<B>(B::signed_sum, sign, other_use_first);
            let plain = gradients::<B>(naive::signed_sum, sign, other_use_first);
            for (which, (node, plain)) in ["sum", "term"].iter().zip(node.iter().zip(&plain)) {
                let diff = max_abs_diff(node, plain);
                assert!(
                    diff <= tolerance,
                    "∂{which}, sign {sign}, other use first {other_use_first}: {diff}"
                );
            }
        }
    }
}

#[test]
fn the_node_agrees_with_autodiff_of_the_plain_operations_in_f64() {
    node_agrees_with_autodiff_of_the_plain_operations::<Ad64>(1e-12);
}

#[test]
fn the_node_agrees_with_autodiff_of_the_plain_operations_on_flex() {
    node_agrees_with_autodiff_of_the_plain_operations::<Autodiff<Flex>>(1e-5);
}
