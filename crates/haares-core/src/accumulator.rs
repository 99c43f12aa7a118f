//! The online block accumulator (eq:partial, eq:update): two running sums per active block,
//! the cumulative `C` and the signed detail `D`, written once per residual event.

use burn::tensor::{Tensor, backend::Backend};

use haares_base::SplitMix64;

use crate::method::DetailSource;
use crate::ops::{HaaresBackend, RmsMatching};

/// The first-half size `k = ⌈m/2⌉` of a block of `m` events (odd `m`: the early half takes the
/// extra event).
pub fn half_size(events_per_block: usize) -> usize {
    events_per_block.div_ceil(2)
}

/// The half-split sign `s_r` of eq:partial for event `r` (1-based) of a block of `m` events:
/// `+1` for `r ≤ k = ⌈m/2⌉`, `−1` after.
pub fn half_split_sign(r: usize, events_per_block: usize) -> f64 {
    if r <= half_size(events_per_block) {
        1.0
    } else {
        -1.0
    }
}

/// Fixed random signs `s_{n,r} ∈ {±1}` for the random-sign ablation (docs/decisions.md, decision
/// 6), indexed `[block][event]`. Each sign is the low bit of successive SplitMix64 outputs from
/// `seed`: a generator fixed by this definition (not by a crate version), so a sign pattern stored
/// as its seed stays reproducible, also from other languages.
pub fn random_signs(seed: u64, blocks: usize, events_per_block: usize) -> Vec<Vec<f64>> {
    let mut rng = SplitMix64::new(seed);
    let mut next = move || rng.next_u64();
    (0..blocks)
        .map(|_| {
            (0..events_per_block)
                .map(|_| if next() & 1 == 1 { 1.0 } else { -1.0 })
                .collect()
        })
        .collect()
}

/// The detail signs of every event, `[block][event]`, for a detail source. The duplicated-`C`
/// control uses `+1` throughout: its detail slot shows `C` itself and never reads `D`.
pub fn detail_signs(source: DetailSource, blocks: usize, events_per_block: usize) -> Vec<Vec<f64>> {
    match source {
        DetailSource::HalfSplit => {
            vec![
                (1..=events_per_block)
                    .map(|r| half_split_sign(r, events_per_block))
                    .collect();
                blocks
            ]
        }
        DetailSource::RandomSigns { seed } => random_signs(seed, blocks, events_per_block),
        DetailSource::DuplicatedCumulative => vec![vec![1.0; events_per_block]; blocks],
    }
}

/// The active block's raw pair `(C^{(r−1)}, D^{(r−1)})` of eq:partial, maintained by the writes of
/// eq:update. Before the first write both are zero (stored as `None`, so no zero tensor is
/// allocated and the first write is exact).
///
/// While every sign so far is `+1` (the early half of a half-split block), `D` equals `C`
/// element for element (the same additions in the same order), so it is not stored twice: the
/// detail *is* the cumulative tensor until the first `−1`.
///
/// An accumulator made by [`forming_mean_squares`](Self::forming_mean_squares) asks the backend for
/// each sum's mean square with the sum
/// ([`SourceWriteBackend::signed_sum_with_mean_square`](crate::ops::SourceWriteBackend::signed_sum_with_mean_square):
/// the sum's own launch on the GPU backends) and keeps it beside the sum, for the source the sum is
/// read as; one made by [`new`](Self::new) forms none (the reference path reads no cached mean
/// square).
///
/// One made by [`matching_details`](Self::matching_details) also forms RMS matching's multiplier
/// for the detail (eq:rmsmatch) with each write after the first, the sums, their mean squares and
/// the multiplier in one
/// [`SourceWriteBackend::pair_write`](crate::ops::SourceWriteBackend::pair_write) (one launch on
/// the GPU backends, where they are three), and keeps it for
/// [`matched_detail`](Self::matched_detail).
#[derive(Debug, Clone)]
pub struct BlockAccumulator<B: Backend, const D: usize> {
    cumulative: Option<Sum<B, D>>,
    detail: Detail<B, D>,
    writes: usize,
    mean_squares: bool,
    matching: Option<RmsMatching>,
    matched: Option<Matched<B, D>>,
}

/// The detail's RMS-matching multiplier `a` and the matched mean square `m_D · a²`.
#[derive(Debug, Clone)]
struct Matched<B: Backend, const D: usize> {
    multiplier: Tensor<B, D>,
    mean_square: Tensor<B, D>,
}

