//! The residual stream's refusals (`src/stream`): each call out of order names the expected call
//! and leaves the pass as it was; bad shapes, configurations and parameters are refused; the
//! stream holds each method's parameters.

use burn::tensor::Tensor;
use haares_core::{HaaresError, ResidualMethod, ResidualStreamConfig};

use crate::common::{B64, Rng, tensor_values};

/// A stream of three events in one block, HAARES, d = 4, from a `[1, 2, 4]` embedding.
fn small_stream() -> (haares_core::ResidualStream<B64>, Tensor<B64, 3>) {
    let stream = ResidualStreamConfig::new(4, 3, 1)
        .init::<B64>(&Default::default())
        .unwrap();
    let values: Vec<f64> = Rng::new(5).normals(8, 1.0);
    let embedding = crate::common::tensor::<B64, 3>(values, [1, 2, 4]);
    (stream, embedding)
}

fn order_error<T: std::fmt::Debug>(result: Result<T, HaaresError>) -> String {
    match result {
        Err(HaaresError::StreamOrder(message)) => message,
        other => panic!("expected a stream-order error, got {other:?}"),
    }
}

#[test]
fn each_misuse_is_refused_with_the_expected_call() {
    let (stream, embedding) = small_stream();
    let u = || embedding.clone() * 0.5;
    let mut state = stream.start(embedding.clone(), None).unwrap();
    let message = order_error(state.write(0, u()));
    assert!(
        message.contains("write(0, u) refused: event 0 is written before it is read"),
        "{message}"
    );
    assert!(message.contains("expects read(0) next"), "{message}");
    let message = order_error(state.read(1));
    assert!(
        message.contains("in order") && message.contains("expects read(0) next"),
        "{message}"
    );
    state.read(0).unwrap();
    let message = order_error(state.read(0));
    assert!(message.contains("event 0 was already read"), "{message}");
    assert!(message.contains("expects write(0, u) next"), "{message}");
    state.write(0, u()).unwrap();
    let message = order_error(state.read(7));
    assert!(
        message.contains("event 7 is past the stream's 3 events (0 to 2)"),
        "{message}"
    );
    assert!(message.contains("expects read(1) next"), "{message}");
    assert_eq!(state.next_event(), Some(1));
    // The whole message, as docs/library.md quotes it.
    let error = state.finish().unwrap_err();
    assert_eq!(
        error.to_string(),
        "residual stream call out of order: finish() refused: the pass finishes after all 3 \
         events, and 1 are written; the stream expects read(1) next"
    );

    // A full pass: reading past the last event names finish().
    let mut state = stream.start(embedding.clone(), None).unwrap();
    for event in 0..3 {
        state.read(event).unwrap();
        state.write(event, u()).unwrap();
    }
    assert_eq!(state.next_event(), None);
    let error = state.read(3).unwrap_err();
    assert_eq!(
        error.to_string(),
        "residual stream call out of order: read(3) refused: event 3 is past the stream's 3 \
         events (0 to 2); the stream expects finish() next"
    );
    state.finish().unwrap();
}

#[test]
fn refused_calls_leave_the_pass_as_it_was() {
    let (stream, embedding) = small_stream();
    let outputs: Vec<Tensor<B64, 3>> = (0..3)
        .map(|t| embedding.clone().sin() * (t as f64 + 1.0))
        .collect();
    let pass = |misuse: bool| {
        let mut state = stream.start(embedding.clone(), None).unwrap();
        for (event, u) in outputs.iter().enumerate() {
            if misuse {
                assert!(state.write(event, u.clone()).is_err());
                assert!(state.read(event + 1).is_err());
            }
            let input = state.read(event).unwrap();
            if misuse {
                assert!(state.read(event).is_err());
            }
            state.write(event, u.clone() + input * 0.1).unwrap();
        }
        tensor_values(state.finish().unwrap())
    };
    assert_eq!(pass(true), pass(false));
}

#[test]
fn bad_shapes_and_configs_are_refused() {
    let (stream, embedding) = small_stream();
    let wide = Tensor::<B64, 3>::zeros([1, 2, 5], &Default::default());
    match stream.start(wide, None) {
        Err(HaaresError::InvalidInput(message)) => {
            assert!(
                message.contains("[1, 2, 5]") && message.contains("[batch, seq, 4]"),
                "{message}"
            )
        }
        _ => panic!("a too-wide embedding must be refused"),
    }
    let mut state = stream.start(embedding, None).unwrap();
    state.read(0).unwrap();
    let long = Tensor::<B64, 3>::zeros([1, 3, 4], &Default::default());
    match state.write(0, long) {
        Err(HaaresError::InvalidInput(message)) => {
            assert!(
                message.contains("[1, 3, 4]") && message.contains("[1, 2, 4]"),
                "{message}"
            )
        }
        other => panic!("a wrong-shaped output must be refused, got {other:?}"),
    }
    // The refused write left event 0 to be written.
    assert_eq!(state.next_event(), Some(0));
    for (config, field) in [
        (ResidualStreamConfig::new(4, 9, 2), "blocks"),
        (ResidualStreamConfig::new(4, 0, 1), "events"),
        (ResidualStreamConfig::new(0, 4, 1), "d_model"),
        (
            ResidualStreamConfig::new(4, 4, 2).with_norm_epsilon(0.0),
            "norm_epsilon",
        ),
        (
            ResidualStreamConfig::new(4, 6, 3)
                .with_method(ResidualMethod::LayerScale { init: None }),
            "layer_scale_depth",
        ),
    ] {
        match config.init::<B64>(&Default::default()) {
            Err(error @ HaaresError::InvalidStream { field: f, .. }) => {
                assert_eq!(f, field);
                assert!(
                    error
                        .to_string()
                        .starts_with("invalid residual stream configuration, field"),
                    "{error}"
                );
            }
            other => panic!("{field}: expected a stream config error, got {other:?}"),
        }
    }
    // Unrouted methods take any block count.
    ResidualStreamConfig::new(4, 9, 2)
        .with_method(ResidualMethod::Standard)
        .init::<B64>(&Default::default())
        .unwrap();
}

