//! The kernels of causal attention's fused pair (`../cube.rs` launches them and describes
//! their tiling), in a module of their own because CubeCL's `Tensor` is not Burn's.
//!
//! Every kernel takes a tile of `rows` positions of one head of one batch row; `groups` threads
//! share a row, and each thread owns `stack` rows of the tile ([`row_of`]). It walks the other
//! side's positions one shared-memory tile at a time in two phases: first each thread forms the
//! products of its rows with every `groups`-th row of the other tile ([`rows_against_rows`]) and
//! leaves the weights they give in shared memory (forward, after a row's threads share the
//! tile's maximum); then each thread adds the weighted rows of the other tile into the columns
//! it owns of its rows, `group`, `group + groups`, … ([`column_of`], [`add_weighted_row`]). Rows
//! in shared memory lie `d_h + 1` apart, so that the same element of neighbouring rows falls in
//! different memory banks.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// Where element `e` of head `head` at position `t` of batch row `b` lies in a
/// `[batch, seq, heads, d_h]` tensor.
#[cube]
pub(super) fn at<F: Float>(x: &Tensor<F>, b: usize, t: usize, head: usize, e: usize) -> usize {
    b * x.stride(0) + t * x.stride(1) + head * x.stride(2) + e * x.stride(3)
}

/// The tiles of `tile` positions that cover `seq`.
#[cube]
pub(super) fn tiles_of(seq: usize, #[comptime] tile: usize) -> usize {
    seq.div_ceil(tile)
}

/// Where a thread works: its cube's tile of positions (the first of them, the head and the batch
/// row; the cubes run over the tiles of a head, then the heads, then the batch rows), its lane
/// (it owns the tile's rows `lane`, `lane + lanes`, … [`row_of`]) and its group of columns.
#[derive(CubeType, Clone)]
pub(super) struct Place {
    pub first: usize,
    pub head: usize,
    pub batch: usize,
    pub lane: usize,
    pub group: usize,
}

#[cube]
pub(super) fn place_of(
    seq: usize,
    heads: usize,
    #[comptime] rows: usize,
    #[comptime] groups: usize,
) -> Place {
    let tiles = tiles_of(seq, rows);
    let thread = UNIT_POS_X as usize;
    Place {
        first: (CUBE_POS % tiles) * rows,
        head: (CUBE_POS / tiles) % heads,
        batch: CUBE_POS / (tiles * heads),
        lane: thread / groups,
        group: thread % groups,
    }
}

/// The `a`-th of the `stack` rows of its tile that a thread of lane `lane` owns, when `lanes`
/// lanes share the tile: strided, so that the threads of one group read neighbouring rows, which
/// the `d_h + 1` padding puts in different memory banks.
#[cube]
pub(super) fn row_of(lane: usize, a: usize, #[comptime] lanes: usize) -> usize {
    lane + lanes * a
}

/// The `k`-th column a thread of group `group` owns.
#[cube]
pub(super) fn column_of(group: usize, k: usize, #[comptime] groups: usize) -> usize {
    group + groups * k
}
/// Rows `start .. start + count` of head `head` of `x` into `tile`, `d_h + 1` apart, zeros past
/// the sequence; the cube's `threads` threads share the copy.
#[cube]
pub(super) fn load_rows<F: Float>(
    x: &Tensor<F>,
    tile: &mut SharedMemory<F>,
    b: usize,
    start: usize,
    head: usize,
    #[comptime] count: usize,
    #[comptime] head_dim: usize,
    #[comptime] threads: usize,
) {
    let mut index = UNIT_POS_X as usize;
    while index < count * head_dim {
        let (row, e) = (index / head_dim, index % head_dim);
        let t = start + row;
        let mut element = F::new(0.0);
        if t < x.shape(1) {
            element = x[at(x, b, t, head, e)];
        }
        tile[row * (head_dim + 1) + e] = element;
        index += threads;
    }
}

/// [`load_rows`] of two tensors at the same positions.
#[cube]
pub(super) fn load_row_pair<F: Float>(
    first: &Tensor<F>,
    second: &Tensor<F>,
    first_tile: &mut SharedMemory<F>,
    second_tile: &mut SharedMemory<F>,
    b: usize,
    start: usize,
    head: usize,
    #[comptime] count: usize,
    #[comptime] head_dim: usize,
    #[comptime] threads: usize,
) {
    load_rows(first, first_tile, b, start, head, count, head_dim, threads);
    load_rows(
        second,
        second_tile,
        b,
        start,
        head,
        count,
        head_dim,
        threads,
    );
}

/// The sum of the values the `groups` threads of position `row` left in `shares`.
#[cube]
pub(super) fn sum_of_shares<F: Float>(
    shares: &SharedMemory<F>,
    row: usize,
    #[comptime] groups: usize,
) -> F {
    let mut sum = F::new(0.0);
    #[unroll]
    for g in 0..groups {
        sum += shares[row * groups + g];
    }
    sum
}

