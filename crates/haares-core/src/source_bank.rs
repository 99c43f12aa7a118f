//! The source bank read before each residual event (eq:sourceset) and the final readout's bank
//! (eq:final).

use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::ops::HaaresBackend;

/// The role of a source slot; it decides the slot's routing bias (eq:routingweights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SlotKind {
    /// The token embedding `e` (bias 0).
    Embedding,
    /// A cumulative source `C_i` or `C_n^{(r−1)}` (bias 0).
    Cumulative,
    /// A detail source `D̂_i` or `D̂_n^{(r−1)}` (the read site's detail bias).
    Detail,
}

/// A source slot's value, optionally with its per-token mean square `mean(s²)` over the hidden
/// dimension, its token rows, and a constant per-token scale. The fused router builds every key
/// norm from the mean square; computing it once per source lets every later read site (and RMS
/// matching, eq:rmsmatch) share it instead of reducing the source again. The token rows are the
/// layout the routing operator reads; keeping them lets every read site share one `[tokens, d]`
/// tensor (on Burn's NdArray, reshaping a tensor that is referenced elsewhere copies it, and the
/// operator's backward pass keeps what it reads). The scale lets RMS matching hand over `D̂ = a·D`
/// without forming it: the fused router applies `a` to its per-token scalars instead.
#[derive(Debug, Clone)]
pub struct Source<B: Backend> {
    raw: Tensor<B, 3>,
    rows: Option<Tensor<B, 2>>,
    scale: Option<Tensor<B, 3>>,
    mean_square: Option<Tensor<B, 3>>,
}

impl<B: Backend> Source<B> {
    /// A source whose mean square is computed on first use by each reader.
    pub fn plain(value: Tensor<B, 3>) -> Self {
        Self {
            raw: value,
            rows: None,
            scale: None,
            mean_square: None,
        }
    }

    /// The slot `scale ⊙ raw` for a per-token `scale` that receives no gradient (it is detached
    /// here), given the slot's own mean square `mean((scale ⊙ raw)²)`.
    ///
    /// # Shapes
    /// - raw: `[batch, seq, d]`; scale, mean_square: `[batch, seq, 1]`
    pub fn scaled(raw: Tensor<B, 3>, scale: Tensor<B, 3>, mean_square: Tensor<B, 3>) -> Self {
        Self::plain(raw).rescaled(scale, mean_square)
    }

    /// This slot times a further per-token `scale` that receives no gradient, given the new
    /// slot's mean square; the stored tensor and its token rows are shared, not copied.
    ///
    /// # Shapes
    /// - scale, mean_square: `[batch, seq, 1]`
    pub fn rescaled(self, scale: Tensor<B, 3>, mean_square: Tensor<B, 3>) -> Self {
        let scale = match self.scale {
            Some(own) => own * scale.detach(),
            None => scale.detach(),
        };
        Self {
            scale: Some(scale),
            mean_square: Some(mean_square),
            ..self
        }
    }

    /// The tensor the slot is stored as, before its scale, `[batch, seq, d]`.
    pub fn raw(&self) -> &Tensor<B, 3> {
        &self.raw
    }

    /// The stored tensor as `[batch·seq, d]` token rows (see [`rows`]): the ones kept since the
    /// source was made, or a fresh reshape.
    pub fn rows(&self) -> Tensor<B, 2> {
        self.rows.clone().unwrap_or_else(|| rows(self.raw.clone()))
    }

    /// The slot's constant per-token scale, `[batch, seq, 1]`, if it has one.
    pub fn scale(&self) -> Option<&Tensor<B, 3>> {
        self.scale.as_ref()
    }

    /// The slot's value `scale ⊙ raw`, `[batch, seq, d]` (formed here when the slot is scaled).
    pub fn value(&self) -> Tensor<B, 3> {
        match &self.scale {
            Some(scale) => scale_rows(self.raw.clone(), scale.clone()),
            None => self.raw.clone(),
        }
    }

    /// The cached mean square of the slot's value, or a fresh one.
    pub fn mean_square(&self) -> Tensor<B, 3> {
        self.mean_square
            .clone()
            .unwrap_or_else(|| mean_square(self.value()))
    }
}

impl<B: HaaresBackend> Source<B> {
    /// A source with its token rows and mean square computed now (kept in the autodiff graph, so
    /// gradients flow through them into the value), the mean square by the routing operator's
    /// [`SourceWriteBackend::row_mean_square`](crate::ops::SourceWriteBackend::row_mean_square).
    pub fn with_mean_square(value: Tensor<B, 3>) -> Self {
        let [batch, seq, _] = value.dims();
        let token_rows = rows(value.clone());
        let mean_square = B::row_mean_square(token_rows.clone()).reshape([batch, seq, 1]);
        Self {
            raw: value,
            rows: Some(token_rows),
            scale: None,
            mean_square: Some(mean_square),
        }
    }

