//! The paper's analytic numbers: tab:sourcecounts, eq:avgsource, eq:initialmass, the 48-layer
//! parameter counts of tab:modelconfig and eq:breakeven.

use burn::module::Module;
use haares_core::analysis::*;
use haares_core::{HaaresOptions, ModelFamily, ResidualMethod};

use crate::common::*;

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[test]
fn source_counts_follow_sec_complexity() {
    for n in 1..=8 {
        for r in 1..=24 {
            let active = (r > 1) as usize;
            assert_eq!(source_count(false, n, r), n + active);
            assert_eq!(source_count(true, n, r), 2 * n - 1 + 2 * active);
        }
    }
}

#[test]
fn tab_sourcecounts_is_reproduced_exactly() {
    // (N, Block average, Block max, HAARES average, HAARES max) at 48 layers.
    for (blocks, block_avg, block_max, haares_avg, haares_max) in [
        (4, 3.46, 5, 5.92, 9),
        (6, 4.44, 7, 7.88, 13),
        (8, 5.42, 9, 9.83, 17),
    ] {
        let block = source_count_summary(false, 48, blocks).unwrap();
        let haares = source_count_summary(true, 48, blocks).unwrap();
        assert_eq!(
            (round2(block.average), block.maximum),
            (block_avg, block_max),
            "Block AttnRes, N = {blocks}"
        );
        assert_eq!(
            (round2(haares.average), haares.maximum),
            (haares_avg, haares_max),
            "HAARES, N = {blocks}"
        );
        assert_eq!(
            (block.final_readout, haares.final_readout),
            (blocks + 1, blocks + 1)
        );
    }
}

#[test]
fn enumerated_averages_equal_eq_avgsource() {
    for layers in [1, 2, 3, 6, 12, 24, 48] {
        for blocks in (1..=2 * layers).filter(|n| 2 * layers % n == 0) {
            let m = 2 * layers / blocks;
            for with_detail in [false, true] {
                let enumerated = source_count_summary(with_detail, layers, blocks)
                    .unwrap()
                    .average;
                let closed = average_source_count_closed_form(with_detail, blocks, m);
                assert!(
                    (enumerated - closed).abs() < 1e-12,
                    "L = {layers}, N = {blocks}, detail = {with_detail}"
                );
            }
        }
    }
    assert!(
        source_count_summary(true, 48, 5).is_err(),
        "N = 5 does not divide 96"
    );
}

#[test]
fn initial_detail_mass_matches_the_paper() {
    // First active read: c = 2, h = 1 → ≈ 6.3%; active read in the last of four blocks: c = 5, h = 4 → ≈ 9.8%.
    let first = initial_detail_mass_at(1, 2, -2.0);
    let last = initial_detail_mass_at(4, 2, -2.0);
    assert_eq!((first * 1000.0).round() / 10.0, 6.3);
    assert_eq!((last * 1000.0).round() / 10.0, 9.8);
    assert!((first - (-2.0f64).exp() / (2.0 + (-2.0f64).exp())).abs() < 1e-15);
    assert!((last - 4.0 * (-2.0f64).exp() / (5.0 + 4.0 * (-2.0f64).exp())).abs() < 1e-15);
    assert_eq!(
        initial_detail_mass_at(1, 1, -2.0),
        0.0,
        "the very first read sees no detail"
    );
}

#[test]
fn paper_parameter_counts_at_48_layers() {
    let millions = |n: usize| (n as f64 / 1e5).round() / 10.0;
    let count = |family: ModelFamily, vocab| {
        parameter_count(&family.config(48, vocab, ResidualMethod::haares()))
    };
    assert_eq!(
        millions(count(ModelFamily::Small, 256).weight_matrices()),
        22.0
    );
    assert_eq!(
        millions(count(ModelFamily::Medium, 256).weight_matrices()),
        201.3
    );
    assert_eq!(
        millions(count(ModelFamily::Large, 256).weight_matrices()),
        453.0
    );
    let bpe = count(ModelFamily::Medium, 4096);
    assert_eq!(millions(bpe.weight_matrices() + bpe.embedding), 203.4);
    // Every parameter: matrices + V·d + (2L+1)·d norms + 2L routers (2d + 1) + the final router (2d).
    for (family, total) in [
        (ModelFamily::Small, 22_090_208),
        (ModelFamily::Medium, 201_606_752),
        (ModelFamily::Large, 453_405_024),
    ] {
        assert_eq!(count(family, 256).total(), total, "{family:?}");
    }
    // HAARES adds < 0.01% over Block AttnRes (sec:efficiency): one detail bias per read site.
    let block =
        parameter_count(&ModelFamily::Medium.config(48, 256, ResidualMethod::BlockAttnRes)).total();
    let haares = count(ModelFamily::Medium, 256).total();
    assert_eq!(haares - block, 96);
    assert!(((haares - block) as f64 / block as f64) < 1e-4);
}

#[test]
fn analytic_counts_equal_the_built_models() {
    for method in all_methods() {
        for (layers, blocks) in [(2, 2), (3, 3)] {
            let config = tiny_config(method, layers, blocks);
            let model = config.init::<B64>(&Default::default()).unwrap();
            assert_eq!(
                parameter_count(&config).total(),
                model.num_params(),
                "{}",
                method.name()
            );
        }
    }
    let fixed = tiny_config(
        ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(-2.0)),
        2,
        2,
    );
    let learned = tiny_config(ResidualMethod::haares(), 2, 2);
    assert_eq!(
        parameter_count(&learned).total() - parameter_count(&fixed).total(),
        4,
        "a fixed bias is not a parameter"
    );
}

#[test]
fn break_even_is_24_7k_of_30k_steps_at_14_over_17() {
    let steps = break_even_steps(30_000.0, 14_000.0, 17_000.0);
    assert_eq!((steps / 100.0).round() / 10.0, 24.7);
}