/// Per position `start .. start + count`, its value in the `[batch, seq, heads]` tensor `x`
/// into `to`, zero past the sequence; the cube's `threads` threads share the copy.
#[cube]
pub(super) fn load_per_position<F: Float>(
    x: &Tensor<F>,
    to: &mut SharedMemory<F>,
    b: usize,
    start: usize,
    head: usize,
    #[comptime] count: usize,
    #[comptime] threads: usize,
) {
    let (seq, heads) = (x.shape(1), x.shape(2));
    let mut index = UNIT_POS_X as usize;
    while index < count {
        let t = start + index;
        let mut element = F::new(0.0);
        if t < seq {
            element = x[(b * seq + t) * heads + head];
        }
        to[index] = element;
        index += threads;
    }
}

/// `products[a·per + j] = Σ_e mine[row_a, e] · theirs[group + groups·j, e]`, `per` being
/// `⌈count / groups⌉`: each of the `stack` rows `row_a` of one tile that this thread owns
/// ([`row_of`]) against every `groups`-th row of another, below `count`. Per column `e`, the
/// thread reads `stack + per` values from shared memory for `stack · per` multiply-adds.
#[cube]
pub(super) fn rows_against_rows<F: Float>(
    mine: &SharedMemory<F>,
    lane: usize,
    theirs: &SharedMemory<F>,
    group: usize,
    products: &mut Array<F>,
    #[comptime] count: usize,
    #[comptime] groups: usize,
    #[comptime] head_dim: usize,
    #[comptime] stack: usize,
    #[comptime] lanes: usize,
) {
    let per = comptime!(count.div_ceil(groups));
    #[unroll]
    for s in 0..comptime!(stack * per) {
        products[s] = F::new(0.0);
    }
    let mut own = Array::<F>::new(stack);
    for e in 0..head_dim {
        #[unroll]
        for a in 0..stack {
            own[a] = mine[row_of(lane, a, lanes) * (head_dim + 1) + e];
        }
        #[unroll]
        for j in 0..per {
            let other = column_of(group, j, groups);
            if other < count {
                let element = theirs[other * (head_dim + 1) + e];
                #[unroll]
                for a in 0..stack {
                    products[a * per + j] += own[a] * element;
                }
            }
        }
    }
}

/// `accumulator[a·cols + k] += weights[row_a, c] · tile[c, group + groups·k]`, `cols` being
/// `⌈d_h / groups⌉`: row `c` of `tile`, weighted for each of this thread's `stack` rows by
/// `weights` (rows `width` apart), into the columns it owns. The thread reads `stack + cols`
/// values from shared memory for `stack · cols` multiply-adds.
#[cube]
pub(super) fn add_weighted_row<F: Float>(
    accumulator: &mut Array<F>,
    weights: &SharedMemory<F>,
    c: usize,
    tile: &SharedMemory<F>,
    lane: usize,
    group: usize,
    #[comptime] width: usize,
    #[comptime] groups: usize,
    #[comptime] head_dim: usize,
    #[comptime] stack: usize,
    #[comptime] lanes: usize,
) {
    let cols = comptime!(head_dim.div_ceil(groups));
    let mut weight = Array::<F>::new(stack);
    #[unroll]
    for a in 0..stack {
        weight[a] = weights[row_of(lane, a, lanes) * width + c];
    }
    #[unroll]
    for k in 0..cols {
        let e = column_of(group, k, groups);
        if e < head_dim {
            let element = tile[c * (head_dim + 1) + e];
            #[unroll]
            for a in 0..stack {
                accumulator[a * cols + k] += weight[a] * element;
            }
        }
    }
}

/// The columns this thread owns of its `a`-th row, at `row_at` of a contiguous
/// `[batch, seq, heads, d_h]` tensor: `scale · accumulator[a·cols + k]`.
#[cube]
pub(super) fn write_columns<F: Float>(
    x: &mut Tensor<F>,
    accumulator: &Array<F>,
    a: usize,
    scale: F,
    row_at: usize,
    group: usize,
    #[comptime] groups: usize,
    #[comptime] head_dim: usize,
) {
    let cols = comptime!(head_dim.div_ceil(groups));
    #[unroll]
    for k in 0..cols {
        let e = column_of(group, k, groups);
        if e < head_dim {
            x[row_at * head_dim + e] = scale * accumulator[a * cols + k];
        }
    }
}

/// The accumulator's columns of each of this thread's rows that lies in the sequence, unscaled,
/// into the contiguous `[batch, seq, heads, d_h]` tensor `x` (the tile's first position
/// `first`, of head `head` of batch row `b`).
#[cube]
pub(super) fn write_owned_rows<F: Float>(
    x: &mut Tensor<F>,
    accumulator: &Array<F>,
    first: usize,
    b: usize,
    head: usize,
    lane: usize,
    group: usize,
    #[comptime] groups: usize,
    #[comptime] head_dim: usize,
    #[comptime] stack: usize,
    #[comptime] lanes: usize,
) {
    let (seq, heads) = (x.shape(1), x.shape(2));
    #[unroll]
    for a in 0..stack {
        let i = first + row_of(lane, a, lanes);
        if i < seq {
            let row_at = (b * seq + i) * heads + head;
            write_columns(
                x,
                accumulator,
                a,
                F::new(1.0),
                row_at,
                group,
                groups,
                head_dim,
            );
        }
    }
}