    /// A source made from its `[batch·seq, d]` token rows, with the mean square formed beside
    /// them where there is one (`[batch·seq, 1]`; else computed now, as
    /// [`with_mean_square`](Self::with_mean_square) does). The rows are what every read takes,
    /// so a read's backward pass adds its gradient to the one the rows' own node has gathered
    /// (the accumulator's next write), where a source made from a `[batch, seq, d]` value hands
    /// it to that value through a reshape, which adds it in a pass of its own.
    pub fn from_rows(
        rows: Tensor<B, 2>,
        [batch, seq]: [usize; 2],
        mean_square: Option<Tensor<B, 2>>,
    ) -> Self {
        let d_model = rows.dims()[1];
        let mean_square = mean_square.unwrap_or_else(|| B::row_mean_square(rows.clone()));
        Self {
            raw: rows.clone().reshape([batch, seq, d_model]),
            rows: Some(rows),
            scale: None,
            mean_square: Some(mean_square.reshape([batch, seq, 1])),
        }
    }
}

/// `scale ⊙ x` for a per-token scale, computed on token rows (see [`rows`]).
///
/// # Shapes
/// - x: `[batch, seq, d]`; scale: `[batch, seq, 1]`
/// - output: `[batch, seq, d]`
pub fn scale_rows<B: Backend>(x: Tensor<B, 3>, scale: Tensor<B, 3>) -> Tensor<B, 3> {
    let [batch, seq, d] = x.dims();
    (rows(x) * scale.reshape([batch * seq, 1])).reshape([batch, seq, d])
}

/// Per-token `mean(x²)` over the last dimension, kept as a size-1 dimension.
///
/// # Shapes
/// - x: `[batch, seq, d]`
/// - output: `[batch, seq, 1]`
pub fn mean_square<B: Backend>(x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [batch, seq, _] = x.dims();
    rows(x).square().mean_dim(1).reshape([batch, seq, 1])
}

/// A `[batch, seq, d]` activation as the `[batch·seq, d]` matrix of its token rows: a view on most
/// backends, but a copy on Burn's NdArray when the tensor is also referenced elsewhere (so
/// [`Source`] keeps the rows it makes). The fused routing path works on rows: on Flex, a weight
/// column narrowed out of `[batch, seq, S]` times a `[batch, seq, d]` activation is ≈ 50–60× slower
/// than the same product as `[tokens, d]` rows times a contiguous `[tokens, 1]` column
/// (haares-bench's `layout` benchmark).
pub fn rows<B: Backend>(x: Tensor<B, 3>) -> Tensor<B, 2> {
    let [batch, seq, d] = x.dims();
    x.reshape([batch * seq, d])
}

/// An indexed collection of source slots. Slots are candidates, not values: two slots whose tensors
/// coincide (the early-half active pair) are still two slots (eq:sourceset).
#[derive(Debug, Clone)]
pub struct SourceBank<B: Backend> {
    sources: Vec<Source<B>>,
    kinds: Vec<SlotKind>,
}

impl<B: Backend> SourceBank<B> {
    /// A bank holding only the embedding, which is always present.
    pub fn new(embedding: Tensor<B, 3>) -> Self {
        Self::from_embedding(Source::plain(embedding))
    }

    /// A bank holding only the embedding source (with its cached mean square, if any).
    pub fn from_embedding(embedding: Source<B>) -> Self {
        Self {
            sources: vec![embedding],
            kinds: vec![SlotKind::Embedding],
        }
    }

    /// Adds one slot.
    pub fn push(&mut self, kind: SlotKind, value: Tensor<B, 3>) {
        self.push_source(kind, Source::plain(value));
    }

    /// Adds one slot whose source may carry its mean square.
    pub fn push_source(&mut self, kind: SlotKind, source: Source<B>) {
        self.sources.push(source);
        self.kinds.push(kind);
    }

    /// Adds a block's pair: its cumulative slot and, for HAARES, its detail slot.
    pub fn push_pair(&mut self, cumulative: Tensor<B, 3>, detail: Option<Tensor<B, 3>>) {
        self.push_source_pair(Source::plain(cumulative), detail.map(Source::plain));
    }

    /// [`push_pair`](Self::push_pair) for sources that may carry their mean squares.
    pub fn push_source_pair(&mut self, cumulative: Source<B>, detail: Option<Source<B>>) {
        self.push_source(SlotKind::Cumulative, cumulative);
        if let Some(detail) = detail {
            self.push_source(SlotKind::Detail, detail);
        }
    }

    /// The slot values, in slot order.
    pub fn values(&self) -> Vec<Tensor<B, 3>> {
        self.sources.iter().map(Source::value).collect()
    }

    /// The slot sources, in slot order.
    pub fn sources(&self) -> &[Source<B>] {
        &self.sources
    }

    /// The slot kinds, in slot order.
    pub fn kinds(&self) -> &[SlotKind] {
        &self.kinds
    }

    /// Number of slots S.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Always false: the embedding slot is always present.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }
}
