//! The routed methods' walk over the events: the completed pairs, the active block's accumulator,
//! and the bank each read site sees (eq:sourceset), on the configured routing path.

use burn::tensor::Tensor;

use crate::accumulator::BlockAccumulator;
use crate::method::{DetailSource, HaaresOptions};
use crate::norm::RmsNorm;
use crate::ops::{HaaresBackend, RmsMatching};
use crate::rms_match::{rms_match, rms_match_source};
use crate::router::{DepthRouter, RouterOutput};
use crate::source_bank::{Source, SourceBank, rows};

/// A block's cumulative source and, for HAARES, its detail source.
pub(super) type SourcePair<B> = (Source<B>, Option<Source<B>>);

/// What a routed pass holds between events: `e`, the completed pairs and the active block.
pub(super) struct RoutedSources<B: HaaresBackend> {
    /// Whether the reads and the sources are the fused path's.
    fused: bool,
    /// The HAARES options (`None` for Block AttnRes).
    options: Option<HaaresOptions>,
    /// `[batch, seq]` of the pass.
    batch_seq: [usize; 2],
    embedding: Source<B>,
    completed: Vec<SourcePair<B>>,
    active: BlockAccumulator<B, 2>,
}

impl<B: HaaresBackend> RoutedSources<B> {
    pub(super) fn new(
        embedding: Tensor<B, 3>,
        fused: bool,
        options: Option<HaaresOptions>,
    ) -> Self {
        let [batch, seq, _] = embedding.dims();
        // On the fused path a source's mean square is computed once, here, and shared by every
        // read site that sees it.
        let embedding = match fused {
            true => Source::with_mean_square(embedding),
            false => Source::plain(embedding),
        };
        Self {
            fused,
            options,
            batch_seq: [batch, seq],
            embedding,
            completed: Vec::new(),
            active: empty_accumulator(fused, options),
        }
    }

    /// The completed blocks.
    pub(super) fn completed(&self) -> usize {
        self.completed.len()
    }

    /// eq:sourceset: the embedding, every completed pair `(C_i, D̂_i)`, and the active pair once
    /// the active block has a written output (`r > 1`). Block AttnRes pairs have no detail slot.
    pub(super) fn source_set(&self) -> SourceBank<B> {
        let mut bank = SourceBank::from_embedding(self.embedding.clone());
        let active = self.active_pair(true);
        for (cumulative, detail) in self.completed.iter().cloned().chain(active) {
            bank.push_source_pair(cumulative, detail);
        }
        bank
    }

    /// eq:final's bank: `{e, C_1 … C_N}`, never a detail slot.
    pub(super) fn final_set(&self) -> SourceBank<B> {
        let mut bank = SourceBank::from_embedding(self.embedding.clone());
        for (cumulative, _) in &self.completed {
            bank.push_source_pair(cumulative.clone(), None);
        }
        bank
    }

    /// eq:update: `u` added to the active `C` and to `D` with `sign` (to `C` alone for Block
    /// AttnRes, `sign = None`); `completes` closes the block, whose pair keeps its detail only
    /// when `detail_is_read`.
    pub(super) fn write(
        &mut self,
        output: Tensor<B, 3>,
        sign: Option<f64>,
        completes: bool,
        detail_is_read: bool,
    ) {
        match sign {
            Some(sign) => self.active.write(rows(output), sign),
            None => self.active.write_cumulative(rows(output)),
        }
        // The write above makes the active pair: a completed block always has one.
        if completes && let Some(pair) = self.active_pair(detail_is_read) {
            self.completed.push(pair);
            self.active = empty_accumulator(self.fused, self.options);
        }
    }

    /// One router read on the configured path, its mixture put through `norm` when one is
    /// given: in the read itself on the fused path ([`DepthRouter::forward_fused_normed`]),
    /// after it on the reference path.
    pub(super) fn read(
        &self,
        router: &DepthRouter<B>,
        bank: &SourceBank<B>,
        norm: Option<&RmsNorm<B>>,
    ) -> RouterOutput<B> {
        match (self.fused, norm) {
            (true, Some(norm)) => router.forward_fused_normed(bank, norm),
            (true, None) => router.forward_fused(bank),
            (false, norm) => {
                let read = router.forward(bank);
                RouterOutput {
                    mixture: normed(read.mixture, norm),
                    weights: read.weights,
                }
            }
        }
    }

