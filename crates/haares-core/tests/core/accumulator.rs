//! The online accumulator against the closed forms of eq:partial, eq:onlinehalves, eq:bases,
//! the read timing of tab:timing, the permutation proposition and eq:inverse.

use burn::tensor::{Tensor, TensorData};
use haares_core::accumulator::{BlockAccumulator, half_split_sign, random_signs, recover_halves};

use crate::common::*;

const D: usize = 6;

fn outputs(rng: &mut Rng, m: usize) -> Vec<Vec<f64>> {
    (0..m).map(|_| rng.normals(2 * D, 1.0)).collect()
}

fn tensor(values: &[f64]) -> Tensor<B64, 2> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [2, D]),
        &Default::default(),
    )
}

fn sum(rows: &[Vec<f64>], coefficient: impl Fn(usize) -> f64) -> Vec<f64> {
    let mut total = vec![0.0; 2 * D];
    for (t, row) in rows.iter().enumerate() {
        for (acc, v) in total.iter_mut().zip(row) {
            *acc += coefficient(t + 1) * v;
        }
    }
    total
}

/// Writes `us` in order with the half-split signs and returns the final raw pair.
fn accumulate(us: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
    let mut acc = BlockAccumulator::<B64, 2>::new();
    for (t, u) in us.iter().enumerate() {
        acc.write(tensor(u), half_split_sign(t + 1, us.len()));
    }
    let (c, d) = acc.take().unwrap();
    (tensor_values(c), tensor_values(d.unwrap()))
}

#[test]
fn signs_split_at_the_ceiling_half() {
    // k = ⌈m/2⌉: the early half takes the extra event for odd m.
    let signs = |m: usize| (1..=m).map(|r| half_split_sign(r, m)).collect::<Vec<_>>();
    assert_eq!(signs(1), [1.0]);
    assert_eq!(signs(2), [1.0, -1.0]);
    assert_eq!(signs(5), [1.0, 1.0, 1.0, -1.0, -1.0]);
    assert_eq!(signs(6), [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]);
}

#[test]
fn accumulator_equals_the_closed_forms_at_every_event() {
    let mut rng = Rng::new(11);
    for m in [1, 2, 3, 4, 5, 6, 24] {
        let us = outputs(&mut rng, m);
        let k = m.div_ceil(2);
        let mut acc = BlockAccumulator::<B64, 2>::new();
        assert!(
            acc.cumulative().is_none() && acc.detail().is_none(),
            "starts at zero"
        );
        for r in 1..=m {
            acc.write(tensor(&us[r - 1]), half_split_sign(r, m));
            assert_eq!(acc.writes(), r);
            // eq:partial after r writes.
            let c = sum(&us[..r], |_| 1.0);
            let d = sum(&us[..r], |t| if t <= k { 1.0 } else { -1.0 });
            assert!(
                max_abs_diff(&tensor_values(acc.cumulative().unwrap().clone()), &c) < 1e-12,
                "C, m = {m}, r = {r}"
            );
            assert!(
                max_abs_diff(&tensor_values(acc.detail().unwrap().clone()), &d) < 1e-12,
                "D, m = {m}, r = {r}"
            );
            // eq:onlinehalves: C = E + F_j, D = E − F_j once the early half is complete.
            if r >= k {
                let early = sum(&us[..k], |_| 1.0);
                let late = sum(&us[k..r], |_| 1.0);
                let c_expected: Vec<f64> = early.iter().zip(&late).map(|(e, f)| e + f).collect();
                let d_expected: Vec<f64> = early.iter().zip(&late).map(|(e, f)| e - f).collect();
                assert!(
                    max_abs_diff(&c, &c_expected) < 1e-12 && max_abs_diff(&d, &d_expected) < 1e-12
                );
            }
        }
        let (c, d) = acc.take().unwrap();
        assert!(
            acc.cumulative().is_none() && acc.writes() == 0,
            "take() resets the block"
        );
        // eq:bases at the boundary.
        let (e, f) = (sum(&us[..k], |_| 1.0), sum(&us[k..], |_| 1.0));
        let c_expected: Vec<f64> = e.iter().zip(&f).map(|(e, f)| e + f).collect();
        let d_expected: Vec<f64> = e.iter().zip(&f).map(|(e, f)| e - f).collect();
        assert!(max_abs_diff(&tensor_values(c), &c_expected) < 1e-12);
        assert!(max_abs_diff(&tensor_values(d.unwrap()), &d_expected) < 1e-12);
    }
}