/// A running sum, and its mean square over the last dimension where the write formed one.
#[derive(Debug, Clone)]
struct Sum<B: Backend, const D: usize> {
    value: Tensor<B, D>,
    mean_square: Option<Tensor<B, D>>,
}

impl<B: HaaresBackend, const D: usize> Sum<B, D> {
    /// A sum of one term, with no mean square.
    fn of(value: Tensor<B, D>) -> Self {
        Self {
            value,
            mean_square: None,
        }
    }

    /// `self + sign · term` (eq:update), with its mean square where `mean_square` asks for one
    /// and the backend forms it.
    fn add(self, term: Tensor<B, D>, sign: f64, mean_square: bool) -> Self {
        let (value, mean_square) = match mean_square {
            true => B::signed_sum_with_mean_square(self.value, term, sign),
            false => (B::signed_sum(self.value, term, sign), None),
        };
        Self { value, mean_square }
    }
}

/// What the detail `D` is, relative to the cumulative `C`.
#[derive(Debug, Clone)]
enum Detail<B: Backend, const D: usize> {
    /// Zero: no signed write yet.
    Zero,
    /// Equal to `C`: every write so far was signed `+1`.
    Cumulative,
    /// A tensor of its own.
    Own(Sum<B, D>),
}

impl<B: Backend, const D: usize> Default for BlockAccumulator<B, D> {
    fn default() -> Self {
        Self {
            cumulative: None,
            detail: Detail::Zero,
            writes: 0,
            mean_squares: false,
            matching: None,
            matched: None,
        }
    }
}

impl<B: HaaresBackend, const D: usize> BlockAccumulator<B, D> {
    /// An empty accumulator (the reset state at a block boundary).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty accumulator that keeps each sum's mean square where the backend forms it with the
    /// sum ([`cumulative_mean_square`](Self::cumulative_mean_square),
    /// [`detail_mean_square`](Self::detail_mean_square)).
    pub fn forming_mean_squares() -> Self {
        Self {
            mean_squares: true,
            ..Self::default()
        }
    }

    /// [`forming_mean_squares`](Self::forming_mean_squares), and forming the detail's
    /// RMS-matching multiplier with `matching`'s constants after every write but a block's first
    /// (where no mean square is formed: the reader forms its own).
    pub fn matching_details(matching: RmsMatching) -> Self {
        Self {
            matching: Some(matching),
            ..Self::forming_mean_squares()
        }
    }

    /// eq:update: `C ← C + u`, `D ← D + s·u`.
    pub fn write(&mut self, output: Tensor<B, D>, sign: f64) {
        self.matched = None;
        if let Some(matching) = self.matching
            && self.write_pair(&output, sign, matching)
        {
            self.writes += 1;
            return;
        }
        let previous = self.cumulative.take();
        self.detail = match (
            std::mem::replace(&mut self.detail, Detail::Zero),
            sign == 1.0,
        ) {
            (Detail::Zero, true) if self.writes == 0 => Detail::Cumulative,
            (Detail::Cumulative, true) => Detail::Cumulative,
            (Detail::Zero, _) => Detail::Own(Sum::of(output.clone().mul_scalar(sign))),
            (Detail::Cumulative, false) => {
                let cumulative = previous.clone().expect("a shared detail follows a write");
                Detail::Own(Sum::of(cumulative.value).add(output.clone(), sign, self.mean_squares))
            }
            (Detail::Own(detail), _) => {
                Detail::Own(detail.add(output.clone(), sign, self.mean_squares))
            }
        };
        self.cumulative = Some(match previous {
            Some(cumulative) => cumulative.add(output, 1.0, self.mean_squares),
            None => Sum::of(output),
        });
        self.writes += 1;
    }

