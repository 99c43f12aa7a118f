//! Routing statistics: what the routers of a model do over a set of tokens, per read site — the
//! mean weight `ᾱ_s` of every slot, the weight of each slot group, the detail mass `p_D`
//! (eq:groupmixture), the entropy of `α` and the detail bias `b` (eq:routingweights).
//!
//! A [`RoutingTally`] sums these over the tokens of any number of forward passes (host-side, in
//! f64, one small read-back per pass); [`RoutingTally::finish`] turns the sums into
//! [`RoutingStatistics`]. At initialisation the queries are zero, so every read follows its biases
//! alone and `p_D` is eq:initialmass (`tests/core/routing_stats.rs` checks the paper's 6.3% and
//! 9.8%).

use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

use crate::error::{HaaresError, Result};
use crate::model::HaaresModel;
use crate::source_bank::SlotKind;
use crate::telemetry::{ReadSite, RoutingTrace, SiteTrace, SlotGroup, SlotId};

/// A weight below this is taken as this inside `ln` of the entropy, so that a weight that
/// underflowed to 0 contributes `0 · ln(tiny) = 0` (its limit) instead of NaN.
const ENTROPY_FLOOR: f64 = 1e-30;

/// Per-site token sums of routing quantities, accumulated over forward passes.
#[derive(Debug, Clone, Default)]
pub struct RoutingTally {
    tokens: f64,
    sites: Vec<SiteSums>,
}

#[derive(Debug, Clone)]
struct SiteSums {
    site: ReadSite,
    slots: Vec<SlotId>,
    weights: Vec<f64>,
    entropy: f64,
}

impl RoutingTally {
    /// An empty tally.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tokens counted so far (the sum of the masks).
    pub fn tokens(&self) -> f64 {
        self.tokens
    }

    /// Adds the tokens of one forward pass. `mask` (`[batch, seq]`, 1 to count a position, 0 to
    /// skip it, e.g. a pad) weights each token; `None` counts every position. Reads the sums back
    /// from the device once. An empty trace (an unrouted model) adds nothing.
    ///
    /// # Errors
    /// When `trace` has other read sites or slots than the passes added before (another model).
    pub fn add<B: Backend>(
        &mut self,
        trace: &RoutingTrace<B>,
        mask: Option<&Tensor<B, 2>>,
    ) -> Result<()> {
        let Some(first) = trace.sites.first() else {
            return Ok(());
        };
        if self.sites.is_empty() {
            self.sites = trace.sites.iter().map(SiteSums::empty).collect();
        }
        let same_layout = self.sites.len() == trace.sites.len()
            && self
                .sites
                .iter()
                .zip(&trace.sites)
                .all(|(sums, site)| sums.site == site.site && sums.slots == site.slots);
        if !same_layout {
            return Err(HaaresError::InvalidInput(
                "this trace comes from a model with other read sites than the passes already \
                 tallied; use one RoutingTally per model"
                    .into(),
            ));
        }
        let [batch, seq, _] = first.weights.dims();
        let device = first.weights.device();
        let mask = match mask {
            Some(mask) => mask.clone().reshape([batch * seq, 1]),
            None => Tensor::ones([batch * seq, 1], &device),
        };
        let mut parts = vec![mask.clone().sum().reshape([1, 1])];
        parts.extend(trace.sites.iter().map(|site| token_sums(site, &mask)));
        let sums = Tensor::cat(parts, 1)
            .into_data()
            .convert::<f64>()
            .into_vec::<f64>()
            .map_err(|e| HaaresError::InvalidInput(format!("routing sums unreadable: {e:?}")))?;
        self.tokens += sums[0];
        let mut rest = &sums[1..];
        for site in &mut self.sites {
            let (weights, tail) = rest.split_at(site.slots.len());
            for (total, weight) in site.weights.iter_mut().zip(weights) {
                *total += weight;
            }
            site.entropy += tail[0];
            rest = &tail[1..];
        }
        Ok(())
    }