/// The early-half detail is stored as the cumulative tensor itself, and only there: any other
/// sign history keeps a detail of its own with the value of eq:partial.
#[test]
fn the_detail_shares_the_cumulative_tensor_exactly_while_every_sign_is_plus_one() {
    let mut rng = Rng::new(14);
    let signs_cases: [&[f64]; 4] = [
        &[1.0, 1.0, 1.0, -1.0, -1.0, -1.0],
        &[-1.0, 1.0, 1.0],
        &[1.0, -1.0, 1.0, -1.0],
        &[1.0],
    ];
    for signs in signs_cases {
        let us = outputs(&mut rng, signs.len());
        let mut acc = BlockAccumulator::<B64, 2>::new();
        let mut all_plus = true;
        for (r, (u, &sign)) in us.iter().zip(signs).enumerate() {
            acc.write(tensor(u), sign);
            all_plus &= sign == 1.0;
            assert_eq!(
                acc.detail_is_cumulative(),
                all_plus,
                "signs {signs:?} after {} writes",
                r + 1
            );
            let d = sum(&us[..=r], |t| signs[t - 1]);
            assert!(
                max_abs_diff(&tensor_values(acc.detail().unwrap().clone()), &d) < 1e-12,
                "D, signs {signs:?}, r = {}",
                r + 1
            );
        }
        let (c, d) = acc.take().unwrap();
        let d_expected = sum(&us, |t| signs[t - 1]);
        assert!(max_abs_diff(&tensor_values(d.unwrap()), &d_expected) < 1e-12);
        assert!(max_abs_diff(&tensor_values(c), &sum(&us, |_| 1.0)) < 1e-12);
        assert!(!acc.detail_is_cumulative(), "take() resets the detail");
    }
    // A signed write after cumulative-only writes starts the detail from zero, not from C.
    let us = outputs(&mut rng, 2);
    let mut acc = BlockAccumulator::<B64, 2>::new();
    acc.write_cumulative(tensor(&us[0]));
    acc.write(tensor(&us[1]), 1.0);
    assert!(!acc.detail_is_cumulative());
    assert!(max_abs_diff(&tensor_values(acc.detail().unwrap().clone()), &us[1]) < 1e-12);
}

#[test]
fn read_timing_follows_tab_timing() {
    let m = 6;
    let k = 3;
    let mut rng = Rng::new(12);
    let us = outputs(&mut rng, 2 * m);
    let mut acc = BlockAccumulator::<B64, 2>::new();
    let mut before = Vec::new(); // (C, D) visible before each event of block 1
    for r in 1..=m {
        before.push((
            acc.cumulative().map(|c| tensor_values(c.clone())),
            acc.detail().map(|d| tensor_values(d.clone())),
        ));
        acc.write(tensor(&us[r - 1]), half_split_sign(r, m));
    }
    // r = 1: no active slots.
    assert_eq!(before[0], (None, None));
    // r = 2: the two raw values coincide (u_{1,1}).
    assert_eq!(before[1].0.as_ref().unwrap(), &us[0]);
    assert_eq!(before[1].1.as_ref().unwrap(), &us[0]);
    // r = k + 1: early half complete, still C = D = E.
    let e = sum(&us[..k], |_| 1.0);
    assert!(max_abs_diff(before[k].0.as_ref().unwrap(), &e) < 1e-12);
    assert!(max_abs_diff(before[k].1.as_ref().unwrap(), &e) < 1e-12);
    // r = k + 2: first contrast, C = E + u_{k+1}, D = E − u_{k+1}.
    let plus: Vec<f64> = e.iter().zip(&us[k]).map(|(a, b)| a + b).collect();
    let minus: Vec<f64> = e.iter().zip(&us[k]).map(|(a, b)| a - b).collect();
    assert!(max_abs_diff(before[k + 1].0.as_ref().unwrap(), &plus) < 1e-12);
    assert!(max_abs_diff(before[k + 1].1.as_ref().unwrap(), &minus) < 1e-12);
    // Block 2, r = 1: reset to zero.
    acc.take();
    assert!(acc.cumulative().is_none() && acc.detail().is_none());
}

