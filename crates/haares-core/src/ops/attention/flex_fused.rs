//! Causal attention on Flex as one pass per sequence and head (docs/decisions.md, decision 15's
//! addendum): the pair of [`AttentionBackend::causal_attention_forward`] and
//! [`AttentionBackend::causal_attention_backward`](super::AttentionBackend::causal_attention_backward),
//! a Rayon task per `(sequence, head)`.
//!
//! A task copies its head's rows into buffers of its own, `d_h` padded with zeros to [`PAD`]
//! and the positions to a multiple of it (the keys and values also transposed, positions along
//! the vectors), and works on [`ROWS`] queries at a time:
//!
//! ```text
//! forward:  S = Q Kᵀ,  P = softmax over j ≤ i,  lse_i = ln Σ_{j≤i} e^{S_ij},  O = P V
//! backward: P = e^{S − lse},  ∂S = P ⊙ (∂O Vᵀ − Δ),  Δ_i = ∂O_i · O_i,
//!           ∂Q = ∂S K,  ∂K = ∂Sᵀ Q,  ∂V = Pᵀ ∂O
//! ```
//!
//! A block of queries reads keys only up to its last query's padded width: the masked half of
//! every product is skipped. Row `i` of `P` and `∂S` is written on at least its padded width
//! `⌈(i + 1)/PAD⌉·PAD`, zero past `i`; the keys' products (`∂K`, `∂V`) read column blocks of
//! them from their own position on, which those widths cover. The `[seq, seq]` matrices live in
//! the task's buffers (64 KiB each at 128 positions), not in the graph.
//!
//! [`AttentionBackend::causal_attention_forward`]: super::AttentionBackend::causal_attention_forward
//! [`PAD`]: super::flex_heads::PAD

use std::cell::RefCell;

use burn::backend::Flex;
use burn::tensor::Tensor;
use macerator::Simd;
use rayon::prelude::*;

use super::flex_heads::{Heads, Sizes, transpose};
use super::flex_tiles::{ROWS, Strided, block_product};
use crate::simd::{SharedOutput, dot_product, exp, flex_tensor, max, sum};

/// One task's buffers: its head's rows (`[padded positions, padded width]`), the keys and
/// values transposed (`[width, padded positions]`), rows of the `[padded positions, padded
/// positions]` matrices (a block's in the forward pass, all in the backward pass), a block of
/// output rows, and each query's `Δ_i`.
#[derive(Default)]
struct Buffers {
    queries: Vec<f32>,
    keys: Vec<f32>,
    values: Vec<f32>,
    outputs: Vec<f32>,
    grads: Vec<f32>,
    keys_t: Vec<f32>,
    values_t: Vec<f32>,
    probabilities: Vec<f32>,
    scores_grad: Vec<f32>,
    block_out: Vec<f32>,
    along: Vec<f32>,
}

thread_local! {
    /// Each thread's buffers, kept from one call to the next: allocated (and zeroed) per task,
    /// they took page faults and `memset`s at every call. After a backward pass they hold about
    /// `2·seq² + 7·seq·d_h` floats per thread: 0.2 MB at the `cpu` preset's 128 positions of 16,
    /// 37 MB at 2,048 positions of 64, until the thread ends (a CPU job's pool ends with the job).
    static BUFFERS: RefCell<Buffers> = RefCell::default();
}

impl Buffers {
    /// Runs `pass` on this thread's buffers, sized for `sizes` with `square_rows` rows of the
    /// `[padded positions, padded positions]` matrices. What earlier calls left in them is
    /// overwritten before it is read (the module's documentation says which rows are written).
    fn with<R>(sizes: Sizes, square_rows: usize, pass: impl FnOnce(&mut Buffers) -> R) -> R {
        BUFFERS.with_borrow_mut(|buffers| {
            let rows = sizes.rows();
            for buffer in [
                &mut buffers.queries,
                &mut buffers.keys,
                &mut buffers.values,
                &mut buffers.outputs,
                &mut buffers.grads,
                &mut buffers.keys_t,
                &mut buffers.values_t,
            ] {
                buffer.resize(rows, 0.0);
            }
            buffers
                .probabilities
                .resize(square_rows * sizes.padded_seq, 0.0);
            buffers
                .scores_grad
                .resize(square_rows * sizes.padded_seq, 0.0);
            buffers.block_out.resize(ROWS * sizes.padded_width, 0.0);
            buffers.along.resize(sizes.padded_seq, 0.0);
            pass(buffers)
        })
    }
}

