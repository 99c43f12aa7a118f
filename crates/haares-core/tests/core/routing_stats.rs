//! Routing statistics against closed forms (zero queries, a huge detail bias, eq:initialmass) and
//! against a plain host-side computation from the trace.

use burn::tensor::{Tensor, TensorData};
use haares_core::analysis::initial_detail_mass_at;
use haares_core::{
    HaaresOptions, ReadSite, ResidualMethod, RoutingStatistics, RoutingTally, SlotGroup, SlotId,
    SlotKind,
};

use crate::common::*;

/// The statistics of a freshly initialised model (zero queries) over random tokens.
fn initial_statistics(method: ResidualMethod, layers: usize, blocks: usize) -> RoutingStatistics {
    let config = tiny_config(method, layers, blocks);
    let model = config.init::<B64>(&Default::default()).unwrap();
    let tokens = token_tensor::<B64>(
        &random_tokens(&mut Rng::new(51), 2, 6, config.vocab_size),
        &Default::default(),
    );
    let (_, trace) = model.forward_with_trace(tokens).unwrap();
    let mut tally = RoutingTally::new();
    tally.add(&trace, None).unwrap();
    tally.finish(&model)
}

#[test]
fn zero_queries_and_equal_biases_route_uniformly() {
    let method = ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(0.0));
    let stats = initial_statistics(method, 4, 2);
    assert_eq!(stats.tokens, 12.0);
    assert_eq!(stats.sites.len(), 9);
    for site in &stats.sites {
        let slots = site.slots.len() as f64;
        for weight in &site.weights {
            assert!((weight - 1.0 / slots).abs() < 1e-12, "{site:?}");
        }
        assert!((site.entropy - slots.ln()).abs() < 1e-12, "{site:?}");
        let details = site
            .slots
            .iter()
            .filter(|s| s.kind == SlotKind::Detail)
            .count();
        assert!((site.detail_mass - details as f64 / slots).abs() < 1e-12);
        let group_sum: f64 = SlotGroup::ALL.iter().map(|g| site.groups.get(*g)).sum();
        assert!((group_sum - 1.0).abs() < 1e-12);
    }
    // Event 1 (block 1, r = 2) reads e, C_1^(1), D_1^(1): one of each of three groups.
    let second = stats.site(ReadSite::Event { event: 1 }).unwrap();
    assert_eq!((second.block, second.position), (Some(1), Some(2)));
    assert!((second.groups.active_detail - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(second.groups.completed_detail, 0.0);
}

#[test]
fn a_huge_detail_bias_sends_all_weight_to_the_detail_slots() {
    let method = ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(80.0));
    let stats = initial_statistics(method, 4, 2);
    for site in stats.sites.iter().filter(|site| site.has_detail()) {
        assert!((site.detail_mass - 1.0).abs() < 1e-12, "{site:?}");
        // The weight spreads evenly over the detail slots, and nowhere else.
        let details = site
            .slots
            .iter()
            .filter(|s| s.kind == SlotKind::Detail)
            .count();
        assert!(
            (site.entropy - (details as f64).ln()).abs() < 1e-9,
            "{site:?}"
        );
        assert!(site.entropy.is_finite());
        assert_eq!(site.detail_bias, Some(80.0));
    }
    let first = stats.site(ReadSite::Event { event: 0 }).unwrap();
    assert_eq!(
        (first.detail_mass, first.weights.as_slice()),
        (0.0, &[1.0][..])
    );
}

#[test]
fn the_initial_detail_mass_is_eq_initialmass() {
    // A four-block model as in the paper's example: m = 4 events per block.
    let stats = initial_statistics(ResidualMethod::haares(), 8, 4);
    for site in &stats.sites {
        match (site.block, site.position) {
            (Some(n), Some(r)) => {
                let expected = initial_detail_mass_at(n, r, -2.0);
                assert!((site.detail_mass - expected).abs() < 1e-12, "{site:?}");
                assert_eq!(site.detail_bias, Some(-2.0));
            }
            _ => assert_eq!((site.detail_mass, site.detail_bias), (0.0, None)),
        }
    }
    // The paper's numbers (sec. "Depth routing"): 6.3% at the first active read, 9.8% at an
    // active read of the last block.
    let first_active = stats.site(ReadSite::Event { event: 1 }).unwrap();
    let last_block = stats.site(ReadSite::Event { event: 15 }).unwrap();
    assert_eq!(last_block.block, Some(4));
    assert!((first_active.detail_mass - 0.063).abs() < 5e-4);
    assert!((last_block.detail_mass - 0.098).abs() < 5e-4);
    let mean = stats.mean_detail_mass().unwrap();
    assert!(mean > first_active.detail_mass && mean < last_block.detail_mass);
}

