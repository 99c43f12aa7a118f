//! The depth router and source bank: uniform weights at zero queries, masking details recovers
//! Block AttnRes, eq:duplicate, source counts and initial mass observed in real forward passes,
//! and gradients into queries and detail biases.

use std::collections::HashMap;

use burn::tensor::{Tensor, TensorData};
use haares_core::analysis::{initial_detail_mass_at, source_count};
use haares_core::router::DepthRouterConfig;
use haares_core::{
    DetailBias, HaaresOptions, ModelConfig, ReadSite, ResidualMethod, SlotKind, SourceBank,
};

use crate::common::*;

fn slot(rng: &mut Rng) -> Tensor<B64, 3> {
    Tensor::from_data(
        TensorData::new(rng.normals(2 * 3 * 8, 1.0), [2, 3, 8]),
        &Default::default(),
    )
}

#[test]
fn zero_query_gives_uniform_weights_and_the_mean() {
    let mut rng = Rng::new(31);
    let router = DepthRouterConfig::new(8).init::<B64>(&Default::default());
    let values: Vec<_> = (0..4).map(|_| slot(&mut rng)).collect();
    let mut bank = SourceBank::new(values[0].clone());
    for value in &values[1..] {
        bank.push(SlotKind::Cumulative, value.clone());
    }
    let read = router.forward(&bank);
    assert!(
        tensor_values(read.weights)
            .iter()
            .all(|w| (w - 0.25).abs() < 1e-15)
    );
    let mean = tensor_values(values.into_iter().reduce(|a, b| a + b).unwrap() / 4.0);
    assert!(max_abs_diff(&tensor_values(read.mixture), &mean) < 1e-12);
}

#[test]
fn eq_duplicate_two_equal_slots_are_one_slot_with_a_log_sum_exp_bias() {
    let mut rng = Rng::new(32);
    let (e, c) = (slot(&mut rng), slot(&mut rng));
    let b = -1.3;
    let random_router = |bias: f64| {
        let mut router = DepthRouterConfig::new(8)
            .with_detail_bias(Some(DetailBias::Fixed { value: bias }))
            .init::<B64>(&Default::default());
        let mut query_rng = Rng::new(33);
        router.query = burn::module::Param::from_tensor(Tensor::from_data(
            TensorData::new(query_rng.normals(8, 1.0), [8]),
            &Default::default(),
        ));
        router
    };
    let mut duplicated = SourceBank::new(e.clone());
    duplicated.push(SlotKind::Cumulative, c.clone());
    duplicated.push(SlotKind::Detail, c.clone());
    let mut single = SourceBank::new(e);
    single.push(SlotKind::Detail, c);
    let two = random_router(b).forward(&duplicated).mixture;
    let one = random_router((1.0f64 + b.exp()).ln())
        .forward(&single)
        .mixture;
    assert!(max_abs_diff(&tensor_values(two), &tensor_values(one)) < 1e-12);
}

fn haares_and_block(
    layers: usize,
    blocks: usize,
    seed: u64,
) -> (
    ModelConfig,
    HashMap<String, TensorData>,
    ModelConfig,
    HashMap<String, TensorData>,
) {
    let haares = tiny_config(ResidualMethod::haares(), layers, blocks);
    let params = random_params(&haares, seed);
    let block = tiny_config(ResidualMethod::BlockAttnRes, layers, blocks);
    let block_params = params
        .iter()
        .filter(|(name, _)| !name.ends_with("detail_bias"))
        .map(|(n, d)| (n.clone(), d.clone()))
        .collect();
    (haares, params, block, block_params)
}

#[test]
fn masking_every_detail_slot_reproduces_block_attnres() {
    let (haares, mut params, block, block_params) = haares_and_block(4, 2, 34);
    let tokens = random_tokens(&mut Rng::new(35), 2, 6, haares.vocab_size);
    let block_logits = logits(&model_from(&block, &block_params), &tokens);
    let unmasked = logits(&model_from(&haares, &params), &tokens);
    assert!(
        max_abs_diff(&block_logits, &unmasked) > 1e-3,
        "details must matter before masking"
    );
    // A bias of −∞ gives the masked read exactly (sec:analysis, "Masking all detail slots").
    for (name, data) in params.iter_mut() {
        if name.ends_with("detail_bias") {
            *data = TensorData::new(vec![f64::NEG_INFINITY], [1]);
        }
    }
    let masked = logits(&model_from(&haares, &params), &tokens);
    assert!(max_abs_diff(&block_logits, &masked) < 1e-12);
}

