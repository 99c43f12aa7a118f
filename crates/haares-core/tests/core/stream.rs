//! The residual stream (`src/stream`): a model assembled through its public calls from
//! `HaaresModel`'s own sublayers is `HaaresModel`, logits, every gradient and the trace; the
//! foreign decoder of the `foreign_decoder` example (three events per layer) matches a
//! hand-written loop of eq:sourceset at odd block sizes (each misuse and its error:
//! `stream_errors.rs`).

use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor};
use haares_core::accumulator::random_signs;
use haares_core::layer::Sublayer;
use haares_core::router::DepthRouter;
use haares_core::{
    DetailBias, DetailSource, HaaresModel, HaaresOptions, ReadSite, ResidualMethod, RoutingPath,
    RoutingTrace,
};

use crate::common::{Ad64, Rng, all_methods, model_on, random_params, tensor_values, tiny_config};
use crate::foreign_model::{ForeignDecoder, SUBLAYERS};
use crate::stream_checks::{assert_same, foreign_decoder, tokens, values_and_gradients};

/// `HaaresModel`'s forward pass written with the stream's public calls, each read put through its
/// sublayer's norm after the read (never folded into it), the tied head by hand.
fn assembled(
    model: &HaaresModel<Ad64>,
    tokens: Tensor<Ad64, 2, Int>,
    trace: &mut RoutingTrace<Ad64>,
) -> Tensor<Ad64, 3> {
    let mut stream = model
        .stream
        .start(model.embed.forward(tokens), Some(trace))
        .unwrap();
    for (i, layer) in model.layers.iter().enumerate() {
        for (event, sublayer) in [(2 * i, Sublayer::Attention), (2 * i + 1, Sublayer::Mlp)] {
            let input = layer.norm(sublayer).forward(stream.read(event).unwrap());
            stream
                .write(event, layer.transform(sublayer, input, &model.rope))
                .unwrap();
        }
    }
    let hidden = model.final_norm.forward(stream.finish().unwrap());
    let [batch, seq, d] = hidden.dims();
    let embedding = model.embed.weight.val();
    let vocab = embedding.dims()[0];
    hidden
        .reshape([batch * seq, d])
        .matmul(embedding.transpose())
        .reshape([batch, seq, vocab])
}

#[test]
fn a_model_assembled_through_the_stream_is_haares_model() {
    for (seed, method) in all_methods().into_iter().enumerate() {
        for routing in [RoutingPath::Reference, RoutingPath::Fused] {
            let config = tiny_config(method, 3, 3).with_routing(routing);
            let params = random_params(&config, 40 + seed as u64);
            let model: HaaresModel<Ad64> = model_on(&config, &params, &Default::default());
            let tokens = tokens::<Ad64>(2, 5, seed as u64);
            let what = format!("{} on the {routing:?} path", method.name());

            let (logits, model_trace) = model.forward_with_trace(tokens.clone()).unwrap();
            let expected = values_and_gradients(logits, &model);
            let mut trace = RoutingTrace::default();
            let actual = values_and_gradients(assembled(&model, tokens, &mut trace), &model);
            assert_same(&actual, &expected, 1e-10, &what);

            assert_eq!(trace.sites.len(), model_trace.sites.len(), "{what}: sites");
            for (site, expected) in trace.sites.iter().zip(&model_trace.sites) {
                assert_eq!(
                    (site.site, &site.slots),
                    (expected.site, &expected.slots),
                    "{what}"
                );
                crate::common::assert_close_at_scale(
                    &tensor_values(site.weights.clone()),
                    &tensor_values(expected.weights.clone()),
                    1e-12,
                    &format!("{what}: weights at {:?}", site.site),
                );
            }
        }
    }
}

