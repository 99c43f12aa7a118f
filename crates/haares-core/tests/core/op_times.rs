//! The operation timer (`haares_core::op_times`): while it records, a model's forward and
//! backward passes on Burn's autodiff backend are charged to the operations under `ops`, each
//! node's backward pass once; stopped, it records nothing.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorData};
use haares_core::ResidualMethod;
use haares_core::op_times::{self, OpTime, Pass};

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
