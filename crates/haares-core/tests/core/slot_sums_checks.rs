//! The slot sums' checks (`ops::routing::sums`), generic over the backend: the backend's row dots,
//! weighted sums and totals, and scaled rows added to an accumulated gradient, and the reference
//! (the plain tensor operations), against f64 host sums on fresh random inputs — one slot to
//! several launches' worth, widths below, between and above a cube's thread count, a row shared
//! by all tokens and one per token, strided (transposed, narrowed) slots, with and without an
//! accumulated gradient. `portability.rs` runs them on NdArray f32, Flex and the cube backends'
//! kernels; `core/slot_sums.rs` checks the CPU loops against the reference in f64 too.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use haares_core::HaaresBackend;
use haares_core::ops::routing::sums::naive;

use super::common::{
    Rng, assert_close_at_scale, max_abs_diff, random_matrix, random_slot_views, tensor_values,
};

pub const SLOT_COUNTS: [usize; 5] = [1, 3, 16, 17, 40];

/// (tokens, d): a single number, widths that do not divide the thread count, several strides.
/// The last has more tokens than a column sum of the query's gradients has threads.
pub const SHAPES: [(usize, usize); 4] = [(1, 1), (37, 70), (130, 256), (300, 33)];

/// (tokens, d): a single number, a width that does not divide a cube, a wide one.
const ROW_SHAPES: [(usize, usize); 3] = [(1, 1), (37, 70), (130, 256)];

/// The kernels round each element as the tensor operations do (one product, one addition, one
/// reduction); this leaves room only for the reduction's order.
const TOLERANCE: f64 = 1e-5;

/// Checks both implementations against the same sum in f64 on the host: the kernel to f32
/// rounding, the plain primitive loosely, since Burn may run its matrix products in TF32
/// (CUDA). A layout bug in either shows as an error of the order of the scale.
fn assert_both_right<B: Backend, const D: usize>(
    kernel: Tensor<B, D>,
    plain: Tensor<B, D>,
    expected: Vec<f64>,
    what: String,
) {
    let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (name, actual, tolerance) in [("kernel", kernel, 1e-5), ("plain primitive", plain, 1e-2)] {
        assert_eq!(
            actual.dims().iter().product::<usize>(),
            expected.len(),
            "{what}: {name} shape"
        );
        let diff = max_abs_diff(&tensor_values(actual), &expected);
        assert!(
            diff < tolerance * scale,
            "{what}: max |{name} − f64 sum| = {diff:e} (scale {scale:.2})"
        );
    }
}