/// eq:routingweights written out: `z_s = qᵀ (w ⊙ s / √(mean(s²) + ε)) + b_s`, softmax over the
/// slots, the weighted sum, and the weights. `slots` are `(value, is_detail)`. The router gives
/// only its parameters (query, key-norm weight, learned bias); ε and a fixed detail bias come
/// from the configuration, so that the test sees whether they reach the routers.
fn route(
    router: &DepthRouter<Ad64>,
    slots: &[(Tensor<Ad64, 3>, bool)],
    epsilon: f64,
    fixed_bias: Option<f64>,
) -> (Tensor<Ad64, 3>, Tensor<Ad64, 3>) {
    let (query, weight) = (router.query.val(), router.key_norm.weight.val());
    let bias = |detail: bool| match (detail, &router.detail_bias, fixed_bias) {
        (false, _, _) | (true, None, None) => None,
        (true, Some(bias), _) => Some(bias.val().unsqueeze::<3>()),
        (true, None, Some(value)) => Some(Tensor::<Ad64, 3>::full(
            [1, 1, 1],
            value,
            &Default::default(),
        )),
    };
    let scores: Vec<Tensor<Ad64, 3>> = slots
        .iter()
        .map(|(s, detail)| {
            let key = s.clone() / (s.clone().powi_scalar(2).mean_dim(2) + epsilon).sqrt()
                * weight.clone().unsqueeze::<3>();
            let score = (key * query.clone().unsqueeze::<3>()).sum_dim(2);
            match bias(*detail) {
                Some(bias) => score + bias,
                None => score,
            }
        })
        .collect();
    let alpha = softmax(Tensor::cat(scores, 2), 2);
    let mixture = slots
        .iter()
        .enumerate()
        .map(|(i, (s, _))| alpha.clone().narrow(2, i, 1) * s.clone())
        .reduce(|a, b| a + b)
        .expect("the embedding is always a slot");
    (mixture, alpha)
}

/// The foreign decoder's forward pass with the residual method written by hand from the paper:
/// eq:partial and eq:update for the sums, eq:rmsmatch, eq:sourceset for the banks, eq:final. The
/// routing weights of each read site go into `weights`, in order.
fn hand_written(
    decoder: &ForeignDecoder<Ad64>,
    tokens: Tensor<Ad64, 2, Int>,
    weights: &mut Vec<Tensor<Ad64, 3>>,
) -> Tensor<Ad64, 3> {
    let stream = &decoder.stream;
    let config = stream.config();
    let embedding = decoder.embed.forward(tokens);
    let sublayer =
        |t: usize, x: Tensor<Ad64, 3>| decoder.layers[t / SUBLAYERS].sublayer(t % SUBLAYERS, x);
    let head = |h: Tensor<Ad64, 3>| decoder.head.forward(decoder.final_norm.forward(h));
    if !config.method.is_routed() {
        let mut h = embedding;
        for t in 0..config.events {
            let u = sublayer(t, h.clone());
            h = match (stream.gates().get(t), stream.scales().get(t)) {
                (Some(g), _) => h + u * g.val().unsqueeze::<3>(),
                (None, Some(l)) => h + u * l.val().unsqueeze::<3>(),
                (None, None) => h + u,
            };
        }
        return head(h);
    }
    let options = config.method.haares_options().copied();
    let fixed_bias = match options.map(|o| o.detail_bias) {
        Some(DetailBias::Fixed { value }) => Some(value),
        _ => None,
    };
    let mut route = |router: &DepthRouter<Ad64>, slots: &[(Tensor<Ad64, 3>, bool)]| {
        let (mixture, alpha) = route(router, slots, config.norm_epsilon, fixed_bias);
        weights.push(alpha);
        mixture
    };
    let (blocks, m) = (config.blocks, config.events / config.blocks);
    let sign = |n: usize, r: usize| match options.map(|o| o.detail) {
        Some(DetailSource::RandomSigns { seed }) => random_signs(seed, blocks, m)[n][r - 1],
        _ if r <= m.div_ceil(2) => 1.0,
        _ => -1.0,
    };
    let rms = |x: &Tensor<Ad64, 3>| x.clone().powi_scalar(2).mean_dim(2).sqrt();
    let shown = |c: &Tensor<Ad64, 3>, d: &Tensor<Ad64, 3>| {
        let o = options?;
        Some(match o.detail {
            DetailSource::DuplicatedCumulative => c.clone(),
            _ if !o.rms_match => d.clone(),
            // eq:rmsmatch's multiplier is stop-gradient: sg[clip(RMS(C) / (RMS(D) + ε), 1/γ, γ)].
            _ => {
                let a = (rms(c) / (rms(d) + o.rms_epsilon)).clamp(1.0 / o.rms_gamma, o.rms_gamma);
                d.clone() * a.detach()
            }
        })
    };
    let mut completed: Vec<(Tensor<Ad64, 3>, Option<Tensor<Ad64, 3>>)> = Vec::new();
    let zero = embedding.zeros_like();
    let (mut c, mut d) = (zero.clone(), zero.clone());
    for t in 0..config.events {
        let (n, r) = (t / m, t % m + 1);
        let mut slots = vec![(embedding.clone(), false)];
        let active = (r > 1).then(|| (c.clone(), shown(&c, &d)));
        for (cumulative, detail) in completed.iter().cloned().chain(active) {
            slots.push((cumulative, false));
            slots.extend(detail.map(|detail| (detail, true)));
        }
        let u = sublayer(t, route(&stream.routers()[t], &slots));
        c = c + u.clone();
        d = d + u * sign(n, r);
        if r == m {
            completed.push((c.clone(), shown(&c, &d)));
            (c, d) = (zero.clone(), zero.clone());
        }
    }
    let mut slots = vec![(embedding, false)];
    slots.extend(completed.into_iter().map(|(c, _)| (c, false)));
    head(route(
        stream.final_router().expect("a routed method"),
        &slots,
    ))
}

