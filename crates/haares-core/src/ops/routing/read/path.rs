//! Which path a depth router reads its sources by: the literal equation or the routing operator,
//! chosen per backend where the configuration leaves it to the backend.

use serde::{Deserialize, Serialize};

use super::RoutingBackend;

/// Which implementation of the depth router reads the source banks. Both compute eq:routingweights;
/// they differ in rounding only (see [`crate::router`]), and the model's configuration names one
/// ([`crate::ModelConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutingPath {
    /// The backend's own choice (see [`RoutingPath::resolve`]): the fused path where it was
    /// measured faster and passes its checks, the reference path elsewhere.
    #[default]
    Auto,
    /// The literal equation: every slot normalised into a key at every read site.
    Reference,
    /// The routing operator ([`crate::ops::routing`]): key norm folded into the query, each
    /// source's mean square computed once and shared, its own backward pass, and CubeCL kernels
    /// on the cube backends.
    Fused,
}

impl RoutingPath {
    /// The path this one stands for on backend `B`: `Auto` becomes
    /// [`RoutingBackend::auto_routing`] — the fused path on
    /// the CPU backends and on CUDA, where it was faster in every measurement and passes every
    /// check, and the reference path on wgpu, whose kernels have not been timed on a GPU
    /// (docs/benchmarks.md, "Current results").
    pub fn resolve<B: RoutingBackend>(self) -> Self {
        match self {
            Self::Auto => B::auto_routing(),
            explicit => explicit,
        }
    }
}