#[test]
fn the_stream_holds_each_methods_parameters() {
    let count = |method: ResidualMethod| {
        let stream = ResidualStreamConfig::new(4, 6, 3)
            .with_method(method)
            .with_layer_scale_depth(Some(3))
            .init::<B64>(&Default::default())
            .unwrap();
        let detail_biases = stream
            .routers()
            .iter()
            .filter(|r| r.detail_bias.is_some())
            .count();
        (
            stream.routers().len(),
            stream.final_router().is_some(),
            stream.gates().len(),
            stream.scales().len(),
            detail_biases,
        )
    };
    assert_eq!(count(ResidualMethod::Standard), (0, false, 0, 0, 0));
    assert_eq!(count(ResidualMethod::ReZero), (0, false, 6, 0, 0));
    assert_eq!(
        count(ResidualMethod::LayerScale { init: None }),
        (0, false, 0, 6, 0)
    );
    assert_eq!(count(ResidualMethod::BlockAttnRes), (6, true, 0, 0, 0));
    assert_eq!(count(ResidualMethod::haares()), (6, true, 0, 0, 6));
}

#[test]
fn layer_scale_starts_from_the_depth_in_layers_not_events() {
    // The paper's rule (tab:reprobackbone; docs/decisions.md, decision 4): 0.1 up to 18 layers,
    // 1e-5 up to 24, 1e-6 beyond. Three events per layer: 12 layers are 36 events, whose half (18) would still say
    // 0.1, and 24 layers are 72 events, whose half (36) would say 1e-6.
    for (layers, expected) in [(12, 0.1), (20, 1e-5), (24, 1e-5), (30, 1e-6)] {
        let stream = ResidualStreamConfig::new(4, 3 * layers, 3)
            .with_method(ResidualMethod::LayerScale { init: None })
            .with_layer_scale_depth(Some(layers))
            .init::<B64>(&Default::default())
            .unwrap();
        for scale in stream.scales() {
            assert_eq!(
                tensor_values(scale.val()),
                vec![expected; 4],
                "L = {layers}"
            );
        }
    }
    // A scale the method names is taken as it is, with or without a depth.
    let stream = ResidualStreamConfig::new(4, 6, 3)
        .with_method(ResidualMethod::LayerScale { init: Some(0.25) })
        .init::<B64>(&Default::default())
        .unwrap();
    assert_eq!(tensor_values(stream.scales()[0].val()), vec![0.25; 4]);
    let error = ResidualStreamConfig::new(4, 6, 3)
        .with_method(ResidualMethod::LayerScale { init: None })
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("layer_scale_depth") && error.contains("with_layer_scale_depth"),
        "{error}"
    );
}

#[test]
fn a_parameter_of_another_width_is_refused_at_start() {
    use burn::module::Param;
    let device = Default::default();
    let embedding = Tensor::<B64, 3>::zeros([1, 2, 4], &device);
    let wider = || Param::from_tensor(Tensor::<B64, 1>::zeros([5], &device));
    let mut routed = ResidualStreamConfig::new(4, 6, 3)
        .init::<B64>(&device)
        .unwrap();
    routed.routers_mut()[2].query = wider();
    let mut gated = ResidualStreamConfig::new(4, 6, 3)
        .with_method(ResidualMethod::ReZero)
        .init::<B64>(&device)
        .unwrap();
    gated.gates_mut()[0] = wider();
    for (stream, field, says) in [
        (routed, "routers", "a query of the stream has width 5"),
        (
            gated,
            "gates",
            "a gate of the stream has width 5, and its configuration needs 1",
        ),
    ] {
        match stream.start(embedding.clone(), None) {
            Err(error @ HaaresError::InvalidStream { field: f, .. }) => {
                assert_eq!(f, field);
                assert!(error.to_string().contains(says), "{error}");
            }
            Err(other) => panic!("expected a refused stream, got {other:?}"),
            Ok(_) => panic!("{field}: expected a refused stream, got a pass"),
        }
    }
}