    /// The means over the tallied tokens, with each site's detail bias read from `model` (the
    /// model whose traces were added).
    pub fn finish<B: Backend>(&self, model: &HaaresModel<B>) -> RoutingStatistics {
        let per_token = 1.0 / self.tokens.max(f64::MIN_POSITIVE);
        let events_per_block = model.config.events_per_block();
        RoutingStatistics {
            tokens: self.tokens,
            sites: self
                .sites
                .iter()
                .map(|sums| {
                    let weights: Vec<f64> = sums.weights.iter().map(|w| w * per_token).collect();
                    let (block, position) = sums.site.block_position(events_per_block).unzip();
                    let groups = GroupMass::of(&sums.slots, &weights);
                    SiteStatistics {
                        site: sums.site,
                        block,
                        position,
                        detail_mass: groups.detail(),
                        groups,
                        slots: sums.slots.clone(),
                        weights,
                        entropy: sums.entropy * per_token,
                        detail_bias: model
                            .router_at(sums.site)
                            .and_then(|router| router.detail_bias_value()),
                    }
                })
                .collect(),
        }
    }
}

impl SiteSums {
    fn empty<B: Backend>(site: &SiteTrace<B>) -> Self {
        Self {
            site: site.site,
            slots: site.slots.clone(),
            weights: vec![0.0; site.slots.len()],
            entropy: 0.0,
        }
    }
}

/// One site's masked token sums `[Σ α_1, …, Σ α_S, Σ H(α)]` as a `[1, S + 1]` row, where
/// `H(α) = −Σ_s α_s ln α_s`.
fn token_sums<B: Backend>(site: &SiteTrace<B>, mask: &Tensor<B, 2>) -> Tensor<B, 2> {
    let [batch, seq, slots] = site.weights.dims();
    let weights = site.weights.clone().reshape([batch * seq, slots]);
    let slot_sums = (weights.clone() * mask.clone()).sum_dim(0);
    let entropy = -(weights.clone() * weights.clamp_min(ENTROPY_FLOOR).log()).sum_dim(1);
    let entropy_sum = (entropy * mask.clone()).sum().reshape([1, 1]);
    Tensor::cat(vec![slot_sums, entropy_sum], 1)
}

/// The mean weight of each slot group at one read site; the five sum to 1.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct GroupMass {
    /// On the embedding `e`.
    pub embedding: f64,
    /// On the completed cumulative sources `C_i`.
    pub completed_cumulative: f64,
    /// On the completed detail sources `D̂_i`.
    pub completed_detail: f64,
    /// On the active prefix `C_n^{(r−1)}`.
    pub active_cumulative: f64,
    /// On the active prefix `D̂_n^{(r−1)}`.
    pub active_detail: f64,
}

impl GroupMass {
    /// Sums per-slot weights into their groups.
    pub fn of(slots: &[SlotId], weights: &[f64]) -> Self {
        let mut mass = Self::default();
        for (slot, weight) in slots.iter().zip(weights) {
            *mass.get_mut(slot.group()) += weight;
        }
        mass
    }

    /// `p_D` (eq:groupmixture): the weight of the detail slots, completed and active. Its mean
    /// over tokens is the sum of the detail slots' mean weights.
    pub fn detail(&self) -> f64 {
        self.completed_detail + self.active_detail
    }

    /// The weight of one group.
    pub fn get(&self, group: SlotGroup) -> f64 {
        let mut copy = *self;
        *copy.get_mut(group)
    }

    fn get_mut(&mut self, group: SlotGroup) -> &mut f64 {
        match group {
            SlotGroup::Embedding => &mut self.embedding,
            SlotGroup::CompletedCumulative => &mut self.completed_cumulative,
            SlotGroup::CompletedDetail => &mut self.completed_detail,
            SlotGroup::ActiveCumulative => &mut self.active_cumulative,
            SlotGroup::ActiveDetail => &mut self.active_detail,
        }
    }
}