#[test]
fn three_events_per_layer_match_a_hand_written_loop_at_odd_block_sizes() {
    // The paper's methods, and a fixed detail bias other than 0 (the ablation's is 0, at which a
    // bias that never reached the scores would go unseen).
    let methods = all_methods().into_iter().chain([ResidualMethod::Haares(
        HaaresOptions::fixed_detail_bias(-1.5),
    )]);
    // m = 3 (3 layers, N = 3), m = 5 (5 layers, N = 3) and m = 1 (3 layers, N = 9).
    for (n_layers, blocks) in [(3, 3), (5, 3), (3, 9)] {
        for (seed, method) in methods.clone().enumerate() {
            for routing in [RoutingPath::Reference, RoutingPath::Fused] {
                let decoder =
                    foreign_decoder::<Ad64>(method, n_layers, blocks, routing, seed as u64);
                let tokens = tokens::<Ad64>(2, 6, 100 + seed as u64);
                let what = format!(
                    "{}, {n_layers} layers x {SUBLAYERS}, N = {blocks}, {routing:?}",
                    method.name()
                );
                let mut trace = RoutingTrace::default();
                let logits = decoder.forward(tokens.clone(), Some(&mut trace)).unwrap();
                let mut weights = Vec::new();
                let expected = hand_written(&decoder, tokens, &mut weights);
                let expected = values_and_gradients(expected, &decoder);
                let actual = values_and_gradients(logits, &decoder);
                assert_same(&actual, &expected, 1e-10, &what);
                assert_trace_is(&trace, &weights, &what);
            }
        }
    }
}

/// Every read site of `trace` holds `weights`, in order, the final readout last.
fn assert_trace_is(trace: &RoutingTrace<Ad64>, weights: &[Tensor<Ad64, 3>], what: &str) {
    assert_eq!(trace.sites.len(), weights.len(), "{what}: read sites");
    for (i, (site, expected)) in trace.sites.iter().zip(weights).enumerate() {
        let site_name = if i + 1 == weights.len() {
            ReadSite::Final
        } else {
            ReadSite::Event { event: i }
        };
        assert_eq!(site.site, site_name, "{what}");
        crate::common::assert_close_at_scale(
            &tensor_values(site.weights.clone()),
            &tensor_values(expected.clone()),
            1e-12,
            &format!("{what}: weights at {site_name:?}"),
        );
    }
}

#[test]
fn the_stream_s_norm_epsilon_reaches_every_router() {
    // A large ε changes every key: a router left at the default would route otherwise.
    for routing in [RoutingPath::Reference, RoutingPath::Fused] {
        let mut decoder = foreign_decoder::<Ad64>(ResidualMethod::haares(), 3, 3, routing, 9);
        let config = decoder.stream.config().clone().with_norm_epsilon(0.3);
        decoder.stream = config.init(&Default::default()).unwrap();
        crate::stream_checks::perturb(&mut decoder.stream, &mut Rng::new(9));
        let tokens = tokens::<Ad64>(2, 6, 4);
        let mut trace = RoutingTrace::default();
        let logits = decoder.forward(tokens.clone(), Some(&mut trace)).unwrap();
        let mut weights = Vec::new();
        let expected = hand_written(&decoder, tokens, &mut weights);
        let what = format!("ε = 0.3, {routing:?}");
        assert_same(
            &values_and_gradients(logits, &decoder),
            &values_and_gradients(expected, &decoder),
            1e-10,
            &what,
        );
        assert_trace_is(&trace, &weights, &what);
    }
}

#[test]
fn the_fused_stream_matches_the_reference_stream_in_f64() {
    crate::stream_checks::fused_stream_matches_the_reference_stream::<Ad64>(1e-10);
}