/// `count` zeros in registers.
#[cube]
pub(super) fn zeros<F: Float>(#[comptime] count: usize) -> Array<F> {
    let mut values = Array::<F>::new(count);
    #[unroll]
    for s in 0..count {
        values[s] = F::new(0.0);
    }
    values
}

/// A zeroed accumulator for the columns one thread owns of each of its `stack` rows.
#[cube]
pub(super) fn zero_columns<F: Float>(
    #[comptime] groups: usize,
    #[comptime] head_dim: usize,
    #[comptime] stack: usize,
) -> Array<F> {
    zeros::<F>(comptime!(stack * head_dim.div_ceil(groups)))
}

/// The online softmax over the keys each query sees, a tile of `keys` keys at a time; writes
/// `o / l` and `m + ln l`. The threads of a position share the tile's maximum through shared
/// memory and each takes the exponentials of its own keys' scores, so each is taken once. Each
/// thread keeps, for each of its `stack` queries, `m`, its part of `l` and its columns of `o`.
#[cube(launch)]
pub(super) fn attention_forward_kernel<F: Float>(
    query: &Tensor<F>,
    key: &Tensor<F>,
    value: &Tensor<F>,
    output: &mut Tensor<F>,
    logsumexp: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] rows: usize,
    #[comptime] keys: usize,
    #[comptime] groups: usize,
    #[comptime] stack: usize,
    #[define(F)] _dtype: StorageType,
) {
    let (seq, heads) = (output.shape(1), output.shape(2));
    if CUBE_POS >= output.shape(0) * heads * tiles_of(seq, rows) {
        terminate!();
    }
    let place = place_of(seq, heads, rows, groups);
    let (first, head, b) = (place.first, place.head, place.batch);
    let (lane, group) = (place.lane, place.group);
    let lanes = comptime!(rows / stack);
    let threads = comptime!(lanes * groups);
    let per = comptime!(keys.div_ceil(groups));
    let cols = comptime!(head_dim.div_ceil(groups));
    let mut queries = SharedMemory::<F>::new(rows * (head_dim + 1));
    let mut key_tile = SharedMemory::<F>::new(keys * (head_dim + 1));
    let mut value_tile = SharedMemory::<F>::new(keys * (head_dim + 1));
    let mut weights = SharedMemory::<F>::new(rows * (keys + 1));
    // One value per row and group: its share of the tile's maximum, and at the end of its sum.
    let mut shares = SharedMemory::<F>::new(rows * groups);
    let mut scores = Array::<F>::new(comptime!(stack * per));
    let mut o = zero_columns::<F>(groups, head_dim, stack);
    // The part of each `l` from this thread's keys.
    let mut total = zeros::<F>(stack);
    // A finite start, so that the first tile's rescaling is `e^{−huge} = 0`, not `e^{NaN}`.
    let mut most = Array::<F>::new(stack);
    #[unroll]
    for a in 0..stack {
        most[a] = F::new(-1.0e30);
    }
    load_rows(query, &mut queries, b, first, head, rows, head_dim, threads);
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
        #[unroll]
        for a in 0..stack {
            let row = row_of(lane, a, lanes);
            let mut my_most = most[a];
            #[unroll]
            for j in 0..per {
                let c = column_of(group, j, groups);
                if c < keys && start + c <= first + row {
                    my_most = F::max(my_most, scores[a * per + j]);
                }
            }
            shares[row * groups + group] = my_most;
        }
        sync_cube();
        #[unroll]
        for a in 0..stack {
            let row = row_of(lane, a, lanes);
            let mut tile_most = most[a];
            #[unroll]
            for g in 0..groups {
                tile_most = F::max(tile_most, shares[row * groups + g]);
            }
            let shrink = (most[a] - tile_most).exp();
            total[a] *= shrink;
            #[unroll]
            for k in 0..cols {
                o[a * cols + k] *= shrink;
            }
            #[unroll]
            for j in 0..per {
                let c = column_of(group, j, groups);
                if c < keys {
                    let mut weight = F::new(0.0);
                    if start + c <= first + row {
                        weight = (scores[a * per + j] - tile_most).exp();
                    }
                    total[a] += weight;
                    weights[row * (keys + 1) + c] = weight;
                }
            }
            most[a] = tile_most;
        }
        sync_cube();
        for c in 0..keys {
            add_weighted_row(
                &mut o,
                &weights,
                c,
                &value_tile,
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
    #[unroll]
    for a in 0..stack {
        shares[row_of(lane, a, lanes) * groups + group] = total[a];
    }
    sync_cube();
    #[unroll]
    for a in 0..stack {
        let row = row_of(lane, a, lanes);
        let i = first + row;
        let sum = sum_of_shares(&shares, row, groups);
        if i < seq {
            let row_at = (b * seq + i) * heads + head;
            write_columns(
                output,
                &o,
                a,
                F::new(1.0) / sum,
                row_at,
                group,
                groups,
                head_dim,
            );
            if group == 0 {
                logsumexp[row_at] = most[a] + sum.ln();
            }
        }
    }
}
