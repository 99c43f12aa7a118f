//! Checks of the residual stream generic over the backend: the foreign decoder (the
//! `foreign_decoder` example's model, three residual events per layer) with perturbed stream
//! parameters, its logits and every gradient, and the fused path against the reference path.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use haares_core::{ResidualMethod, ResidualStream, RoutingPath, TrainingBackend};

use crate::common::{Rng, assert_close_at_scale, tensor_values, weighted_total};
use crate::foreign_model::{ForeignDecoder, ForeignDecoderConfig};

/// The foreign decoder at `n_layers` layers and `blocks` blocks, vocabulary 19, d = 16, with
/// every stream parameter perturbed so that no read is uniform (queries, key norms, detail
/// biases, gates, scales).
pub fn foreign_decoder<B: Backend>(
    method: ResidualMethod,
    n_layers: usize,
    blocks: usize,
    routing: RoutingPath,
    seed: u64,
) -> ForeignDecoder<B> {
    let device = Default::default();
    let mut decoder = ForeignDecoderConfig::new(19)
        .with_d_model(16)
        .with_n_heads(2)
        .with_n_layers(n_layers)
        .with_blocks(blocks)
        .with_method(method)
        .with_routing(routing)
        .init::<B>(&device)
        .expect("a valid foreign decoder");
    perturb(&mut decoder.stream, &mut Rng::new(seed));
    decoder
}

/// Replaces every parameter of the stream with random values around its initial one.
pub fn perturb<B: Backend>(stream: &mut ResidualStream<B>, rng: &mut Rng) {
    let mut random = |shape: usize, offset: f64, std: f64| {
        let values: Vec<f32> = rng
            .normals(shape, std)
            .into_iter()
            .map(|v| (v + offset) as f32)
            .collect();
        Param::from_tensor(Tensor::from_data(
            TensorData::new(values, [shape]),
            &Default::default(),
        ))
    };
    let d = stream.config().d_model;
    let (routers, final_router) = stream.routers_and_final_mut();
    for router in routers.iter_mut().chain(final_router) {
        router.query = random(d, 0.0, 0.7);
        router.key_norm.weight = random(d, 1.0, 0.2);
        if router.detail_bias.is_some() {
            router.detail_bias = Some(random(1, -1.0, 0.5));
        }
    }
    for gate in stream.gates_mut() {
        *gate = random(1, 0.0, 0.7);
    }
    for scale in stream.scales_mut() {
        *scale = random(d, 0.0, 0.7);
    }
}

/// Random ids below 19, `[batch, seq]`.
pub fn tokens<B: Backend>(batch: usize, seq: usize, seed: u64) -> Tensor<B, 2, Int> {
    let mut rng = Rng::new(seed);
    let ids: Vec<i64> = (0..batch * seq).map(|_| rng.below(19) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [batch, seq]), &Default::default())
}

/// Output values, then the gradient of a weighted total of them with respect to every
/// parameter of `module`, in its visiting order (`None` where a parameter has none).
pub fn values_and_gradients<B: AutodiffBackend, M: Module<B>>(
    output: Tensor<B, 3>,
    module: &M,
) -> (Vec<f64>, Vec<Option<Vec<f64>>>) {
    let values = tensor_values(output.clone());
    let grads = weighted_total(output, 11).backward();
    let mut collect = Gradients::<B> {
        grads: &grads,
        out: Vec::new(),
    };
    module.visit(&mut collect);
    (values, collect.out)
}

struct Gradients<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: Vec<Option<Vec<f64>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gradients<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out
            .push(param.val().grad(self.grads).map(tensor_values));
    }
}

/// `actual` and `expected` agree to `relative` (of each tensor's scale), output and every
/// gradient, and have gradients at the same parameters, at least one of them (a comparison of
/// two graphs that lost their gradients would otherwise pass).
pub fn assert_same(
    actual: &(Vec<f64>, Vec<Option<Vec<f64>>>),
    expected: &(Vec<f64>, Vec<Option<Vec<f64>>>),
    relative: f64,
    what: &str,
) {
    assert!(
        actual.1.iter().any(Option::is_some),
        "{what}: no parameter has a gradient"
    );
    assert_close_at_scale(&actual.0, &expected.0, relative, &format!("{what}: output"));
    assert_eq!(
        actual.1.len(),
        expected.1.len(),
        "{what}: parameter counts differ"
    );
    for (i, (a, e)) in actual.1.iter().zip(&expected.1).enumerate() {
        match (a, e) {
            (Some(a), Some(e)) => {
                assert_close_at_scale(a, e, relative, &format!("{what}: gradient {i}"))
            }
            (None, None) => {}
            _ => panic!("{what}: parameter {i} has a gradient on one side only"),
        }
    }
}

/// The foreign decoder on the fused path matches the reference path, logits and every gradient,
/// for Block AttnRes and every HAARES variant, at blocks of m = 3 (three layers of three events).
pub fn fused_stream_matches_the_reference_stream<B: TrainingBackend>(relative: f64) {
    for (seed, method) in crate::common::all_methods()
        .into_iter()
        .filter(ResidualMethod::is_routed)
        .enumerate()
    {
        let reference = foreign_decoder::<B>(method, 3, 3, RoutingPath::Reference, seed as u64);
        let mut fused = reference.clone();
        fused.stream.set_routing(RoutingPath::Fused);
        let tokens = tokens::<B>(2, 7, 3);
        let run = |decoder: &ForeignDecoder<B>| {
            let logits = decoder.forward(tokens.clone(), None).expect("in order");
            values_and_gradients(logits, decoder)
        };
        assert!(fused.stream.folds_norm() && !reference.stream.folds_norm());
        assert_same(&run(&fused), &run(&reference), relative, &method.name());
    }
}
