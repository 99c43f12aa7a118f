//! The backward kernels of causal attention's fused pair, tiled as the forward kernel is
//! (`kernels.rs` has the shared pieces and the layout): each thread owns `stack` rows of its
//! cube's tile and, of each, every `groups`-th column.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::kernels::{
    add_weighted_row, at, column_of, load_per_position, load_row_pair, place_of, row_of,
    rows_against_rows, sum_of_shares, tiles_of, write_owned_rows, zero_columns, zeros,
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
    #[comptime] stack: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (seq, heads) = (query_grad.shape(1), query_grad.shape(2));
    if CUBE_POS >= query_grad.shape(0) * heads * tiles_of(seq, rows) {
        terminate!();
    }
    let place = place_of(seq, heads, rows, groups);
    let (first, head, b) = (place.first, place.head, place.batch);
    let (lane, group) = (place.lane, place.group);
    let lanes = comptime!(rows / stack);
    let threads = comptime!(lanes * groups);
    let per = comptime!(keys.div_ceil(groups));
    let mut queries = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut grads = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut key_tile = SharedMemory::<F>::new(keys * (head_dim + 1));
    let mut value_tile = SharedMemory::<F>::new(keys * (head_dim + 1));
    let mut score_grads = SharedMemory::<F>::new(rows * (keys + 1));
    let mut partial_deltas = SharedMemory::<F>::new(rows * groups);
    let mut scores = Array::<F>::new(comptime!(stack * per));
    let mut along_values = Array::<F>::new(comptime!(stack * per));
    let mut d_q = zero_columns::<F>(groups, head_dim, stack);
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
    let mut lse = zeros::<F>(stack);
    #[unroll]
    for a in 0..stack {
        let row = row_of(lane, a, lanes);
        let i = first + row;
        let mut partial = F::new(0.0);
        if i < seq {
            #[unroll]
            for k in 0..comptime!(head_dim.div_ceil(groups)) {
                let e = column_of(group, k, groups);
                if e < head_dim {
                    partial += grads[row * (head_dim + 1) + e] * output[at(output, b, i, head, e)];
                }
            }
            lse[a] = logsumexp[(b * seq + i) * heads + head];
        }
        partial_deltas[row * groups + group] = partial;
    }
    sync_cube();
    let mut along = Array::<F>::new(stack);
    #[unroll]
    for a in 0..stack {
        let row = row_of(lane, a, lanes);
        along[a] = sum_of_shares(&partial_deltas, row, groups);
        if first + row < seq && group == 0 {
            delta[(b * seq + first + row) * heads + head] = along[a];
        }
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
        rows_against_rows(
            &queries,
            lane,
            &key_tile,
            group,
            &mut scores,
            keys,
            groups,
            head_dim,
            stack,
            lanes,
        );
        rows_against_rows(
            &grads,
            lane,
            &value_tile,
            group,
            &mut along_values,
            keys,
            groups,
            head_dim,
            stack,
            lanes,
        );
        #[unroll]
        for a in 0..stack {
            let row = row_of(lane, a, lanes);
            #[unroll]
            for j in 0..per {
                let c = column_of(group, j, groups);
                if c < keys {
                    let mut d_score = F::new(0.0);
                    if start + c <= first + row {
                        let s = a * per + j;
                        d_score = (scores[s] - lse[a]).exp() * (along_values[s] - along[a]);
                    }
                    score_grads[row * (keys + 1) + c] = d_score;
                }
            }
        }
        sync_cube();
        for c in 0..keys {
            add_weighted_row(
                &mut d_q,
                &score_grads,
                c,
                &key_tile,
                lane,
                group,
                keys + 1,
                groups,
                head_dim,
                stack,
                lanes,
            );
        }
        sync_cube();
        start += keys;
    }
    write_owned_rows(
        query_grad, &d_q, first, b, head, lane, group, groups, head_dim, stack, lanes,
    );
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
    #[comptime] stack: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (seq, heads) = (key_grad.shape(1), key_grad.shape(2));
    if CUBE_POS >= key_grad.shape(0) * heads * tiles_of(seq, rows) {
        terminate!();
    }
    let place = place_of(seq, heads, rows, groups);
    let (first, head, b) = (place.first, place.head, place.batch);
    let (lane, group) = (place.lane, place.group);
    let lanes = comptime!(rows / stack);
    let threads = comptime!(lanes * groups);
    let per = comptime!(queries.div_ceil(groups));
    let mut key_tile = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut value_tile = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut query_tile = SharedMemory::<F>::new(queries * (head_dim + 1));
    let mut grads = SharedMemory::<F>::new(queries * (head_dim + 1));
    let mut weights = SharedMemory::<F>::new(rows * (queries + 1));
    let mut score_grads = SharedMemory::<F>::new(rows * (queries + 1));
    let mut sums = SharedMemory::<F>::new(queries);
    let mut deltas = SharedMemory::<F>::new(queries);
    let mut scores = Array::<F>::new(comptime!(stack * per));
    let mut along_values = Array::<F>::new(comptime!(stack * per));
    let mut d_k = zero_columns::<F>(groups, head_dim, stack);
    let mut d_v = zero_columns::<F>(groups, head_dim, stack);
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
        rows_against_rows(
            &key_tile,
            lane,
            &query_tile,
            group,
            &mut scores,
            queries,
            groups,
            head_dim,
            stack,
            lanes,
        );
        rows_against_rows(
            &value_tile,
            lane,
            &grads,
            group,
            &mut along_values,
            queries,
            groups,
            head_dim,
            stack,
            lanes,
        );
        #[unroll]
        for a in 0..stack {
            let row = row_of(lane, a, lanes);
            #[unroll]
            for m in 0..per {
                let r = column_of(group, m, groups);
                if r < queries {
                    let mut weight = F::new(0.0);
                    let mut d_score = F::new(0.0);
                    if start + r >= first + row && start + r < seq {
                        let s = a * per + m;
                        weight = (scores[s] - sums[r]).exp();
                        d_score = weight * (along_values[s] - deltas[r]);
                    }
                    weights[row * (queries + 1) + r] = weight;
                    score_grads[row * (queries + 1) + r] = d_score;
                }
            }
        }
        sync_cube();
        for r in 0..queries {
            add_weighted_row(
                &mut d_v,
                &weights,
                r,
                &grads,
                lane,
                group,
                queries + 1,
                groups,
                head_dim,
                stack,
                lanes,
            );
            add_weighted_row(
                &mut d_k,
                &score_grads,
                r,
                &query_tile,
                lane,
                group,
                queries + 1,
                groups,
                head_dim,
                stack,
                lanes,
            );
        }
        sync_cube();
        start += queries;
    }
    write_owned_rows(
        key_grad, &d_k, first, b, head, lane, group, groups, head_dim, stack, lanes,
    );
    write_owned_rows(
        value_grad, &d_v, first, b, head, lane, group, groups, head_dim, stack, lanes,
    );
}