#[test]
fn every_read_sees_the_slots_of_eq_sourceset() {
    for (layers, blocks) in [(6, 3), (6, 4), (3, 6)] {
        for method in [ResidualMethod::BlockAttnRes, ResidualMethod::haares()] {
            let config = tiny_config(method, layers, blocks);
            let with_detail = method.haares_options().is_some();
            let model = model_from(&config, &random_params(&config, 36));
            let tokens = token_tensor::<B64>(
                &random_tokens(&mut Rng::new(37), 1, 4, config.vocab_size),
                &Default::default(),
            );
            let (_, trace) = model.forward_with_trace(tokens).unwrap();
            let m = config.events_per_block();
            assert_eq!(trace.sites.len(), 2 * layers + 1);
            for site in &trace.sites {
                let slots = site.weights.dims()[2];
                assert_eq!(slots, site.slots.len());
                match site.site {
                    ReadSite::Event { event } => {
                        let (n, r) = (event / m + 1, event % m + 1);
                        assert_eq!(
                            slots,
                            source_count(with_detail, n, r),
                            "event {event}, L = {layers}, N = {blocks}"
                        );
                        assert_eq!(site.slots[0].kind, SlotKind::Embedding);
                        let details = site
                            .kinds()
                            .iter()
                            .filter(|k| **k == SlotKind::Detail)
                            .count();
                        assert_eq!(details, if with_detail { (slots - 1) / 2 } else { 0 });
                    }
                    ReadSite::Final => {
                        assert_eq!(slots, blocks + 1);
                        assert!(
                            !site.kinds().contains(&SlotKind::Detail),
                            "the final readout is cumulative-only"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn initial_weights_follow_the_biases_alone() {
    // ModelConfig::init: zero queries and learned detail biases at −2 (eq:initialmass).
    let config = tiny_config(ResidualMethod::haares(), 12, 4);
    let model = config.init::<B64>(&Default::default()).unwrap();
    let tokens = token_tensor::<B64>(
        &random_tokens(&mut Rng::new(38), 2, 5, config.vocab_size),
        &Default::default(),
    );
    let (_, trace) = model.forward_with_trace(tokens).unwrap();
    let m = config.events_per_block();
    for site in &trace.sites {
        let ReadSite::Event { event } = site.site else {
            continue;
        };
        let (n, r) = (event / m + 1, event % m + 1);
        let share = tensor_values(site.detail_share());
        let expected = initial_detail_mass_at(n, r, -2.0);
        assert!(
            share.iter().all(|p| (p - expected).abs() < 1e-12),
            "event {event}: p_D {share:?} vs {expected}"
        );
    }
    let first_active = tensor_values(trace.sites[1].detail_share())[0];
    let last_block_active = tensor_values(trace.sites[3 * m + 1].detail_share())[0];
    assert_eq!(
        (
            (first_active * 1000.0).round(),
            (last_block_active * 1000.0).round()
        ),
        (63.0, 98.0)
    );
}

#[test]
fn duplicated_slot_weight_is_the_cumulative_weight_times_e_to_the_bias() {
    let config = tiny_config(
        ResidualMethod::Haares(HaaresOptions::duplicated_cumulative()),
        4,
        2,
    );
    let params = random_params(&config, 39);
    let model = model_from(&config, &params);
    let tokens = token_tensor::<B64>(
        &random_tokens(&mut Rng::new(40), 1, 5, config.vocab_size),
        &Default::default(),
    );
    let (_, trace) = model.forward_with_trace(tokens).unwrap();
    let site = &trace.sites[5]; // event 5: block 2, r = 2 → e, C1, C1', C2, C2'
    let weights = tensor_values(site.weights.clone());
    let bias = params["layers.2.mlp_router.detail_bias"]
        .to_vec::<f64>()
        .unwrap()[0];
    for position in weights.chunks(5) {
        for (c, dup) in [(1, 2), (3, 4)] {
            assert!((position[dup] / position[c] - bias.exp()).abs() < 1e-12);
        }
    }
}

#[test]
fn queries_and_detail_biases_receive_gradients_at_initialisation() {
    let config = tiny_config(ResidualMethod::haares(), 4, 2);
    let device = Default::default();
    let model = config.init::<Ad64>(&device).unwrap();
    let tokens = token_tensor::<Ad64>(
        &random_tokens(&mut Rng::new(41), 2, 6, config.vocab_size),
        &device,
    );
    let grads = model
        .forward(tokens)
        .unwrap()
        .powi_scalar(2)
        .mean()
        .backward();
    let norm = |p: &burn::module::Param<Tensor<Ad64, 1>>| {
        p.grad(&grads)
            .map(|g| g.abs().sum().into_scalar())
            .unwrap_or(0.0)
    };
    assert_eq!(model.stream.routers().len(), 2 * model.layers.len());
    for (site, router) in model.stream.routers().iter().enumerate() {
        let (query, bias) = (
            norm(&router.query),
            norm(router.detail_bias.as_ref().unwrap()),
        );
        if site == 0 {
            // The first read has the embedding as its only slot: softmax over one slot is constant.
            assert_eq!((query, bias), (0.0, 0.0));
        } else {
            assert!(
                query > 0.0 && bias > 0.0,
                "site {site}: |∇q| = {query}, |∇b| = {bias}"
            );
        }
    }
    assert!(norm(&model.stream.final_router().unwrap().query) > 0.0);
}
