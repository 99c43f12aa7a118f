//! Deterministic batches of `(input, target, mask)` over a prepared shard: shuffled by the
//! data-order seed each epoch, resumable exactly from a saved position, and an in-order full
//! validation pass.

use haares_base::SplitMix64;
use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};
use crate::prepared::PreparedShard;

/// One batch, row-major `[batch, seq]` with `seq = chunk length − 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Rows in the batch.
    pub batch_size: usize,
    /// Positions per row (512 for the paper's chunks).
    pub seq_len: usize,
    /// Input ids: chunk tokens `0 … seq−1`.
    pub inputs: Vec<u32>,
    /// Target ids: chunk tokens `1 … seq` (pads where the chunk is padded).
    pub targets: Vec<u32>,
    /// 1 where the target is a real token, 0 where it is padding (docs/decisions.md, decision 11).
    pub mask: Vec<f32>,
}

impl Batch {
    /// Number of real target tokens.
    pub fn real_targets(&self) -> usize {
        self.mask.iter().filter(|m| **m > 0.0).count()
    }

    /// The batch cut to the first `seq_len` positions of every row, the context a run trains on
    /// when it is shorter than the prepared chunks (the CPU presets); the whole batch when
    /// `seq_len` reaches the rows' length.
    pub fn cropped(&self, seq_len: usize) -> Batch {
        let seq = seq_len.min(self.seq_len);
        fn crop<T: Copy>(values: &[T], row_len: usize, seq: usize) -> Vec<T> {
            values
                .chunks(row_len)
                .flat_map(|row| row[..seq].iter().copied())
                .collect()
        }
        Batch {
            batch_size: self.batch_size,
            seq_len: seq,
            inputs: crop(&self.inputs, self.seq_len, seq),
            targets: crop(&self.targets, self.seq_len, seq),
            mask: crop(&self.mask, self.seq_len, seq),
        }
    }

    fn from_chunks(shard: &PreparedShard, chunks: impl ExactSizeIterator<Item = usize>) -> Self {
        let (batch_size, seq_len) = (chunks.len(), shard.chunk_len() - 1);
        let mut batch = Self {
            batch_size,
            seq_len,
            inputs: Vec::with_capacity(batch_size * seq_len),
            targets: Vec::with_capacity(batch_size * seq_len),
            mask: Vec::with_capacity(batch_size * seq_len),
        };
        let mut tokens = Vec::with_capacity(shard.chunk_len());
        for chunk in chunks {
            shard.read_chunk(chunk, &mut tokens);
            let real = shard.real_len(chunk);
            batch.inputs.extend_from_slice(&tokens[..seq_len]);
            batch.targets.extend_from_slice(&tokens[1..]);
            batch
                .mask
                .extend((1..=seq_len).map(|position| if position < real { 1.0 } else { 0.0 }));
        }
        batch
    }
}

/// Where a [`BatchIterator`] stands; save it with a checkpoint to resume exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPosition {
    /// Data-order seed.
    pub seed: u64,
    /// Batch size.
    pub batch_size: usize,
    /// Chunks in the shard (checked on restore).
    pub chunks: usize,
    /// Epochs completed.
    pub epoch: u64,
    /// Next index into this epoch's order.
    pub cursor: usize,
}

/// An endless, deterministic stream of training batches. Each epoch visits every chunk once in
/// an order drawn from `(seed, epoch)`; the last incomplete batch of an epoch is skipped so that
/// every batch has the same size.
#[derive(Debug)]
pub struct BatchIterator<'a> {
    shard: &'a PreparedShard,
    position: BatchPosition,
    order: Vec<usize>,
}

impl<'a> BatchIterator<'a> {
    /// Starts at epoch 0.
    pub fn new(shard: &'a PreparedShard, batch_size: usize, seed: u64) -> Result<Self> {
        Self::restore(
            shard,
            BatchPosition {
                seed,
                batch_size,
                chunks: shard.len(),
                epoch: 0,
                cursor: 0,
            },
        )
    }

    /// Continues from a saved position.
    pub fn restore(shard: &'a PreparedShard, position: BatchPosition) -> Result<Self> {
        if position.batch_size == 0 || position.batch_size > shard.len() {
            return Err(DataError::format(
                shard.path(),
                format!(
                    "batch size {} must be between 1 and the {} chunks of the shard",
                    position.batch_size,
                    shard.len()
                ),
            ));
        }
        if position.chunks != shard.len() || position.cursor > shard.len() {
            return Err(DataError::format(
                shard.path(),
                format!(
                    "saved batch position is for {} chunks (cursor {}), the shard has {}; the prepared data changed since the checkpoint",
                    position.chunks,
                    position.cursor,
                    shard.len()
                ),
            ));
        }
        Ok(Self {
            shard,
            order: epoch_order(shard.len(), position.seed, position.epoch),
            position,
        })
    }

    /// The position to save for an exact resume.
    pub fn position(&self) -> BatchPosition {
        self.position
    }

    /// The next batch.
    pub fn next_batch(&mut self) -> Batch {
        let size = self.position.batch_size;
        if self.position.cursor + size > self.order.len() {
            self.position.epoch += 1;
            self.position.cursor = 0;
            self.order = epoch_order(self.shard.len(), self.position.seed, self.position.epoch);
        }
        let start = self.position.cursor;
        self.position.cursor += size;
        Batch::from_chunks(self.shard, self.order[start..start + size].iter().copied())
    }
}

/// Every chunk once, in file order, in batches of at most `batch_size` (the last may be smaller):
/// the full validation pass.
pub fn validation_batches(
    shard: &PreparedShard,
    batch_size: usize,
) -> impl Iterator<Item = Batch> + '_ {
    let batch_size = batch_size.max(1);
    (0..shard.len())
        .step_by(batch_size)
        .map(move |start| Batch::from_chunks(shard, start..(start + batch_size).min(shard.len())))
}

/// A permutation of `0..n` by Fisher–Yates, driven by SplitMix64 seeded from `(seed, epoch)`: fixed
/// by this definition, not by a crate version, so that a data order is reproducible anywhere.
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut next = move || rng.next_u64();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}
