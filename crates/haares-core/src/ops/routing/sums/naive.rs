//! The slot sums in plain tensor operations: the reference for every loop and kernel of
//! [`super`].

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// [`SlotSumsBackend::row_dots`](super::SlotSumsBackend::row_dots) with Burn tensor operations:
/// one matrix–vector product per slot for a shared row, one product and row sum otherwise.
pub fn row_dots<B: Backend>(slots: &[Tensor<B, 2>], rows: Tensor<B, 2>) -> Tensor<B, 2> {
    let [shared, d_model] = rows.dims();
    let dots = slots
        .iter()
        .map(|slot| {
            let tokens = slot.dims()[0];
            let dots = if shared == 1 {
                slot.clone().matmul(rows.clone().reshape([d_model, 1]))
            } else {
                (slot.clone() * rows.clone()).sum_dim(1)
            };
            dots.reshape([1, tokens])
        })
        .collect();
    Tensor::cat(dots, 0)
}

/// [`SlotSumsBackend::weighted_sum`](super::SlotSumsBackend::weighted_sum) with Burn tensor
/// operations, one slot at a time.
pub fn weighted_sum<B: Backend>(slots: &[Tensor<B, 2>], weights: Tensor<B, 2>) -> Tensor<B, 2> {
    slots
        .iter()
        .enumerate()
        .map(|(slot, rows)| {
            let tokens = rows.dims()[0];
            rows.clone() * crate::ops::routing::slot_column(&weights, slot, tokens)
        })
        .reduce(|sum, term| sum + term)
        .expect("a read has at least one slot")
}

/// [`SlotSumsBackend::add_scaled_rows`](super::SlotSumsBackend::add_scaled_rows) from the
/// products: each added to its `into` entry where there is one.
pub fn add_scaled_rows<B: Backend>(
    products: Vec<Option<Tensor<B, 2>>>,
    into: Vec<Option<Tensor<B, 2>>>,
) -> Vec<Option<Tensor<B, 2>>> {
    products
        .into_iter()
        .zip(into)
        .map(|(product, into)| match (product, into) {
            (Some(product), Some(into)) => Some(into + product),
            (product, _) => product,
        })
        .collect()
}

/// [`SlotSumsBackend::weighted_total`](super::SlotSumsBackend::weighted_total) with Burn tensor
/// operations: one vector–matrix product per slot.
pub fn weighted_total<B: Backend>(slots: &[Tensor<B, 2>], weights: Tensor<B, 2>) -> Tensor<B, 1> {
    let d_model = slots[0].dims()[1];
    slots
        .iter()
        .enumerate()
        .map(|(slot, rows)| weights.clone().narrow(0, slot, 1).matmul(rows.clone()))
        .reduce(|sum, term| sum + term)
        .expect("a read has at least one slot")
        .reshape([d_model])
}

/// [`SlotSumsBackend::scaled_rows`](super::SlotSumsBackend::scaled_rows) with Burn tensor
/// operations: one broadcast product per wanted slot.
pub fn scaled_rows<B: Backend>(
    columns: Tensor<B, 2>,
    rows: Tensor<B, 2>,
    wanted: &[bool],
) -> Vec<Option<Tensor<B, 2>>> {
    let tokens = columns.dims()[1];
    wanted
        .iter()
        .enumerate()
        .map(|(slot, &wanted)| {
            wanted.then(|| crate::ops::routing::slot_column(&columns, slot, tokens) * rows.clone())
        })
        .collect()
}
