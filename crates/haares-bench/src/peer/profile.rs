//! What PyTorch eager's steady step spent its time on (`torch_peer.py profile`): the peer's
//! phases, `torch.profiler`'s operations and its matrix products by shape, as `anatomy` sets them
//! beside ours.

use haares_core::op_times::ProductShape;
use serde::{Deserialize, Serialize};

/// Where the peer's steady step went: the median forward (with the loss), backward and update
/// seconds, and `torch.profiler`'s operations with their self time and calls per step, slowest
/// first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerProfile {
    /// Forward, backward, update seconds, timed without the profiler.
    pub phase_s: [f64; 3],
    /// The profiler's operations.
    pub operations: Vec<PeerOperation>,
    /// Its matrix products (`aten::mm`, `aten::addmm`, `aten::bmm`) by shape, each call's wall
    /// time outside the profiler (whose shape recording slowed them by half on a 2-core host).
    #[serde(default)]
    pub products: Vec<PeerProduct>,
}

/// One shape of PyTorch's matrix products: `matrices` products `[m, k] · [k, n]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerProduct {
    /// Products in the batch (1 for `aten::mm`).
    pub matrices: usize,
    /// Rows of the left operand.
    pub m: usize,
    /// The shared dimension.
    pub k: usize,
    /// Columns of the right operand.
    pub n: usize,
    /// Wall seconds per step.
    pub seconds: f64,
    /// Calls per step.
    pub calls: f64,
}

impl PeerProduct {
    /// Its shape as ours are kept.
    pub fn shape(&self) -> ProductShape {
        ProductShape::new(self.matrices, self.m, self.k, self.n)
    }
}

/// One of `torch.profiler`'s operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerOperation {
    /// Its name (`aten::mm`, …).
    pub name: String,
    /// Self CPU seconds per step.
    pub self_s: f64,
    /// Calls per step.
    pub calls: f64,
}