    /// eq:update through
    /// [`SourceWriteBackend::pair_write`](crate::ops::SourceWriteBackend::pair_write), with the
    /// detail's multiplier; `false` (nothing written) before the first write, which has no sum to
    /// add to.
    fn write_pair(&mut self, output: &Tensor<B, D>, sign: f64, matching: RmsMatching) -> bool {
        let Some(cumulative) = &self.cumulative else {
            return false;
        };
        let detail = match (&self.detail, sign == 1.0) {
            (Detail::Zero, _) => return false,
            (Detail::Cumulative, true) => None,
            (Detail::Cumulative, false) => Some(cumulative.value.clone()),
            (Detail::Own(detail), _) => Some(detail.value.clone()),
        };
        let pair = B::pair_write(
            cumulative.value.clone(),
            detail,
            output.clone(),
            sign,
            matching,
        );
        self.cumulative = Some(Sum {
            value: pair.cumulative,
            mean_square: Some(pair.cumulative_mean_square),
        });
        self.detail = match pair.detail {
            Some((value, mean_square)) => Detail::Own(Sum {
                value,
                mean_square: Some(mean_square),
            }),
            None => Detail::Cumulative,
        };
        self.matched = Some(Matched {
            multiplier: pair.multiplier,
            mean_square: pair.matched_mean_square,
        });
        true
    }

    /// eq:update without a detail: `C ← C + u` only (Block AttnRes keeps no `D`).
    pub fn write_cumulative(&mut self, output: Tensor<B, D>) {
        self.cumulative = Some(match self.cumulative.take() {
            Some(cumulative) => cumulative.add(output, 1.0, self.mean_squares),
            None => Sum::of(output),
        });
        self.writes += 1;
    }

    /// How many outputs have been written since the last reset (`r − 1` before event `r`).
    pub fn writes(&self) -> usize {
        self.writes
    }

    /// The running cumulative `C^{(r−1)}`, or `None` before the first write (value zero).
    pub fn cumulative(&self) -> Option<&Tensor<B, D>> {
        self.cumulative.as_ref().map(|sum| &sum.value)
    }

    /// The mean square of [`cumulative`](Self::cumulative) over the last dimension, where its
    /// last write formed one.
    pub fn cumulative_mean_square(&self) -> Option<&Tensor<B, D>> {
        self.cumulative.as_ref()?.mean_square.as_ref()
    }

    /// The running raw detail `D^{(r−1)}`, or `None` before the first signed write (value zero).
    pub fn detail(&self) -> Option<&Tensor<B, D>> {
        match &self.detail {
            Detail::Zero => None,
            Detail::Cumulative => self.cumulative(),
            Detail::Own(detail) => Some(&detail.value),
        }
    }

    /// The mean square of [`detail`](Self::detail) over the last dimension, where its last write
    /// formed one.
    pub fn detail_mean_square(&self) -> Option<&Tensor<B, D>> {
        match &self.detail {
            Detail::Zero => None,
            Detail::Cumulative => self.cumulative_mean_square(),
            Detail::Own(detail) => detail.mean_square.as_ref(),
        }
    }

    /// The detail's RMS-matching multiplier `a` (eq:rmsmatch) and the matched mean square
    /// `m_D · a²`, where the last write formed them (an accumulator made by
    /// [`matching_details`](Self::matching_details), after a block's first write).
    pub fn matched_detail(&self) -> Option<(&Tensor<B, D>, &Tensor<B, D>)> {
        let matched = self.matched.as_ref()?;
        Some((&matched.multiplier, &matched.mean_square))
    }

    /// Whether [`detail`](Self::detail) is the cumulative tensor itself (every write so far was
    /// signed `+1`), so that a reader can share what it derived from `C`.
    pub fn detail_is_cumulative(&self) -> bool {
        matches!(self.detail, Detail::Cumulative)
    }

    /// Hands over the completed raw pair `(C, D)` and resets to zero (a block boundary), or
    /// `None` when nothing was written. `D` is `None` when only
    /// [`write_cumulative`](Self::write_cumulative) was used.
    pub fn take(&mut self) -> Option<(Tensor<B, D>, Option<Tensor<B, D>>)> {
        let detail = self.detail().cloned();
        self.writes = 0;
        self.detail = Detail::Zero;
        self.matched = None;
        Some((self.cumulative.take()?.value, detail))
    }
}

/// eq:inverse: the early and late half totals `(E, F) = ((C + D)/2, (C − D)/2)` recovered from a
/// raw half-split pair.
pub fn recover_halves<B: Backend, const D: usize>(
    cumulative: Tensor<B, D>,
    detail: Tensor<B, D>,
) -> (Tensor<B, D>, Tensor<B, D>) {
    let early = (cumulative.clone() + detail.clone()).div_scalar(2.0);
    let late = (cumulative - detail).div_scalar(2.0);
    (early, late)
}
