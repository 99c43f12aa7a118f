//! The plain tensor-operation primitives: the reference for every kernel.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

pub use super::read::{compose as read_forward, compose_backward as read_backward};

/// [`RoutingBackend::row_dots`](super::RoutingBackend::row_dots) with Burn tensor operations:
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

/// [`RoutingBackend::weighted_sum`](super::RoutingBackend::weighted_sum) with Burn tensor
/// operations, one slot at a time.
pub fn weighted_sum<B: Backend>(slots: &[Tensor<B, 2>], weights: Tensor<B, 2>) -> Tensor<B, 2> {
    slots
        .iter()
        .enumerate()
        .map(|(slot, rows)| {
            let tokens = rows.dims()[0];
            rows.clone() * super::slot_column(&weights, slot, tokens)
        })
        .reduce(|sum, term| sum + term)
        .expect("a read has at least one slot")
}

/// [`RoutingBackend::add_scaled_rows`](super::RoutingBackend::add_scaled_rows) from the
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

/// [`RoutingBackend::weighted_total`](super::RoutingBackend::weighted_total) with Burn tensor
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

/// [`RoutingBackend::signed_sum`](super::RoutingBackend::signed_sum): for the half-split
/// signs `±1` one addition or subtraction, the same number as multiplying by the sign first.
pub fn signed_sum<B: Backend, const D: usize>(
    sum: Tensor<B, D>,
    term: Tensor<B, D>,
    sign: f64,
) -> Tensor<B, D> {
    if sign == 1.0 {
        sum + term
    } else if sign == -1.0 {
        sum - term
    } else {
        sum + term.mul_scalar(sign)
    }
}

/// [`RoutingBackend::scaled_rows`](super::RoutingBackend::scaled_rows) with Burn tensor
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
            wanted.then(|| super::slot_column(&columns, slot, tokens) * rows.clone())
        })
        .collect()
}