#[test]
fn block_attnres_has_no_detail_mass_and_no_bias() {
    let stats = initial_statistics(ResidualMethod::BlockAttnRes, 4, 2);
    assert_eq!(stats.mean_detail_mass(), None);
    assert!(
        stats
            .sites
            .iter()
            .all(|s| s.detail_bias.is_none() && s.detail_mass == 0.0)
    );
}

#[test]
fn masked_sums_match_a_plain_computation_from_the_trace() {
    let config = tiny_config(ResidualMethod::haares(), 4, 2);
    let model = model_from(&config, &random_params(&config, 52));
    let device = Default::default();
    let (batch, seq) = (3, 5);
    let tokens = random_tokens(&mut Rng::new(53), batch, seq, config.vocab_size);
    let (_, trace) = model
        .forward_with_trace(token_tensor::<B64>(&tokens, &device))
        .unwrap();
    let mask: Vec<f64> = (0..batch * seq).map(|i| f64::from(i % 3 != 1)).collect();
    let mask_tensor =
        Tensor::<B64, 2>::from_data(TensorData::new(mask.clone(), [batch, seq]), &device);
    let mut tally = RoutingTally::new();
    tally.add(&trace, Some(&mask_tensor)).unwrap();
    let stats = tally.finish(&model);
    let counted: f64 = mask.iter().sum();
    assert_eq!(stats.tokens, counted);
    for (site, trace_site) in stats.sites.iter().zip(&trace.sites) {
        let weights = tensor_values(trace_site.weights.clone());
        let slots = site.slots.len();
        let rows: Vec<&[f64]> = weights.chunks(slots).collect();
        for slot in 0..slots {
            let mean = rows
                .iter()
                .zip(&mask)
                .map(|(row, m)| row[slot] * m)
                .sum::<f64>()
                / counted;
            assert!((site.weights[slot] - mean).abs() < 1e-12);
        }
        let entropy = rows
            .iter()
            .zip(&mask)
            .map(|(row, m)| -m * row.iter().map(|a| a * a.ln()).sum::<f64>())
            .sum::<f64>()
            / counted;
        assert!((site.entropy - entropy).abs() < 1e-12);
    }
}

#[test]
fn two_passes_tally_like_one_pass_over_both_batches() {
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let model = model_from(&config, &random_params(&config, 54));
    let device = Default::default();
    let tokens = random_tokens(&mut Rng::new(55), 4, 5, config.vocab_size);
    let trace = |rows: &[Vec<usize>]| {
        model
            .forward_with_trace(token_tensor::<B64>(rows, &device))
            .unwrap()
            .1
    };
    let mut halves = RoutingTally::new();
    halves.add(&trace(&tokens[..1]), None).unwrap();
    halves.add(&trace(&tokens[1..]), None).unwrap();
    let mut whole = RoutingTally::new();
    whole.add(&trace(&tokens), None).unwrap();
    let (halves, whole) = (halves.finish(&model), whole.finish(&model));
    assert_eq!(halves.tokens, whole.tokens);
    for (a, b) in halves.sites.iter().zip(&whole.sites) {
        assert!(max_abs_diff(&a.weights, &b.weights) < 1e-12);
        assert!((a.entropy - b.entropy).abs() < 1e-12);
    }
    // Another model's trace cannot join the tally.
    let other = tiny_config(ResidualMethod::BlockAttnRes, 2, 2);
    let other = model_from(&other, &random_params(&other, 56));
    let (_, other_trace) = other
        .forward_with_trace(token_tensor::<B64>(&tokens, &device))
        .unwrap();
    let mut tally = RoutingTally::new();
    tally.add(&trace(&tokens), None).unwrap();
    let error = tally.add(&other_trace, None).unwrap_err().to_string();
    assert!(error.contains("one RoutingTally per model"), "{error}");
}

#[test]
fn slot_names_follow_the_paper_and_read_back() {
    use SlotKind::{Cumulative as C, Detail as D, Embedding as E};
    // Block 3, r = 3: e, two completed pairs, the active pair after two writes.
    let slots = SlotId::name_bank(&[E, C, D, C, D, C, D], 2, 2);
    let names: Vec<String> = slots.iter().map(ToString::to_string).collect();
    assert_eq!(
        names,
        ["e", "C_1", "D_1", "C_2", "D_2", "C_3^(2)", "D_3^(2)"]
    );
    for (slot, name) in slots.iter().zip(&names) {
        assert_eq!(&name.parse::<SlotId>().unwrap(), slot);
        assert_eq!(serde_json::to_string(slot).unwrap(), format!("\"{name}\""));
    }
    assert_eq!(slots[5].group(), SlotGroup::ActiveCumulative);
    assert_eq!(slots[2].group(), SlotGroup::CompletedDetail);
    for bad in ["", "C", "X_1", "C_x", "D_1^(2", "C_1^(x)"] {
        assert!(bad.parse::<SlotId>().is_err(), "`{bad}` parsed");
    }
}