/// The output `[batch, seq, heads, width]` and each query's log-sum-exp `[batch, seq, heads]`.
pub(super) fn forward(inputs: [&Heads; 3]) -> (Tensor<Flex, 4>, Tensor<Flex, 3>) {
    let dims = inputs[0].dims();
    let [batch, seq, heads, width] = dims;
    let (sizes, len) = (Sizes::of(dims), batch * seq * heads * width);
    let mut output = Vec::with_capacity(len);
    let mut logsumexp = Vec::with_capacity(batch * seq * heads);
    let targets = [
        SharedOutput::of(&mut output.spare_capacity_mut()[..len]),
        SharedOutput::of(&mut logsumexp.spare_capacity_mut()[..batch * seq * heads]),
    ];
    (0..batch * heads).into_par_iter().for_each(|task| {
        Buffers::with(sizes, ROWS, |buffers| {
            forward_head(inputs, sizes, task, buffers, targets)
        })
    });
    // SAFETY: every task wrote every row of its sequence and head, and its log-sum-exps.
    unsafe {
        output.set_len(len);
        logsumexp.set_len(batch * seq * heads);
    }
    (
        flex_tensor(output, dims),
        flex_tensor(logsumexp, [batch, seq, heads]),
    )
}

/// Task `task`'s sequence and head: its output rows and log-sum-exps.
#[macerator::with_simd]
fn forward_head<S: Simd>(
    inputs: [&Heads; 3],
    sizes: Sizes,
    task: usize,
    buffers: &mut Buffers,
    targets: [SharedOutput; 2],
) {
    let (b, h) = (task / sizes.heads, task % sizes.heads);
    let (seq, padded_seq, padded_width) = (sizes.seq, sizes.padded_seq, sizes.padded_width);
    let Buffers {
        queries,
        keys,
        values,
        keys_t,
        probabilities,
        block_out,
        ..
    } = buffers;
    inputs[0].gather(b, h, sizes, queries);
    inputs[1].gather(b, h, sizes, keys);
    inputs[2].gather(b, h, sizes, values);
    transpose(keys, sizes, keys_t);
    for first in (0..seq).step_by(ROWS) {
        let keys_read = sizes.keys_of_block(first);
        let block = Strided::rows(queries, first, padded_width);
        let scores = (&mut probabilities[..], padded_seq);
        block_product::<S>(
            block,
            0..sizes.width,
            (keys_t, padded_seq),
            keys_read,
            scores,
        );
        let block_rows = probabilities
            .chunks_exact_mut(padded_seq)
            .take(ROWS.min(seq - first));
        let mut totals = [1.0; ROWS];
        for (r, row) in block_rows.enumerate() {
            let (largest, total) = exponentials::<S>(&mut row[..keys_read], first + r + 1);
            totals[r] = total;
            let at = sizes.row(b, first + r, h) / sizes.width;
            // SAFETY: the log-sum-exp of query `(b, first + r, h)` is this task's.
            unsafe { targets[1].write(at, &[largest + total.ln()]) };
        }
        let block = Strided::rows(probabilities, 0, padded_seq);
        let out = (&mut block_out[..], padded_width);
        block_product::<S>(
            block,
            0..keys_read,
            (values, padded_width),
            padded_width,
            out,
        );
        // `P V` with `P` unnormalised: each row of the product divided by its row's sum instead.
        for (row, total) in block_out.chunks_exact_mut(padded_width).zip(totals) {
            row.iter_mut().for_each(|x| *x /= total);
        }
        write_block(targets[0], sizes, (b, first, h), block_out);
    }
}

/// The exponentials `e^{s_j − max}` of a row's first `visible` scores, in place, zero after
/// them; returns their maximum and sum. The whole row is one loop that chooses zero past
/// `visible`, which the compiler vectorises without a scalar tail or a fill (`row.len()` is a
/// multiple of the padding, at least `visible`).
#[inline(always)]
fn exponentials<S: Simd>(row: &mut [f32], visible: usize) -> (f32, f32) {
    let largest = max::<S>(&row[..visible]);
    for (j, x) in row.iter_mut().enumerate() {
        *x = if j < visible { exp(*x - largest) } else { 0.0 };
    }
    (largest, sum::<S>(row))
}

/// Rows `first..first + ROWS` (those before `seq`) of head `h` of sequence `b`, from a block of
/// padded rows.
fn write_block(
    target: SharedOutput,
    sizes: Sizes,
    (b, first, h): (usize, usize, usize),
    block: &[f32],
) {
    let rows = block
        .chunks_exact(sizes.padded_width)
        .take(sizes.seq - first);
    for (r, row) in rows.enumerate() {
        // SAFETY: row `(b, first + r, h)` is the calling task's.
        unsafe { target.write(sizes.row(b, first + r, h), &row[..sizes.width]) };
    }
}

