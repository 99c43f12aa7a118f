//! The backward kernels of causal attention's fused pair, tiled as the forward kernel is
//! (`kernels.rs` has the shared pieces and the layout).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::kernels::{
    add_scaled_columns, at, column_of, load_per_position, load_row_pair, place_of,
    row_against_rows, sum_of_shares, tiles_of, write_columns, zero_columns,
};

/// `∂q = Σ_keys p (∂o · v − Δ) k` per query, with `p = e^{q·k − lse}` and `Δ = ∂o · o`,
/// which it writes for the key–value kernel; a tile of `keys` keys at a time.
#[cube(launch)]
pub(super) fn attention_query_grad_kernel<F: Float>(
    query: &Tensor<F>,
    key: &Tensor<F>,
    value: &Tensor<F>,
    output: &Tensor<F>,
    logsumexp: &Tensor<F>,
    grad: &Tensor<F>,
    query_grad: &mut Tensor<F>,
    delta: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] rows: usize,
    #[comptime] keys: usize,
    #[comptime] groups: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (seq, heads) = (query_grad.shape(1), query_grad.shape(2));
    if CUBE_POS >= query_grad.shape(0) * heads * tiles_of(seq, rows) {
        terminate!();
    }
    let place = place_of(seq, heads, rows, groups);
    let (first, head, b) = (place.first, place.head, place.batch);
    let (row, group) = (place.row, place.group);
    let i = first + row;
    let row_at = (b * seq + i) * heads + head;
    let threads = comptime!(rows * groups);
    let mut queries = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut grads = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut key_tile = SharedMemory::<F>::new(keys * (head_dim + 1));
    let mut value_tile = SharedMemory::<F>::new(keys * (head_dim + 1));
    let mut score_grads = SharedMemory::<F>::new(rows * (keys + 1));
    let mut partial_deltas = SharedMemory::<F>::new(rows * groups);
    let mut scores = Array::<F>::new(comptime!(keys.div_ceil(groups)));
    let mut along_values = Array::<F>::new(comptime!(keys.div_ceil(groups)));
    let mut d_q = zero_columns::<F>(groups, head_dim);
    load_row_pair(
        query,
        grad,
        &mut queries,
        &mut grads,
        b,
        first,
        head,
        rows,
        head_dim,
        threads,
    );
    sync_cube();
    let mut partial = F::new(0.0);
    let mut lse = F::new(0.0);
    if i < seq {
        #[unroll]
        for k in 0..comptime!(head_dim.div_ceil(groups)) {
            let e = column_of(group, k, groups);
            if e < head_dim {
                partial += grads[row * (head_dim + 1) + e] * output[at(output, b, i, head, e)];
            }
        }
        lse = logsumexp[row_at];
    }
    partial_deltas[row * groups + group] = partial;
    sync_cube();
    let along = sum_of_shares(&partial_deltas, row, groups);
    if i < seq && group == 0 {
        delta[row_at] = along;
    }
    let end = min(first + rows, seq);
    let mut start = 0;
    while start < end {
        load_row_pair(
            key,
            value,
            &mut key_tile,
            &mut value_tile,
            b,
            start,
            head,
            keys,
            head_dim,
            threads,
        );
        sync_cube();
        row_against_rows(
            &queries,
            row,
            &key_tile,
            group,
            &mut scores,
            keys,
            groups,
            head_dim,
        );
        row_against_rows(
            &grads,
            row,
            &value_tile,
            group,
            &mut along_values,
            keys,
            groups,
            head_dim,
        );
        #[unroll]
        for j in 0..comptime!(keys.div_ceil(groups)) {
            let c = column_of(group, j, groups);
            if c < keys {
                let mut d_score = F::new(0.0);
                if start + c <= i {
                    d_score = (scores[j] - lse).exp() * (along_values[j] - along);
                }
                score_grads[row * (keys + 1) + c] = d_score;
            }
        }
        sync_cube();
        for c in 0..keys {
            let d_score = score_grads[row * (keys + 1) + c];
            add_scaled_columns(&mut d_q, d_score, &key_tile, c, group, groups, head_dim);
        }
        sync_cube();
        start += keys;
    }
    if i < seq {
        write_columns(
            query_grad,
            &d_q,
            F::new(1.0),
            row_at,
            group,
            groups,
            head_dim,
        );
    }
}