/// `Σ_k slot[n, k] · row[n or 0, k]` per slot and token, in f64: `[S, tokens]` row-major.
fn host_row_dots<B: Backend>(slots: &[Tensor<B, 2>], rows: &Tensor<B, 2>) -> Vec<f64> {
    let [shared, d] = rows.dims();
    let rows = tensor_values(rows.clone());
    let row = |n: usize| &rows[if shared == 1 { 0 } else { n * d }..][..d];
    slots
        .iter()
        .flat_map(|slot| {
            let values = tensor_values(slot.clone());
            let tokens = values.len() / d;
            (0..tokens)
                .map(|n| (0..d).map(|k| values[n * d + k] * row(n)[k]).sum::<f64>())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `Σ_s weights[s, n] · slot_s[n, k]` in f64: `[tokens, d]` row-major.
fn host_weighted_sum<B: Backend>(slots: &[Tensor<B, 2>], weights: &Tensor<B, 2>) -> Vec<f64> {
    let [_, tokens] = weights.dims();
    let weights = tensor_values(weights.clone());
    let mut sum = vec![0.0; slots[0].dims().iter().product()];
    for (slot, values) in slots.iter().enumerate() {
        let values = tensor_values(values.clone());
        let d = values.len() / tokens;
        for (index, value) in values.iter().enumerate() {
            sum[index] += weights[slot * tokens + index / d] * value;
        }
    }
    sum
}

/// `into + (factor · column[n]) · row[n or 0, k]` in f64, `[tokens, d]` row-major.
pub fn host_add_scaled(
    into: Option<&[f64]>,
    column: &[f64],
    rows: &[f64],
    d: usize,
    factor: f64,
) -> Vec<f64> {
    let shared = rows.len() == d;
    (0..column.len() * d)
        .map(|i| {
            let (n, k) = (i / d, i % d);
            let row = rows[if shared { k } else { n * d + k }];
            into.map_or(0.0, |into| into[i]) + factor * column[n] * row
        })
        .collect()
}

pub fn row_dots_match<B: HaaresBackend>() {
    let mut rng = Rng::new(2024);
    for count in SLOT_COUNTS {
        for (tokens, d) in SHAPES {
            let slots = random_slot_views::<B>(&mut rng, count, tokens, d);
            for shared in [true, false] {
                let rows = random_matrix(&mut rng, [if shared { 1 } else { tokens }, d]);
                assert_both_right(
                    B::row_dots(&slots, rows.clone()),
                    naive::row_dots(&slots, rows.clone()),
                    host_row_dots(&slots, &rows),
                    format!("row_dots, S = {count}, {tokens} × {d}, shared row {shared}"),
                );
            }
        }
    }
}

pub fn weighted_sums_match<B: HaaresBackend>() {
    let mut rng = Rng::new(2025);
    for count in SLOT_COUNTS {
        for (tokens, d) in SHAPES {
            let slots = random_slot_views::<B>(&mut rng, count, tokens, d);
            // The weights as a strided view: the right half of a wider tensor.
            let weights = random_matrix(&mut rng, [count, 2 * tokens]).narrow(1, tokens, tokens);
            let sum = host_weighted_sum(&slots, &weights);
            let total: Vec<f64> = (0..d)
                .map(|k| (0..tokens).map(|n| sum[n * d + k]).sum())
                .collect();
            assert_both_right(
                B::weighted_sum(&slots, weights.clone()),
                naive::weighted_sum(&slots, weights.clone()),
                sum,
                format!("weighted_sum, S = {count}, {tokens} × {d}"),
            );
            assert_both_right(
                B::weighted_total(&slots, weights.clone()),
                naive::weighted_total(&slots, weights.clone()),
                total,
                format!("weighted_total, S = {count}, {tokens} × {d}"),
            );
        }
    }
}

pub fn added_scaled_rows_match<B: HaaresBackend>() {
    let mut rng = Rng::new(2027);
    let count = 4;
    for (tokens, d) in ROW_SHAPES {
        // The columns as a strided view: the right half of a wider tensor.
        let columns: Tensor<B, 2> =
            random_matrix(&mut rng, [count, 2 * tokens]).narrow(1, tokens, tokens);
        let column_values = tensor_values(columns.clone());
        let into: Vec<Option<Tensor<B, 2>>> = random_slot_views::<B>(&mut rng, count, tokens, d)
            .into_iter()
            .enumerate()
            .map(|(slot, earlier)| (slot % 2 == 0).then_some(earlier))
            .collect();
        let wanted: Vec<bool> = (0..count).map(|slot| slot != 1).collect();
        for shared in [true, false] {
            let rows: Tensor<B, 2> = random_matrix(&mut rng, [if shared { 1 } else { tokens }, d]);
            let row_values = tensor_values(rows.clone());
            let sums = B::add_scaled_rows(into.clone(), columns.clone(), rows, &wanted);
            for (slot, sum) in sums.into_iter().enumerate() {
                let what = format!("add_scaled_rows, slot {slot}, {tokens} × {d}, shared {shared}");
                let Some(sum) = sum else {
                    assert!(!wanted[slot], "{what}: a wanted slot has no gradient");
                    continue;
                };
                assert!(wanted[slot], "{what}: an unwanted slot has a gradient");
                let earlier = into[slot].clone().map(tensor_values);
                let column = &column_values[slot * tokens..][..tokens];
                let expected = host_add_scaled(earlier.as_deref(), column, &row_values, d, 1.0);
                assert_close_at_scale(&tensor_values(sum), &expected, TOLERANCE, &what);
            }
        }
    }
}