/// `[∂Q, ∂K, ∂V]`, each `[batch, seq, heads, width]`, from the query, key and value, the forward
/// pass's output and log-sum-exps (`[batch, seq, heads, 1]`), and the output's gradient.
pub(super) fn backward(inputs: [&Heads; 6]) -> [Tensor<Flex, 4>; 3] {
    let dims = inputs[0].dims();
    let [batch, seq, heads, width] = dims;
    let (sizes, len) = (Sizes::of(dims), batch * seq * heads * width);
    let mut grads: [Vec<f32>; 3] = std::array::from_fn(|_| Vec::with_capacity(len));
    let targets = grads
        .each_mut()
        .map(|grad| SharedOutput::of(&mut grad.spare_capacity_mut()[..len]));
    (0..batch * heads).into_par_iter().for_each(|task| {
        let square_rows = sizes.padded_seq;
        Buffers::with(sizes, square_rows, |buffers| {
            backward_head(inputs, sizes, task, buffers, targets)
        })
    });
    grads.map(|mut grad| {
        // SAFETY: every task wrote every row of its sequence and head.
        unsafe { grad.set_len(len) };
        flex_tensor(grad, dims)
    })
}

/// Task `task`'s sequence and head: its rows of `∂Q`, `∂K` and `∂V`.
#[macerator::with_simd]
fn backward_head<S: Simd>(
    inputs: [&Heads; 6],
    sizes: Sizes,
    task: usize,
    buffers: &mut Buffers,
    targets: [SharedOutput; 3],
) {
    let (b, h) = (task / sizes.heads, task % sizes.heads);
    let (seq, width, padded_seq, padded_width) =
        (sizes.seq, sizes.width, sizes.padded_seq, sizes.padded_width);
    let [query, key, value, output, logsumexp, grad] = inputs;
    let Buffers {
        queries,
        keys,
        values,
        outputs,
        grads,
        keys_t,
        values_t,
        probabilities,
        scores_grad,
        block_out,
        along,
    } = buffers;
    query.gather(b, h, sizes, queries);
    key.gather(b, h, sizes, keys);
    value.gather(b, h, sizes, values);
    output.gather(b, h, sizes, outputs);
    grad.gather(b, h, sizes, grads);
    transpose(keys, sizes, keys_t);
    transpose(values, sizes, values_t);
    let rows = grads
        .chunks_exact(padded_width)
        .zip(outputs.chunks_exact(padded_width));
    for (along, (grad, output)) in along.iter_mut().zip(rows).take(seq) {
        *along = dot_product::<S, f32>(grad, output);
    }
    for first in (0..seq).step_by(ROWS) {
        let keys_read = sizes.keys_of_block(first);
        let block = |values| Strided::rows(values, first, padded_width);
        let scores = (&mut probabilities[first * padded_seq..], padded_seq);
        block_product::<S>(
            block(queries),
            0..width,
            (keys_t, padded_seq),
            keys_read,
            scores,
        );
        let output_grad = (&mut scores_grad[first * padded_seq..], padded_seq);
        block_product::<S>(
            block(grads),
            0..width,
            (values_t, padded_seq),
            keys_read,
            output_grad,
        );
        let block_rows = (probabilities[first * padded_seq..].chunks_exact_mut(padded_seq))
            .zip(scores_grad[first * padded_seq..].chunks_exact_mut(padded_seq))
            .take(ROWS.min(seq - first));
        for (r, (p, ds)) in block_rows.enumerate() {
            let i = first + r;
            let (lse, along) = (logsumexp.element(b, i, h, 0), along[i]);
            let row = p[..keys_read].iter_mut().zip(&mut ds[..keys_read]);
            for (j, (p, ds)) in row.enumerate() {
                let probability = if j <= i { exp(*p - lse) } else { 0.0 };
                *ds = probability * (*ds - along);
                *p = probability;
            }
        }
        let block_grad = Strided::rows(scores_grad, first, padded_seq);
        let out = (&mut block_out[..], padded_width);
        block_product::<S>(
            block_grad,
            0..keys_read,
            (keys, padded_width),
            padded_width,
            out,
        );
        write_block(targets[0], sizes, (b, first, h), block_out);
    }
    for first in (0..seq).step_by(ROWS) {
        // Keys `first..first + ROWS` are seen by queries `first..seq` only.
        let transposed = |values| Strided::columns(values, first, padded_seq);
        let out = (&mut block_out[..], padded_width);
        block_product::<S>(
            transposed(probabilities),
            first..seq,
            (grads, padded_width),
            padded_width,
            out,
        );
        write_block(targets[2], sizes, (b, first, h), block_out);
        let out = (&mut block_out[..], padded_width);
        block_product::<S>(
            transposed(scores_grad),
            first..seq,
            (queries, padded_width),
            padded_width,
            out,
        );
        write_block(targets[1], sizes, (b, first, h), block_out);
    }
}