/// What the router of one read site did, on average over the tallied tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteStatistics {
    /// The read site.
    pub site: ReadSite,
    /// Its block `n` (1-based); absent for the final readout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<usize>,
    /// Its position `r` in the block (1-based); absent for the final readout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    /// The slots, in bank order.
    pub slots: Vec<SlotId>,
    /// Mean weight `ᾱ_s` of each slot.
    pub weights: Vec<f64>,
    /// Mean weight of each slot group.
    pub groups: GroupMass,
    /// Mean detail mass `p_D` (eq:groupmixture); 0 where the site sees no detail slot.
    pub detail_mass: f64,
    /// Mean entropy of `α` in nats (`ln S` for uniform weights).
    pub entropy: f64,
    /// The site's detail bias `b`, learned or fixed; absent where it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail_bias: Option<f64>,
}

impl SiteStatistics {
    /// Whether the site reads at least one detail slot.
    pub fn has_detail(&self) -> bool {
        self.slots.iter().any(|slot| slot.kind == SlotKind::Detail)
    }
}

/// Per-site routing statistics of a model over a set of tokens.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RoutingStatistics {
    /// Tokens the means are over.
    pub tokens: f64,
    /// One entry per read site, in execution order (events, then the final readout).
    pub sites: Vec<SiteStatistics>,
}

impl RoutingStatistics {
    /// The mean detail mass over the sites that read a detail slot; `None` if none does.
    pub fn mean_detail_mass(&self) -> Option<f64> {
        let masses: Vec<f64> = self
            .sites
            .iter()
            .filter(|site| site.has_detail())
            .map(|site| site.detail_mass)
            .collect();
        (!masses.is_empty()).then(|| masses.iter().sum::<f64>() / masses.len() as f64)
    }

    /// The statistics of one read site.
    pub fn site(&self, site: ReadSite) -> Option<&SiteStatistics> {
        self.sites.iter().find(|stats| stats.site == site)
    }

    /// The site-by-site mean of several statistics of the same model layout (e.g. one per seed):
    /// every per-site quantity averaged, the token counts summed. `None` for an empty list.
    ///
    /// # Errors
    /// When the statistics come from models with different read sites or slots.
    pub fn mean_of(all: &[RoutingStatistics]) -> Result<Option<RoutingStatistics>> {
        let Some(first) = all.first() else {
            return Ok(None);
        };
        let same_layout = |other: &RoutingStatistics| {
            other.sites.len() == first.sites.len()
                && other
                    .sites
                    .iter()
                    .zip(&first.sites)
                    .all(|(a, b)| a.site == b.site && a.slots == b.slots)
        };
        if !all.iter().all(same_layout) {
            return Err(HaaresError::InvalidInput(
                "routing statistics of models with different read sites cannot be averaged".into(),
            ));
        }
        let n = all.len() as f64;
        let mean =
            |value: &dyn Fn(&RoutingStatistics) -> f64| all.iter().map(value).sum::<f64>() / n;
        let sites = (0..first.sites.len())
            .map(|i| {
                let weights: Vec<f64> = (0..first.sites[i].slots.len())
                    .map(|slot| mean(&|stats| stats.sites[i].weights[slot]))
                    .collect();
                let biases: Vec<f64> = all.iter().filter_map(|s| s.sites[i].detail_bias).collect();
                let groups = GroupMass::of(&first.sites[i].slots, &weights);
                SiteStatistics {
                    detail_mass: groups.detail(),
                    groups,
                    weights,
                    entropy: mean(&|stats| stats.sites[i].entropy),
                    detail_bias: (!biases.is_empty())
                        .then(|| biases.iter().sum::<f64>() / biases.len() as f64),
                    ..first.sites[i].clone()
                }
            })
            .collect();
        Ok(Some(RoutingStatistics {
            tokens: all.iter().map(|stats| stats.tokens).sum(),
            sites,
        }))
    }
}