#[test]
fn within_half_swaps_change_nothing_and_a_cross_swap_moves_d_by_twice_the_difference() {
    let mut rng = Rng::new(13);
    let m = 6;
    let us = outputs(&mut rng, m);
    let (c, d) = accumulate(&us);
    let mut early_swap = us.clone();
    early_swap.swap(0, 2);
    let mut late_swap = us.clone();
    late_swap.swap(3, 5);
    for permuted in [early_swap, late_swap] {
        let (c2, d2) = accumulate(&permuted);
        assert!(max_abs_diff(&c, &c2) < 1e-12 && max_abs_diff(&d, &d2) < 1e-12);
    }
    // Exchange early v = u_2 with late w = u_5.
    let (v, w) = (us[1].clone(), us[4].clone());
    let mut cross = us.clone();
    cross.swap(1, 4);
    let (c3, d3) = accumulate(&cross);
    assert!(max_abs_diff(&c, &c3) < 1e-12, "C is permutation-invariant");
    let expected: Vec<f64> = d
        .iter()
        .zip(v.iter().zip(&w))
        .map(|(d, (v, w))| d + 2.0 * (w - v))
        .collect();
    assert!(max_abs_diff(&d3, &expected) < 1e-12);
    assert!(
        max_abs_diff(&d, &d3) > 1e-3,
        "the cross swap is visible in D"
    );
}

#[test]
fn half_totals_are_recovered_exactly() {
    let mut rng = Rng::new(14);
    for m in [2, 5, 8] {
        let us = outputs(&mut rng, m);
        let k = m.div_ceil(2);
        let (c, d) = accumulate(&us);
        let (e, f) = recover_halves(tensor(&c), tensor(&d));
        assert!(max_abs_diff(&tensor_values(e), &sum(&us[..k], |_| 1.0)) < 1e-12);
        assert!(max_abs_diff(&tensor_values(f), &sum(&us[k..], |_| 1.0)) < 1e-12);
    }
    // eq:example: (E, F) = (3a, −2a) and (a, 0) share C = a, with D = 5a and a.
    let a = [0.5, -1.0, 2.0, 0.0, 1.5, -0.25];
    let scaled = |s: f64| -> Vec<f64> { a.iter().chain(a.iter()).map(|v| v * s).collect() };
    let (c1, d1) = accumulate(&[scaled(3.0), scaled(-2.0)]);
    let (c2, d2) = accumulate(&[scaled(1.0), scaled(0.0)]);
    assert!(max_abs_diff(&c1, &c2) < 1e-12);
    assert!(max_abs_diff(&d1, &scaled(5.0)) < 1e-12 && max_abs_diff(&d2, &scaled(1.0)) < 1e-12);
}

#[test]
fn random_signs_are_fixed_by_their_seed() {
    let a = random_signs(0, 4, 24);
    assert_eq!(a, random_signs(0, 4, 24), "same seed, same pattern");
    assert_ne!(a, random_signs(1, 4, 24), "another seed, another pattern");
    let flat: Vec<f64> = a.iter().flatten().copied().collect();
    assert!(flat.iter().all(|s| *s == 1.0 || *s == -1.0));
    let positives = flat.iter().filter(|s| **s > 0.0).count();
    assert!(
        (24..=72).contains(&positives),
        "96 fair signs should not give {positives} positives"
    );
    let half_split: Vec<f64> = (1..=24).map(|r| half_split_sign(r, 24)).collect();
    assert!(
        a.iter().all(|block| *block != half_split),
        "random signs are not the half split"
    );
}