    /// A source made from one of the accumulator's sums, `[batch·seq, d]` token rows: on the
    /// fused path the rows themselves with the mean square formed with the sum where there is one
    /// ([`Source::from_rows`]), on the reference path the `[batch, seq, d]` value.
    fn accumulated_source(
        &self,
        sum: &Tensor<B, 2>,
        mean_square: Option<&Tensor<B, 2>>,
    ) -> Source<B> {
        match self.fused {
            true => Source::from_rows(sum.clone(), self.batch_seq, mean_square.cloned()),
            false => Source::plain(self.per_token(sum)),
        }
    }

    /// `[batch·seq, w]` token rows as `[batch, seq, w]`.
    fn per_token(&self, rows: &Tensor<B, 2>) -> Tensor<B, 3> {
        let [batch, seq] = self.batch_seq;
        rows.clone().reshape([batch, seq, rows.dims()[1]])
    }

    /// The active block's pair `(C^{(r−1)}, slot 2)` once it holds a write, where slot 2 is `D̂`
    /// (eq:rmsmatch), raw `D` without RMS matching, `C` itself for the duplicated-`C` control,
    /// and absent for Block AttnRes or when `with_detail` is false.
    fn active_pair(&self, with_detail: bool) -> Option<SourcePair<B>> {
        let active = &self.active;
        let cumulative =
            self.accumulated_source(active.cumulative()?, active.cumulative_mean_square());
        let (Some(options), true) = (self.options, with_detail) else {
            return Some((cumulative, None));
        };
        let Some(raw) = active
            .detail()
            .filter(|_| options.detail != DetailSource::DuplicatedCumulative)
        else {
            return Some((cumulative.clone(), Some(cumulative)));
        };
        // An early-half detail is the cumulative tensor itself: its source (rows, mean square)
        // is shared rather than derived again.
        let detail_source = || match active.detail_is_cumulative() {
            true => cumulative.clone(),
            false => self.accumulated_source(raw, active.detail_mean_square()),
        };
        let detail = if !options.rms_match {
            detail_source()
        } else if let Some((multiplier, mean_square)) = active.matched_detail() {
            detail_source().rescaled(self.per_token(multiplier), self.per_token(mean_square))
        } else if self.fused {
            rms_match_source(
                detail_source(),
                cumulative.mean_square(),
                options.rms_gamma,
                options.rms_epsilon,
            )
        } else {
            let matched = rms_match(
                raw.clone(),
                active.cumulative()?.clone(),
                options.rms_gamma,
                options.rms_epsilon,
            );
            Source::plain(self.per_token(&matched))
        };
        Some((cumulative, Some(detail)))
    }
}

/// `norm(x)`, or `x` itself without a norm.
pub(super) fn normed<B: HaaresBackend>(x: Tensor<B, 3>, norm: Option<&RmsNorm<B>>) -> Tensor<B, 3> {
    match norm {
        Some(norm) => norm.forward(x),
        None => x,
    }
}

/// An empty accumulator: on the fused path one that keeps each sum's mean square for the sources
/// made from it, and the detail's RMS-matching multiplier where the detail is read matched; on
/// the reference path one that forms none.
fn empty_accumulator<B: HaaresBackend>(
    fused: bool,
    options: Option<HaaresOptions>,
) -> BlockAccumulator<B, 2> {
    let matching = options
        .filter(|options| options.rms_match && options.detail != DetailSource::DuplicatedCumulative)
        .map(|options| RmsMatching {
            gamma: options.rms_gamma,
            epsilon: options.rms_epsilon,
        });
    match (fused, matching) {
        (true, Some(matching)) => BlockAccumulator::matching_details(matching),
        (true, None) => BlockAccumulator::forming_mean_squares(),
        (false, _) => BlockAccumulator::new(),
    }
}
