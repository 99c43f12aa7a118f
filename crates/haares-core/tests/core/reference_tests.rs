//! Every method's module matches the f64 reference forward pass (`reference.rs`) to 1e-9.

use std::collections::HashMap;

use haares_core::ResidualMethod;

use crate::common::*;
use crate::reference::reference_logits;

fn check_against_reference(n_layers: usize, blocks: usize) {
    let mut rng = Rng::new(1000 + 10 * n_layers as u64 + blocks as u64);
    for (i, method) in all_methods().into_iter().enumerate() {
        let config = tiny_config(method, n_layers, blocks);
        let params = random_params(&config, rng.next_u64());
        let tokens = random_tokens(&mut rng, 2, 7, config.vocab_size);
        let expected = reference_logits(&config, &params, &tokens);
        let actual = logits(&model_from(&config, &params), &tokens);
        let scale = expected.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(
            scale > 0.1,
            "{i}: logits are too small to make the comparison meaningful"
        );
        let diff = max_abs_diff(&expected, &actual);
        assert!(
            diff < 1e-9,
            "{} (L = {n_layers}, N = {blocks}): max |module − reference| = {diff:e}",
            config.method.name()
        );
    }
}

#[test]
fn every_method_matches_the_reference_with_even_blocks() {
    check_against_reference(4, 2); // m = 4: k = 2, the contrast appears at r = 4
}

#[test]
fn every_method_matches_the_reference_with_odd_blocks() {
    check_against_reference(3, 2); // m = 3: the early half takes the extra event
}

#[test]
fn every_method_matches_the_reference_with_single_event_blocks() {
    check_against_reference(2, 4); // m = 1: no active pair is ever visible
}

#[test]
fn reference_distinguishes_the_methods() {
    // Guards the reference itself: with the same weights, HAARES and Block AttnRes must differ,
    // otherwise the detail path would not be exercised by the comparisons above.
    let haares = tiny_config(ResidualMethod::haares(), 4, 2);
    let params = random_params(&haares, 5);
    let tokens = random_tokens(&mut Rng::new(6), 1, 6, haares.vocab_size);
    let block = tiny_config(ResidualMethod::BlockAttnRes, 4, 2);
    let block_params: HashMap<_, _> = params
        .iter()
        .filter(|(name, _)| !name.ends_with("detail_bias"))
        .map(|(n, d)| (n.clone(), d.clone()))
        .collect();
    let diff = max_abs_diff(
        &reference_logits(&haares, &params, &tokens),
        &reference_logits(&block, &block_params, &tokens),
    );
    assert!(
        diff > 1e-3,
        "HAARES and Block AttnRes coincide (diff {diff:e})"
    );
}

/// TF32 keeps an f32's sign, its 8 exponent bits and the top 10 of its 23 mantissa bits: one unit
/// in the last place of 1.0 is 2⁻¹⁰. The emulated products feed the CUDA tolerance's calibration
/// (`tests/portability.rs`), so the rounding itself is checked against the format.
#[test]
fn tf32_operands_keep_ten_mantissa_bits() {
    use crate::reference::Products;
    let ulp = 2f64.powi(-10);
    let nearest = Products::Tf32 { truncate: false };
    let truncated = Products::Tf32 { truncate: true };
    let cases = [
        // (x, rounded to nearest with ties to even, truncated)
        (1.0 + ulp, 1.0 + ulp, 1.0 + ulp),
        (1.0 + ulp / 2.0, 1.0, 1.0), // a tie, down to the even 1.0
        (1.0 + 1.5 * ulp, 1.0 + 2.0 * ulp, 1.0 + ulp), // a tie, up to the even 1 + 2 ulp
        (1.0 + 0.75 * ulp, 1.0 + ulp, 1.0),
        (-(3.0 + 0.75 * 2.0 * ulp), -(3.0 + 2.0 * ulp), -3.0), // ulp 2⁻⁹ in [2, 4)
        (0.1, 0.0999755859375, 0.0999755859375), // 0.1 = 1.6 · 2⁻⁴: mantissa 0.6 · 2¹⁰ = 614.4
    ];
    for (x, want_nearest, want_truncated) in cases {
        assert_eq!(nearest.dot(&[x], &[1.0]), want_nearest, "{x} to nearest");
        assert_eq!(truncated.dot(&[x], &[1.0]), want_truncated, "{x} truncated");
    }
    assert_eq!(Products::Exact.dot(&[0.1], &[3.0]), 0.1 * 3.0);
    assert!(nearest.dot(&[f64::NAN], &[1.0]).is_nan());
    assert_eq!(nearest.dot(&[f64::NEG_INFINITY], &[1.0]), f64::NEG_INFINITY);
}
