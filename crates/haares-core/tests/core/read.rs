//! The whole read as one operation (`ops::routing::read`): Flex's token-by-token loops against
//! the composition of the two operations (`naive::compose`, `naive::compose_backward`), with
//! and without a bias, scaled and plain slots, a gradient on the weights or none, and slot
//! gradients added into nothing, into one held only by the call (updated in place) and into one
//! also held elsewhere (left unchanged); and slots that read the same rows (HAARES's early-half
//! detail), whose gradient the loops may form once, in the first slot's entry.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use haares_core::SlotRows;
use haares_core::ops::RoutingBackend;
use haares_core::ops::routing::read::{ReadBackward, ReadBias, ReadQuery, naive};

use crate::common::{Rng, max_abs_diff, tensor_values};

/// A read's shape: slots, tokens, d, and the slots `(first, later)` whose later one reads the
/// first one's rows (with its own scale and mean square).
type Case = (usize, usize, usize, &'static [(usize, usize)]);

/// One slot, a Block AttnRes and a HAARES bank, a width with a SIMD remainder, and a width whose
/// tokens span three of the loops' tasks (8 tokens each at d = 2048), the last one partial. Shared
/// rows: 1 → 6 take one gradient (both wanted, 6 brings none of its own); 2 → 4 may not (4 brings
/// an accumulated gradient); 1 → 3 may not (3 wants no gradient).
const CASES: [Case; 5] = [
    (1, 5, 8, &[]),
    (5, 33, 24, &[]),
    (9, 64, 128, &[(1, 6), (2, 4)]),
    (4, 7, 131, &[]),
    (5, 21, 2048, &[(1, 3)]),
];

fn tensor<const D: usize>(values: Vec<f64>, shape: [usize; D]) -> Tensor<Flex, D> {
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

fn random<const D: usize>(rng: &mut Rng, shape: [usize; D]) -> Tensor<Flex, D> {
    tensor(rng.normals(shape.iter().product(), 1.0), shape)
}

/// Positive per-token columns (mean squares, RMS-matching scales) around `centre`.
fn positive(rng: &mut Rng, tokens: usize, centre: f64) -> Tensor<Flex, 2> {
    let values = (0..tokens)
        .map(|_| centre * (0.5 + rng.uniform()))
        .collect();
    tensor(values, [tokens, 1])
}

fn assert_agree<const D: usize>(fused: Tensor<Flex, D>, plain: Tensor<Flex, D>, what: &str) {
    assert_eq!(fused.dims(), plain.dims(), "{what}: shapes differ");
    let (fused, plain) = (tensor_values(fused), tensor_values(plain));
    let scale = plain.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(&fused, &plain);
    assert!(
        diff <= 1e-5 * scale,
        "{what}: max difference {diff:e} at scale {scale:.2}"
    );
}

fn slots(rng: &mut Rng, case: Case) -> Vec<SlotRows<Flex>> {
    let (count, tokens, d, shared) = case;
    let mut slots: Vec<_> = (0..count)
        .map(|slot| SlotRows {
            raw: random(rng, [tokens, d]),
            scale: (slot % 3 == 2).then(|| positive(rng, tokens, 0.7)),
            mean_square: positive(rng, tokens, 1.0),
        })
        .collect();
    for &(first, later) in shared {
        slots[later].raw = slots[first].raw.clone();
    }
    slots
}

/// For each slot, the first slot that reads its rows.
fn same_rows(case: Case) -> Vec<usize> {
    let (count, _, _, shared) = case;
    let first_of = |slot| shared.iter().find(|&&(_, later)| later == slot);
    (0..count)
        .map(|slot| first_of(slot).map_or(slot, |&(first, _)| first))
        .collect()
}

#[test]
fn flex_reads_agree_with_the_composition() {
    let mut rng = Rng::new(515);
    for case in CASES {
        let (count, tokens, d, _) = case;
        for (with_bias, with_weights_grad) in [(true, true), (false, false), (true, false)] {
            let what = |name: &str| {
                format!(
                    "{name}: S = {count}, {tokens} × {d}, bias {with_bias}, ∂α {with_weights_grad}"
                )
            };
            let slots = slots(&mut rng, case);
            let query = ReadQuery {
                query: random(&mut rng, [d]),
                key_weight: random(&mut rng, [d]),
            };
            // Every slot but each third from the second takes the bias (the first always does).
            let biased_slots: Vec<bool> = (0..count).map(|slot| slot % 3 != 1).collect();
            let bias = with_bias.then(|| ReadBias {
                value: random(&mut rng, [1]),
                slots: biased_slots.clone(),
            });
            let fused = Flex::routing_read_forward(&slots, &query, bias.as_ref(), 1e-6, None);
            let plain = naive::compose(&slots, &query, bias.as_ref(), 1e-6, None);
            assert_agree(fused.mixture.clone(), plain.mixture, &what("mixture"));
            assert_agree(fused.weights.clone(), plain.weights, &what("weights"));
            assert_agree(fused.scores.clone(), plain.scores, &what("scores"));

            let read = ReadBackward {
                slots,
                query,
                epsilon: 1e-6,
                scores: fused.scores,
                weights: fused.weights,
                mixture_grad: random(&mut rng, [tokens, d]),
                weights_grad: with_weights_grad.then(|| random(&mut rng, [count, tokens])),
                bias_wanted: with_bias,
                biased_slots: if with_bias {
                    biased_slots
                } else {
                    vec![false; count]
                },
                fold_mean_squares: false,
                same_rows: same_rows(case),
                norm: None,
            };
            // Slot `s` adds into: nothing (s % 3 = 0), a gradient held only by the call, or one
            // also held here; every fourth slot wants no gradient.
            let accumulated: Vec<_> = (0..count).map(|_| rng.normals(tokens * d, 1.0)).collect();
            let into = |shared: &mut Vec<Tensor<Flex, 2>>| -> Vec<Option<Tensor<Flex, 2>>> {
                (0..count)
                    .map(|slot| match slot % 3 {
                        0 => None,
                        1 => Some(tensor(accumulated[slot].clone(), [tokens, d])),
                        _ => {
                            let held = tensor(accumulated[slot].clone(), [tokens, d]);
                            shared.push(held.clone());
                            Some(held)
                        }
                    })
                    .collect()
            };
            let wanted: Vec<bool> = (0..count).map(|slot| slot % 4 != 3).collect();
            let mean_squares_wanted: Vec<bool> = (0..count).map(|slot| slot % 2 == 0).collect();
            let mut held = vec![];
            let fused = Flex::routing_read_backward(
                read.clone(),
                into(&mut held),
                &wanted,
                &mean_squares_wanted,
            );
            let plain =
                naive::compose_backward(read, into(&mut vec![]), &wanted, &mean_squares_wanted);
            // Rows shared with an earlier slot take one gradient, in the earlier slot's entry,
            // where both want one and the later one adds into nothing (s % 3 = 0).
            let mut plain_raws = plain.raws;
            let mut merged = vec![false; count];
            for (slot, first) in same_rows(case).into_iter().enumerate() {
                if first < slot && wanted[first] && wanted[slot] && slot % 3 == 0 {
                    let later = plain_raws[slot].take().expect("a wanted slot's gradient");
                    plain_raws[first] = plain_raws[first].take().map(|grad| grad + later);
                    merged[slot] = true;
                }
            }
            for (slot, (fused, plain)) in fused.raws.into_iter().zip(plain_raws).enumerate() {
                match (fused, plain) {
                    (Some(fused), Some(plain)) => assert_agree(fused, plain, &what("∂raw")),
                    (None, None) => assert!(
                        !wanted[slot] || merged[slot],
                        "{}",
                        what("a wanted ∂raw missing")
                    ),
                    _ => panic!("{}", what("∂raw answered against `wanted`")),
                }
            }
            let mean_squares = fused.mean_squares.into_iter().zip(plain.mean_squares);
            for (slot, (fused, plain)) in mean_squares.enumerate() {
                match (fused, plain) {
                    (Some(fused), Some(plain)) => assert_agree(fused, plain, &what("∂m")),
                    (None, None) => assert!(!mean_squares_wanted[slot], "{}", what("∂m missing")),
                    _ => panic!("{}", what("∂m answered against `wanted`")),
                }
            }
            assert_agree(fused.query.query, plain.query.query, &what("∂q"));
            let (fused_key, plain_key) = (fused.query.key_weight, plain.query.key_weight);
            assert_agree(fused_key, plain_key, &what("∂w"));
            match (fused.bias, plain.bias) {
                (Some(fused), Some(plain)) => assert_agree(fused, plain, &what("∂b")),
                (None, None) => assert!(!with_bias, "{}", what("a wanted ∂b missing")),
                _ => panic!("{}", what("∂b answered against `bias_wanted`")),
            }
            for (held, slot) in held.into_iter().zip((2..count).step_by(3)) {
                let before = tensor_values(tensor(accumulated[slot].clone(), [tokens, d]));
                let unchanged = max_abs_diff(&tensor_values(held), &before) == 0.0;
                assert!(
                    unchanged,
                    "{}",
                    what("a gradient held elsewhere was written")
                );
            }
        }
    }
}
