//! The slot sums (`ops::routing::sums`) on NdArray (loops over its host arrays, `ndarray.rs`)
//! and on Flex (SIMD loops over its buffers, `flex.rs`) against the reference (the plain
//! tensor operations, `sums::naive`) in f64 and f32, on fresh random inputs: one slot to many, a
//! row shared by all tokens and one per token, contiguous slots and strided (transposed,
//! narrowed) ones, gradients added to an accumulated one held alone or shared, and the row mean
//! square built on them. (`slot_sums_checks.rs` checks every backend, the cube backends' kernels
//! among them, against f64 host sums; `tests/portability.rs` runs it.)

use burn::backend::{Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use haares_core::HaaresBackend;
use haares_core::ops::routing::sums::naive;

use crate::common::{Rng, max_abs_diff, random_matrix, random_slot_views, tensor_values};

const SLOT_COUNTS: [usize; 4] = [1, 2, 5, 17];
/// (tokens, d): widths below and past a SIMD vector, with and without a remainder, and tokens
/// enough for several parallel tasks with a remainder (Flex's loops split `16384 / d` tokens per
/// task: 125 at d = 131, so 260 tokens are three tasks, the last of 10).
const SHAPES: [(usize, usize); 5] = [(1, 1), (7, 5), (33, 24), (9, 131), (260, 131)];

fn assert_agree<B: Backend, const D: usize>(
    host: Tensor<B, D>,
    plain: Tensor<B, D>,
    tolerance: f64,
    what: &str,
) {
    assert_eq!(host.dims(), plain.dims(), "{what}: shapes differ");
    let (host, plain) = (tensor_values(host), tensor_values(plain));
    let scale = plain.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let diff = max_abs_diff(&host, &plain);
    assert!(
        diff <= tolerance * scale,
        "{what}: max |host − plain| = {diff:e} (scale {scale:.2})"
    );
}

/// Compares per-slot answers, which must be `None` exactly where the slot was not wanted.
fn assert_slots_agree<B: Backend>(
    host: Vec<Option<Tensor<B, 2>>>,
    plain: Vec<Option<Tensor<B, 2>>>,
    wanted: &[bool],
    tolerance: f64,
    what: &str,
) {
    assert_eq!(host.len(), wanted.len(), "{what}: one answer per slot");
    for (slot, (host, plain)) in host.into_iter().zip(plain).enumerate() {
        match (host, plain) {
            (Some(host), Some(plain)) => assert_agree(host, plain, tolerance, what),
            (None, None) => assert!(!wanted[slot], "{what}: slot {slot} wanted but missing"),
            _ => panic!("{what}: slot {slot} answered against `wanted`"),
        }
    }
}

/// Inputs as a backend's tensors: `prepare` sets the float type under test.
struct Inputs<'a, B: Backend> {
    rng: Rng,
    prepare: &'a dyn Fn(Tensor<B, 2>) -> Tensor<B, 2>,
}

impl<B: Backend> Inputs<'_, B> {
    fn matrix(&mut self, shape: [usize; 2]) -> Tensor<B, 2> {
        (self.prepare)(random_matrix::<B>(&mut self.rng, shape))
    }

    fn slots(&mut self, count: usize, tokens: usize, d: usize, strided: bool) -> Vec<Tensor<B, 2>> {
        if strided {
            let views = random_slot_views::<B>(&mut self.rng, count, tokens, d);
            views.into_iter().map(self.prepare).collect()
        } else {
            (0..count).map(|_| self.matrix([tokens, d])).collect()
        }
    }
}

