//! Routing telemetry: the softmax weights of every read site, for analysis. Collected only when
//! asked for ([`HaaresModel::forward_with_trace`](crate::HaaresModel::forward_with_trace)); the plain
//! forward keeps nothing.

use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::source_bank::SlotKind;

/// Where a read happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadSite {
    /// The input of residual event `event` (0-based; block `event / m`, position `event % m + 1`).
    Event {
        /// The event index, `2i` for layer i's attention and `2i + 1` for its MLP.
        event: usize,
    },
    /// The final readout before the tied head (eq:final).
    Final,
}

/// The weights of one read site.
#[derive(Debug, Clone)]
pub struct SiteTrace<B: Backend> {
    /// Which read.
    pub site: ReadSite,
    /// The kind of each slot, in slot order.
    pub kinds: Vec<SlotKind>,
    /// Softmax weights `α`, shape `[batch, seq, S]`.
    pub weights: Tensor<B, 3>,
}

impl<B: Backend> SiteTrace<B> {
    /// The aggregate detail weight `p_D = Z_D / (Z_C + Z_D)` of eq:groupmixture, shape
    /// `[batch, seq]`; zero at sites without detail slots.
    pub fn detail_share(&self) -> Tensor<B, 2> {
        let [batch, seq, _] = self.weights.dims();
        let device = self.weights.device();
        self.kinds
            .iter()
            .enumerate()
            .filter(|(_, kind)| **kind == SlotKind::Detail)
            .map(|(slot, _)| self.weights.clone().narrow(2, slot, 1))
            .reduce(|sum, weight| sum + weight)
            .map(|share| share.squeeze_dim::<2>(2))
            .unwrap_or_else(|| Tensor::zeros([batch, seq], &device))
    }
}

/// The weights of every read site of one forward pass, in execution order (intermediate sites by
/// event, then the final readout). Empty for unrouted methods.
#[derive(Debug, Clone, Default)]
pub struct RoutingTrace<B: Backend> {
    /// One entry per read site.
    pub sites: Vec<SiteTrace<B>>,
}
