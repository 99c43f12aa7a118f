//! The source bank read before each residual event (eq:sourceset) and the final readout's bank
//! (eq:final).

use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

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

/// An indexed collection of source slots. Slots are candidates, not values: two slots whose tensors
/// coincide (the early-half active pair) are still two slots (eq:sourceset).
#[derive(Debug, Clone)]
pub struct SourceBank<B: Backend> {
    values: Vec<Tensor<B, 3>>,
    kinds: Vec<SlotKind>,
}

impl<B: Backend> SourceBank<B> {
    /// A bank holding only the embedding, which is always present.
    pub fn new(embedding: Tensor<B, 3>) -> Self {
        Self {
            values: vec![embedding],
            kinds: vec![SlotKind::Embedding],
        }
    }

    /// Adds one slot.
    pub fn push(&mut self, kind: SlotKind, value: Tensor<B, 3>) {
        self.values.push(value);
        self.kinds.push(kind);
    }

    /// Adds a block's pair: its cumulative slot and, for HAARES, its detail slot.
    pub fn push_pair(&mut self, cumulative: Tensor<B, 3>, detail: Option<Tensor<B, 3>>) {
        self.push(SlotKind::Cumulative, cumulative);
        if let Some(detail) = detail {
            self.push(SlotKind::Detail, detail);
        }
    }

    /// The slot values, in slot order.
    pub fn values(&self) -> &[Tensor<B, 3>] {
        &self.values
    }

    /// The slot kinds, in slot order.
    pub fn kinds(&self) -> &[SlotKind] {
        &self.kinds
    }

    /// Number of slots S.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Always false: the embedding slot is always present.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}
