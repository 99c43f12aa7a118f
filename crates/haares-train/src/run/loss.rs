//! The training objective (docs/decisions.md, decision 11): mean cross-entropy over non-pad target
//! tokens; validation loss token-weighted over the whole split.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use haares_core::ops::CrossEntropyBackend;
use haares_core::{HaaresBackend, HaaresModel, RoutingStatistics, RoutingTally};
use haares_data::batching::{Batch, validation_batches};
use haares_data::prepared::PreparedShard;

/// A batch on the device, cropped to the first `seq_len` positions of each chunk.
pub struct DeviceBatch<B: Backend> {
    /// Input ids `[batch, seq]`.
    pub inputs: Tensor<B, 2, Int>,
    /// Target ids `[batch, seq]`.
    pub targets: Tensor<B, 2, Int>,
    /// 1 for real targets, 0 for pads `[batch, seq]`.
    pub mask: Tensor<B, 2>,
    /// Number of real target tokens.
    pub real_targets: usize,
}

/// Moves `batch` to `device`, keeping the first `seq_len` positions of every row (the CPU presets
/// train on shorter contexts than the prepared 512).
pub fn to_device<B: Backend>(batch: &Batch, seq_len: usize, device: &B::Device) -> DeviceBatch<B> {
    let batch = batch.cropped(seq_len);
    let shape = [batch.batch_size, batch.seq_len];
    let ids = |values: &[u32]| -> Vec<i64> { values.iter().map(|&id| id as i64).collect() };
    DeviceBatch {
        inputs: Tensor::from_data(TensorData::new(ids(&batch.inputs), shape), device),
        targets: Tensor::from_data(TensorData::new(ids(&batch.targets), shape), device),
        real_targets: batch.real_targets(),
        mask: Tensor::<B, 2>::from_data(TensorData::new(batch.mask, shape), device),
    }
}

/// The real (non-pad) target positions of `batch` within the first `seq_len` positions of each
/// row.
pub fn real_target_count(batch: &Batch, seq_len: usize) -> usize {
    let seq = seq_len.min(batch.seq_len);
    batch
        .mask
        .chunks(batch.seq_len)
        .map(|row| row[..seq].iter().filter(|m| **m > 0.0).count())
        .sum()
}

/// Sum of the cross-entropy over real target tokens (a scalar tensor).
pub fn summed_cross_entropy<B: HaaresBackend>(
    model: &HaaresModel<B>,
    batch: &DeviceBatch<B>,
) -> Tensor<B, 1> {
    summed_cross_entropy_of(model.forward_unchecked(batch.inputs.clone()), batch)
}

/// Sum of the cross-entropy of `logits` (`[batch, seq, vocab]`) over the batch's real targets:
/// the pad mask weights each position's term (on the cube backends one fused operation and one
/// launch for the sum, no Burn reduction: [`CrossEntropyBackend::summed_cross_entropy`]).
fn summed_cross_entropy_of<B: CrossEntropyBackend>(
    logits: Tensor<B, 3>,
    batch: &DeviceBatch<B>,
) -> Tensor<B, 1> {
    let [rows, seq, vocab] = logits.dims();
    let targets = batch.targets.clone().reshape([rows * seq]);
    let mask = batch.mask.clone().reshape([rows * seq]);
    B::summed_cross_entropy(logits.reshape([rows * seq, vocab]), targets, mask)
}

/// Mean cross-entropy over the batch's real targets (the training loss). A batch without a real
/// target has loss 0.
pub fn mean_cross_entropy<B: HaaresBackend>(
    model: &HaaresModel<B>,
    batch: &DeviceBatch<B>,
) -> Tensor<B, 1> {
    summed_cross_entropy(model, batch) / batch.real_targets.max(1) as f64
}

/// Token-weighted validation loss over `batches`: Σ losses / Σ real targets.
pub fn validation_loss<B: HaaresBackend>(
    model: &HaaresModel<B>,
    batches: impl Iterator<Item = Batch>,
    seq_len: usize,
    device: &B::Device,
) -> f64 {
    validate(model, batches, seq_len, device, false).loss
}

/// What a validation pass measures.
#[derive(Debug, Clone)]
pub struct Validation {
    /// Token-weighted loss (NaN without a real target).
    pub loss: f64,
    /// The routers' statistics over the real target positions, for routed models when asked for.
    pub routing: Option<RoutingStatistics>,
}

/// A validation pass: the token-weighted loss over `batches` and, with `routing` and a routed
/// model, the routing statistics over the same positions, from the same forward passes.
pub fn validate<B: HaaresBackend>(
    model: &HaaresModel<B>,
    batches: impl Iterator<Item = Batch>,
    seq_len: usize,
    device: &B::Device,
    routing: bool,
) -> Validation {
    let routing = routing && model.config.method.is_routed();
    let (mut total, mut tokens) = (0.0f64, 0usize);
    let mut tally = RoutingTally::new();
    for batch in batches {
        let batch = to_device::<B>(&batch, seq_len, device);
        if batch.real_targets == 0 {
            continue;
        }
        let logits = if routing {
            let (logits, trace) = model.forward_with_trace_unchecked(batch.inputs.clone());
            tally
                .add(&trace, Some(&batch.mask))
                .expect("one model's traces share their read sites");
            logits
        } else {
            model.forward_unchecked(batch.inputs.clone())
        };
        total += summed_cross_entropy_of(logits, &batch)
            .into_scalar()
            .elem::<f64>();
        tokens += batch.real_targets;
    }
    Validation {
        loss: if tokens == 0 {
            f64::NAN
        } else {
            total / tokens as f64
        },
        routing: (routing && tokens > 0).then(|| tally.finish(model)),
    }
}

/// The validation pass: the first `chunks` chunks of `shard` (all when `None`), in file order, in
/// batches of `batch_size` (the last one cut to the exact count).
pub fn validation_pass(
    shard: &PreparedShard,
    batch_size: usize,
    chunks: Option<usize>,
) -> impl Iterator<Item = Batch> + '_ {
    let mut left = chunks.unwrap_or(shard.len()).min(shard.len());
    validation_batches(shard, batch_size).map_while(move |mut batch| {
        if left == 0 {
            return None;
        }
        let rows = batch.batch_size.min(left);
        left -= rows;
        let values = rows * batch.seq_len;
        batch.batch_size = rows;
        batch.inputs.truncate(values);
        batch.targets.truncate(values);
        batch.mask.truncate(values);
        Some(batch)
    })
}
