//! RMS matching (eq:rmsmatch): clip bounds, degenerate cases, per-token reduction, and the
//! stop-gradient through the multiplier.

use burn::tensor::{Tensor, TensorData};
use haares_core::rms_match::rms_match;

use crate::common::*;

const GAMMA: f64 = 4.0;
const EPS: f64 = 1e-6;

fn t(values: Vec<f64>, shape: [usize; 3]) -> Tensor<B64, 3> {
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64).sqrt()
}

#[test]
fn multiplier_moves_toward_c_within_the_clip_bounds() {
    let mut rng = Rng::new(21);
    let d = rng.normals(8, 1.0);
    for (ratio, expected_multiplier) in [
        (10.0, GAMMA),
        (0.01, 1.0 / GAMMA),
        (2.0, 2.0 * rms(&d) / (rms(&d) + EPS)),
        (1.0, rms(&d) / (rms(&d) + EPS)),
    ] {
        let c: Vec<f64> = rng.normals(8, 1.0);
        let c: Vec<f64> = c.iter().map(|v| v * ratio * rms(&d) / rms(&c)).collect();
        let matched = tensor_values(rms_match(
            t(d.clone(), [1, 1, 8]),
            t(c, [1, 1, 8]),
            GAMMA,
            EPS,
        ));
        let expected: Vec<f64> = d.iter().map(|v| v * expected_multiplier).collect();
        assert!(
            max_abs_diff(&matched, &expected) < 1e-12,
            "RMS ratio {ratio}"
        );
    }
}

#[test]
fn zero_cumulative_gives_a_quarter_and_zero_detail_stays_zero() {
    let mut rng = Rng::new(22);
    let d = rng.normals(8, 1.0);
    let matched = tensor_values(rms_match(
        t(d.clone(), [1, 1, 8]),
        t(vec![0.0; 8], [1, 1, 8]),
        GAMMA,
        EPS,
    ));
    assert!(max_abs_diff(&matched, &d.iter().map(|v| v / 4.0).collect::<Vec<_>>()) < 1e-15);
    let zero = tensor_values(rms_match(
        t(vec![0.0; 8], [1, 1, 8]),
        t(rng.normals(8, 1.0), [1, 1, 8]),
        GAMMA,
        EPS,
    ));
    assert!(zero.iter().all(|v| *v == 0.0 && v.is_finite()));
}

#[test]
fn rms_is_reduced_per_token_over_the_hidden_dimension() {
    // Two positions with opposite ratios get opposite clip bounds: a reduction over positions or
    // the batch would give them one shared multiplier (docs/decisions.md, decision 1).
    let mut rng = Rng::new(23);
    let d = rng.normals(16, 1.0);
    let c: Vec<f64> = d[..8]
        .iter()
        .map(|v| v * 100.0)
        .chain(d[8..].iter().map(|v| v * 0.001))
        .collect();
    let matched = tensor_values(rms_match(
        t(d.clone(), [1, 2, 8]),
        t(c, [1, 2, 8]),
        GAMMA,
        EPS,
    ));
    let expected: Vec<f64> = d[..8]
        .iter()
        .map(|v| v * 4.0)
        .chain(d[8..].iter().map(|v| v / 4.0))
        .collect();
    assert!(max_abs_diff(&matched, &expected) < 1e-12);
}

#[test]
fn gradient_with_respect_to_d_is_exactly_the_multiplier() {
    let mut rng = Rng::new(24);
    let device = Default::default();
    let (dv, cv, wv) = (
        rng.normals(16, 1.0),
        rng.normals(16, 1.7),
        rng.normals(16, 1.0),
    );
    let d = Tensor::<Ad64, 3>::from_data(TensorData::new(dv.clone(), [1, 2, 8]), &device)
        .require_grad();
    let c = Tensor::<Ad64, 3>::from_data(TensorData::new(cv.clone(), [1, 2, 8]), &device)
        .require_grad();
    let w = Tensor::<Ad64, 3>::from_data(TensorData::new(wv.clone(), [1, 2, 8]), &device);
    let loss = (rms_match(d.clone(), c.clone(), GAMMA, EPS) * w).sum();
    let grads = loss.backward();
    let grad_d = tensor_values(d.grad(&grads).expect("D receives a gradient"));
    // d/dD Σ w ⊙ (a·D) with a detached = a·w, position by position.
    let expected: Vec<f64> = (0..2)
        .flat_map(|p| {
            let a = (rms(&cv[8 * p..8 * p + 8]) / (rms(&dv[8 * p..8 * p + 8]) + EPS))
                .clamp(1.0 / GAMMA, GAMMA);
            wv[8 * p..8 * p + 8]
                .iter()
                .map(move |w| a * w)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(max_abs_diff(&grad_d, &expected) < 1e-12);
    // Nothing flows into C through the multiplier.
    let grad_c = c.grad(&grads).map(tensor_values).unwrap_or_default();
    assert!(
        grad_c.iter().all(|g| *g == 0.0),
        "C got a gradient: {grad_c:?}"
    );
}
