//! The routing operator's primitives on NdArray (loops over its host arrays, `routing_ops/host.rs`)
//! against the plain tensor-operation primitives (`routing_ops::naive`), on fresh random inputs:
//! one slot to many, a row shared by all tokens and one per token, contiguous and strided
//! (transposed, narrowed) inputs, in f64. (Their f32 instances run in `tests/portability.rs`,
//! inside the whole model on the fused path.)

use burn::backend::NdArray;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use haares_core::RoutingBackend;
use haares_core::routing_ops::naive;

use crate::common::{Rng, max_abs_diff, random_matrix, random_slot_views, tensor_values};

const SLOT_COUNTS: [usize; 4] = [1, 2, 5, 17];
/// (tokens, d)
const SHAPES: [(usize, usize); 3] = [(1, 1), (7, 5), (33, 24)];

fn assert_agree<B: Backend>(host: Tensor<B, 2>, plain: Tensor<B, 2>, tolerance: f64, what: &str) {
    assert_eq!(host.dims(), plain.dims(), "{what}: shapes differ");
    let (host, plain) = (tensor_values(host), tensor_values(plain));
    let scale = plain.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(&host, &plain);
    assert!(
        diff <= tolerance * scale,
        "{what}: max |host − plain| = {diff:e} (scale {scale:.2})"
    );
}

fn host_primitives_agree_with_the_plain_ones<B: RoutingBackend>(tolerance: f64) {
    let mut rng = Rng::new(4242);
    for count in SLOT_COUNTS {
        for (tokens, d) in SHAPES {
            let what = |name: &str| format!("{name}, S = {count}, {tokens} × {d}");
            let slots = random_slot_views::<B>(&mut rng, count, tokens, d);
            for shared in [true, false] {
                let rows = random_matrix::<B>(&mut rng, [if shared { 1 } else { tokens }, d]);
                assert_agree(
                    B::row_dots(&slots, rows.clone()),
                    naive::row_dots(&slots, rows.clone()),
                    tolerance,
                    &what(&format!("row_dots (shared row {shared})")),
                );
                let columns =
                    random_matrix::<B>(&mut rng, [count, 2 * tokens]).narrow(1, tokens, tokens);
                let wanted: Vec<bool> = (0..count).map(|slot| slot % 4 != 3).collect();
                let host = B::scaled_rows(columns.clone(), rows.clone(), &wanted);
                let plain = naive::scaled_rows(columns, rows, &wanted);
                for (slot, (host, plain)) in host.into_iter().zip(plain).enumerate() {
                    match (host, plain) {
                        (Some(host), Some(plain)) => {
                            assert_agree(host, plain, tolerance, &what("scaled_rows"))
                        }
                        (None, None) => assert!(!wanted[slot]),
                        _ => panic!(
                            "{}: slot {slot} answered against `wanted`",
                            what("scaled_rows")
                        ),
                    }
                }
            }
            let weights = random_matrix::<B>(&mut rng, [2 * count, tokens]).narrow(0, count, count);
            assert_agree(
                B::weighted_sum(&slots, weights.clone()),
                naive::weighted_sum(&slots, weights),
                tolerance,
                &what("weighted_sum"),
            );
        }
    }
}

#[test]
fn ndarray_f64_primitives_agree_with_the_plain_ones() {
    host_primitives_agree_with_the_plain_ones::<NdArray<f64>>(1e-12);
}
