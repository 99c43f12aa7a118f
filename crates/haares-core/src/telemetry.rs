//! Routing telemetry: the softmax weights of every read site, for analysis. Collected only when
//! asked for ([`HaaresModel::forward_with_trace`](crate::HaaresModel::forward_with_trace)); the plain
//! forward keeps nothing. [`crate::routing_stats`] reduces traces to per-site statistics.

use std::fmt;
use std::str::FromStr;

use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::source_bank::SlotKind;

/// Where a read happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReadSite {
    /// The input of residual event `event` (0-based; block `event / m`, position `event % m + 1`).
    Event {
        /// The event index, `2i` for layer i's attention and `2i + 1` for its MLP.
        event: usize,
    },
    /// The final readout before the tied head (eq:final).
    Final,
}

impl ReadSite {
    /// The site's block `n` and position `r` (both 1-based, eq:sourceset) for `m` events per
    /// block; `None` for the final readout.
    pub fn block_position(self, events_per_block: usize) -> Option<(usize, usize)> {
        match self {
            Self::Event { event } => {
                Some((event / events_per_block + 1, event % events_per_block + 1))
            }
            Self::Final => None,
        }
    }
}

/// Which source a slot of a bank holds (eq:sourceset): the embedding `e`, a completed block's
/// `C_n` or `D̂_n`, or the active block's written prefix `C_n^{(r−1)}` or `D̂_n^{(r−1)}`.
///
/// Written as the paper writes it — `e`, `C_2`, `D_2`, `C_3^(2)` (active, two writes) — which is
/// also its JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId {
    /// The slot's role, which decides its bias.
    pub kind: SlotKind,
    /// The block `n` (1-based) whose pair the slot belongs to; 0 for the embedding.
    pub block: usize,
    /// `Some(r − 1)` for the active block's written prefix, `None` for a completed block.
    pub active_writes: Option<usize>,
}

/// The five groups a read's weight is split into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotGroup {
    /// The embedding `e`.
    Embedding,
    /// Completed cumulative sources `C_i`, `i < n`.
    CompletedCumulative,
    /// Completed detail sources `D̂_i`, `i < n`.
    CompletedDetail,
    /// The active cumulative prefix `C_n^{(r−1)}`.
    ActiveCumulative,
    /// The active detail prefix `D̂_n^{(r−1)}`.
    ActiveDetail,
}

impl SlotGroup {
    /// Every group, in bank order.
    pub const ALL: [Self; 5] = [
        Self::Embedding,
        Self::CompletedCumulative,
        Self::CompletedDetail,
        Self::ActiveCumulative,
        Self::ActiveDetail,
    ];
}

impl SlotId {
    /// The embedding slot.
    pub const EMBEDDING: Self = Self {
        kind: SlotKind::Embedding,
        block: 0,
        active_writes: None,
    };

    /// The group the slot's weight counts towards.
    pub fn group(self) -> SlotGroup {
        match (self.kind, self.active_writes.is_some()) {
            (SlotKind::Embedding, _) => SlotGroup::Embedding,
            (SlotKind::Cumulative, false) => SlotGroup::CompletedCumulative,
            (SlotKind::Detail, false) => SlotGroup::CompletedDetail,
            (SlotKind::Cumulative, true) => SlotGroup::ActiveCumulative,
            (SlotKind::Detail, true) => SlotGroup::ActiveDetail,
        }
    }

    /// Names the slots of a bank in slot order: the embedding, then each block's cumulative slot
    /// followed by its detail slot if it has one; blocks after the first `completed` are the
    /// active block, written `writes` times.
    pub fn name_bank(kinds: &[SlotKind], completed: usize, writes: usize) -> Vec<Self> {
        let mut block = 0;
        kinds
            .iter()
            .map(|&kind| {
                if kind == SlotKind::Cumulative {
                    block += 1;
                }
                match kind {
                    SlotKind::Embedding => Self::EMBEDDING,
                    _ => Self {
                        kind,
                        block,
                        active_writes: (block > completed).then_some(writes),
                    },
                }
            })
            .collect()
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let letter = match self.kind {
            SlotKind::Embedding => return f.write_str("e"),
            SlotKind::Cumulative => 'C',
            SlotKind::Detail => 'D',
        };
        write!(f, "{letter}_{}", self.block)?;
        match self.active_writes {
            Some(writes) => write!(f, "^({writes})"),
            None => Ok(()),
        }
    }
}

impl FromStr for SlotId {
    type Err = crate::HaaresError;

    fn from_str(text: &str) -> Result<Self, crate::HaaresError> {
        if text == "e" {
            return Ok(Self::EMBEDDING);
        }
        let bad = || {
            crate::HaaresError::InvalidInput(format!(
                "`{text}` is not a slot name (e, C_2, D_2, C_3^(2), …)"
            ))
        };
        let (head, writes) = match text.split_once("^(") {
            Some((head, tail)) => {
                let writes = tail.strip_suffix(')').ok_or_else(bad)?;
                (head, Some(writes.parse().map_err(|_| bad())?))
            }
            None => (text, None),
        };
        let kind = match head.get(..2) {
            Some("C_") => SlotKind::Cumulative,
            Some("D_") => SlotKind::Detail,
            _ => return Err(bad()),
        };
        let block = head[2..].parse().map_err(|_| bad())?;
        Ok(Self {
            kind,
            block,
            active_writes: writes,
        })
    }
}

impl Serialize for SlotId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SlotId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The weights of one read site.
#[derive(Debug, Clone)]
pub struct SiteTrace<B: Backend> {
    /// Which read.
    pub site: ReadSite,
    /// Which source each slot holds, in slot order.
    pub slots: Vec<SlotId>,
    /// Softmax weights `α`, shape `[batch, seq, S]`.
    pub weights: Tensor<B, 3>,
}

impl<B: Backend> SiteTrace<B> {
    /// The kind of each slot, in slot order.
    pub fn kinds(&self) -> Vec<SlotKind> {
        self.slots.iter().map(|slot| slot.kind).collect()
    }

    /// The aggregate detail weight `p_D = Z_D / (Z_C + Z_D)` of eq:groupmixture, shape
    /// `[batch, seq]`; zero at sites without detail slots.
    pub fn detail_share(&self) -> Tensor<B, 2> {
        let [batch, seq, _] = self.weights.dims();
        let device = self.weights.device();
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.kind == SlotKind::Detail)
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
