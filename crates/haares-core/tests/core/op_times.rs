//! The operation timer (`haares_core::op_times`): while it records, a model's forward and
//! backward passes on Burn's autodiff backend are charged to the operations under `ops`, each
//! node's backward pass once; stopped, it records nothing. Matrix products are also kept by
//! shape, both passes' products under the shapes their arithmetic has.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData};
use haares_core::ResidualMethod;
use haares_core::op_times::{self, OpTime, Pass, ProductShape};
use haares_core::ops::matmul::MatmulBackend;

use crate::common::{Rng, model_on, random_params, random_tokens, tiny_config, token_tensor};

type Ad32 = Autodiff<NdArray<f32>>;

/// One forward and backward pass of a tiny model of `method`.
fn forward_and_backward(method: ResidualMethod) {
    let device = Default::default();
    let config = tiny_config(method, 2, 2);
    let model = model_on::<Ad32>(&config, &random_params(&config, 5), &device);
    let tokens = random_tokens(&mut Rng::new(3), 2, 6, config.vocab_size);
    let logits = model
        .forward(token_tensor::<Ad32>(&tokens, &device))
        .expect("valid tokens");
    let weights = Tensor::from_data(
        TensorData::new(
            Rng::new(7).normals(logits.shape().num_elements(), 1.0),
            logits.dims(),
        ),
        &device,
    );
    let _ = (logits * weights).sum().backward();
}

fn find<'a>(times: &'a [OpTime], operation: &str, pass: Pass) -> Option<&'a OpTime> {
    times
        .iter()
        .find(|t| t.operation == operation && t.pass == pass)
}

#[test]
fn a_recorded_pass_is_charged_to_its_operations_both_ways() {
    for method in [ResidualMethod::Standard, ResidualMethod::haares()] {
        op_times::start_recording();
        forward_and_backward(method);
        let times = op_times::stop_recording();
        let routed = method.is_routed();
        // A routed method's sublayer norms are its reads' (eq:routingweights's normalised
        // mixture), the plain stream's their own operation.
        let norm = if routed { "routing::read" } else { "norm" };
        for operation in ["matmul", norm, "rotary", "softmax"] {
            for pass in [Pass::Forward, Pass::Backward] {
                let time = find(&times, operation, pass)
                    .unwrap_or_else(|| panic!("{method:?}: no {operation} {pass:?} in {times:?}"));
                assert!(time.calls > 0 && time.seconds > 0.0, "{time:?}");
            }
        }
        // Every product node runs its backward pass once.
        let calls = |pass| find(&times, "matmul", pass).unwrap().calls;
        assert_eq!(calls(Pass::Forward), calls(Pass::Backward), "{times:?}");
        // The read and the write are HAARES's, not the plain stream's.
        for operation in ["routing::read", "routing::write"] {
            assert_eq!(
                find(&times, operation, Pass::Forward).is_some(),
                routed,
                "{times:?}"
            );
        }
        // Every name is an operation's folder, not a type path.
        assert!(
            times.iter().all(|t| !t.operation.contains("haares_core")),
            "{times:?}"
        );
    }
    // Stopped, a pass records nothing.
    forward_and_backward(ResidualMethod::Standard);
    assert!(op_times::stop_recording().is_empty());
    assert!(!op_times::recording());
}

#[test]
fn products_are_kept_by_their_shape_with_the_transposed_problem_as_one() {
    let device = Default::default();
    let data = |rows: usize, columns: usize| {
        let values = Rng::new((rows * 10 + columns) as u64).normals(rows * columns, 1.0);
        TensorData::new(values, [rows, columns])
    };
    let a = Tensor::<Ad32, 2>::from_data(data(2, 3), &device).require_grad();
    let b = Tensor::<Ad32, 2>::from_data(data(3, 5), &device).require_grad();
    let c = Tensor::<Ad32, 2>::from_data(data(5, 3), &device).require_grad();
    op_times::start_recording();
    // `Y = (A B) C`, with `C` `[5, 3]` passed as the right operand `Cᵀ` of `lhs · rhsᵀ`.
    let ab = Ad32::matmul(a, b);
    let y = Ad32::matmul_transposed_rhs(ab, c.transpose());
    let _ = y.sum().backward();
    let _ = op_times::stop_recording();
    let products = op_times::take_products();
    let calls = |m, k, n| {
        (products.iter())
            .find(|p| p.shape == ProductShape::new(1, m, k, n))
            .map_or(0, |p| p.calls)
    };
    // `A B` (2 × 3 · 3 × 5) and `∂(A B) = ∂Y Cᵀ` (2 × 3 · 3 × 5).
    assert_eq!(calls(2, 3, 5), 2, "{products:?}");
    // `(A B) C` (2 × 5 · 5 × 3) and `∂A = ∂(A B) Bᵀ` (2 × 5 · 5 × 3).
    assert_eq!(calls(2, 5, 3), 2, "{products:?}");
    // `∂B = Aᵀ ∂(A B)` (3 × 2 · 2 × 5) and the right operand's `∂Yᵀ (A B)` (3 × 2 · 2 × 5): one
    // shape with its transpose, `5 × 2 · 2 × 3`.
    assert_eq!(calls(3, 2, 5), 2, "{products:?}");
    assert_eq!(ProductShape::new(1, 3, 2, 5), ProductShape::new(1, 5, 2, 3));
    assert_eq!(products.iter().map(|p| p.calls).sum::<usize>(), 6);
    assert!(products.iter().all(|p| p.seconds > 0.0), "{products:?}");
    // Taken once; nothing is kept while not recording.
    assert!(op_times::take_products().is_empty());
}