fn host_primitives_agree_with_the_plain_ones<B: HaaresBackend>(
    tolerance: f64,
    prepare: &dyn Fn(Tensor<B, 2>) -> Tensor<B, 2>,
) {
    let mut inputs = Inputs {
        rng: Rng::new(4242),
        prepare,
    };
    for strided in [true, false] {
        for count in SLOT_COUNTS {
            for (tokens, d) in SHAPES {
                let what = |name: &str| {
                    format!("{name}, S = {count}, {tokens} × {d}, strided slots {strided}")
                };
                let slots = inputs.slots(count, tokens, d, strided);
                for shared in [true, false] {
                    let rows = inputs.matrix([if shared { 1 } else { tokens }, d]);
                    assert_agree(
                        B::row_dots(&slots, rows.clone()),
                        naive::row_dots(&slots, rows.clone()),
                        tolerance,
                        &what(&format!("row_dots (shared row {shared})")),
                    );
                    let columns = match strided {
                        true => inputs.matrix([count, 2 * tokens]).narrow(1, tokens, tokens),
                        false => inputs.matrix([count, tokens]),
                    };
                    let wanted: Vec<bool> = (0..count).map(|slot| slot % 4 != 3).collect();
                    assert_slots_agree(
                        B::scaled_rows(columns.clone(), rows.clone(), &wanted),
                        naive::scaled_rows(columns.clone(), rows.clone(), &wanted),
                        &wanted,
                        tolerance,
                        &what("scaled_rows"),
                    );
                    add_scaled_rows_agrees(&mut inputs, columns, rows, &wanted, tolerance, &what);
                }
                for slot in &slots {
                    assert_agree(
                        B::row_mean_square(slot.clone()),
                        slot.clone().square().mean_dim(1),
                        tolerance,
                        &what("row_mean_square"),
                    );
                }
                let weights = inputs.matrix([2 * count, tokens]).narrow(0, count, count);
                assert_agree(
                    B::weighted_sum(&slots, weights.clone()),
                    naive::weighted_sum(&slots, weights.clone()),
                    tolerance,
                    &what("weighted_sum"),
                );
                assert_agree(
                    B::weighted_total(&slots, weights.clone()),
                    naive::weighted_total(&slots, weights),
                    tolerance,
                    &what("weighted_total"),
                );
            }
        }
    }
}

/// `add_scaled_rows` into nothing, into a gradient held only by the call (which may be updated
/// in place) and into one also held elsewhere (which must be left as it was).
fn add_scaled_rows_agrees<B: HaaresBackend>(
    inputs: &mut Inputs<'_, B>,
    columns: Tensor<B, 2>,
    rows: Tensor<B, 2>,
    wanted: &[bool],
    tolerance: f64,
    what: &dyn Fn(&str) -> String,
) {
    let [count, tokens] = columns.dims();
    let d = rows.dims()[1];
    let into: Vec<Option<Tensor<B, 2>>> = (0..count)
        .map(|slot| (slot % 3 != 0).then(|| inputs.matrix([tokens, d])))
        .collect();
    let held_elsewhere: Vec<Option<Tensor<B, 2>>> = (0..count)
        .map(|slot| into[slot].clone().filter(|_| slot % 3 == 2))
        .collect();
    let before: Vec<Option<Vec<f64>>> = held_elsewhere
        .iter()
        .map(|held| held.clone().map(tensor_values))
        .collect();
    // The plain side gets copies, so that a gradient held only by the call stays so.
    let plain_into = into
        .iter()
        .map(|into| into.as_ref().map(|tensor| tensor.clone().add_scalar(0.0)))
        .collect();
    let plain = naive::add_scaled_rows(
        naive::scaled_rows(columns.clone(), rows.clone(), wanted),
        plain_into,
    );
    let host = B::add_scaled_rows(into, columns, rows, wanted);
    assert_slots_agree(host, plain, wanted, tolerance, &what("add_scaled_rows"));
    for (slot, (held, before)) in held_elsewhere.into_iter().zip(before).enumerate() {
        if let (Some(held), Some(before)) = (held, before) {
            assert_eq!(
                tensor_values(held),
                before,
                "{}: slot {slot}'s accumulated gradient, held elsewhere, was written",
                what("add_scaled_rows")
            );
        }
    }
}

#[test]
fn ndarray_f64_primitives_agree_with_the_plain_ones() {
    host_primitives_agree_with_the_plain_ones::<NdArray<f64>>(1e-12, &|tensor| tensor);
}

#[test]
fn flex_f32_primitives_agree_with_the_plain_ones() {
    host_primitives_agree_with_the_plain_ones::<Flex>(1e-5, &|tensor| tensor);
}

#[test]
fn flex_f64_primitives_agree_with_the_plain_ones() {
    host_primitives_agree_with_the_plain_ones::<Flex>(1e-12, &|tensor| tensor.cast(DType::F64));
}