/// `∂v = Σ_queries p ∂o` and `∂k = Σ_queries p (∂o · v − Δ) q` per key, over the queries at or
/// after it, a tile of `queries` queries at a time.
#[cube(launch)]
pub(super) fn attention_key_value_grad_kernel<F: Float>(
    query: &Tensor<F>,
    key: &Tensor<F>,
    value: &Tensor<F>,
    logsumexp: &Tensor<F>,
    delta: &Tensor<F>,
    grad: &Tensor<F>,
    key_grad: &mut Tensor<F>,
    value_grad: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] rows: usize,
    #[comptime] queries: usize,
    #[comptime] groups: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (seq, heads) = (key_grad.shape(1), key_grad.shape(2));
    if CUBE_POS >= key_grad.shape(0) * heads * tiles_of(seq, rows) {
        terminate!();
    }
    let place = place_of(seq, heads, rows, groups);
    let (first, head, b) = (place.first, place.head, place.batch);
    let (row, group) = (place.row, place.group);
    let j = first + row;
    let threads = comptime!(rows * groups);
    let mut key_tile = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut value_tile = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut query_tile = SharedMemory::<F>::new(queries * (head_dim + 1));
    let mut grads = SharedMemory::<F>::new(queries * (head_dim + 1));
    let mut weights = SharedMemory::<F>::new(rows * (queries + 1));
    let mut score_grads = SharedMemory::<F>::new(rows * (queries + 1));
    let mut sums = SharedMemory::<F>::new(queries);
    let mut deltas = SharedMemory::<F>::new(queries);
    let mut scores = Array::<F>::new(comptime!(queries.div_ceil(groups)));
    let mut along_values = Array::<F>::new(comptime!(queries.div_ceil(groups)));
    let mut d_k = zero_columns::<F>(groups, head_dim);
    let mut d_v = zero_columns::<F>(groups, head_dim);
    load_row_pair(
        key,
        value,
        &mut key_tile,
        &mut value_tile,
        b,
        first,
        head,
        rows,
        head_dim,
        threads,
    );
    let mut start = first;
    while start < seq {
        load_row_pair(
            query,
            grad,
            &mut query_tile,
            &mut grads,
            b,
            start,
            head,
            queries,
            head_dim,
            threads,
        );
        load_per_position(logsumexp, &mut sums, b, start, head, queries, threads);
        load_per_position(delta, &mut deltas, b, start, head, queries, threads);
        sync_cube();
        row_against_rows(
            &key_tile,
            row,
            &query_tile,
            group,
            &mut scores,
            queries,
            groups,
            head_dim,
        );
        row_against_rows(
            &value_tile,
            row,
            &grads,
            group,
            &mut along_values,
            queries,
            groups,
            head_dim,
        );
        #[unroll]
        for m in 0..comptime!(queries.div_ceil(groups)) {
            let r = column_of(group, m, groups);
            if r < queries {
                let mut weight = F::new(0.0);
                let mut d_score = F::new(0.0);
                if start + r >= j && start + r < seq {
                    weight = (scores[m] - sums[r]).exp();
                    d_score = weight * (along_values[m] - deltas[r]);
                }
                weights[row * (queries + 1) + r] = weight;
                score_grads[row * (queries + 1) + r] = d_score;
            }
        }
        sync_cube();
        for r in 0..queries {
            let weight = weights[row * (queries + 1) + r];
            let d_score = score_grads[row * (queries + 1) + r];
            add_scaled_columns(&mut d_v, weight, &grads, r, group, groups, head_dim);
            add_scaled_columns(&mut d_k, d_score, &query_tile, r, group, groups, head_dim);
        }
        sync_cube();
        start += queries;
    }
    if j < seq {
        let row_at = (b * seq + j) * heads + head;
        write_columns(key_grad, &d_k, F::new(1.0), row_at, group, groups, head_dim);
        write_columns(
            value_grad,
            &d_v,
            F::new(1.0),
            row_at,
            group,
            groups,
            head_dim,
        );
    }
}
