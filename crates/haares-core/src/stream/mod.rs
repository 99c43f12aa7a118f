//! The residual stream: the residual method of the paper as a part to put around any sublayers.
//!
//! A Transformer's depth is a sequence of residual events `t = 0 … T−1`, each a sublayer
//! `u_t = f_t(Norm(x_t))` (eq:sublayer). The stream decides what each sublayer reads (`x_t`) and
//! what becomes of what it writes (`u_t`), for every residual method of the paper:
//!
//! | method | `x_t` (read) | after `u_t` (write) | final readout |
//! |---|---|---|---|
//! | Standard, ReZero, LayerScale | the hidden state `h` | `h ← h + u`, `h + g·u`, `h + λ ⊙ u` | `h` |
//! | Block AttnRes, HAARES | `h̃_t = Σ_s α_s s` over eq:sourceset's bank | added to the active block's `C` and `D` (eq:update) | eq:final over `{e, C_1 … C_N}` |
//!
//! For the routed methods the `T` events form `N` blocks of `m = T/N`. Event `t` is block
//! `n = ⌊t/m⌋ + 1`, position `r = t mod m + 1`, and reads (eq:sourceset, tab:timing):
//! the embedding `e`; every completed pair `(C_i, D̂_i)`, `i < n`; and, once the active block
//! holds a write (`r > 1`), its prefix `(C_n^{(r−1)}, D̂_n^{(r−1)})`. A write adds `u_t` to
//! `C` and to `D` with the sign `s_{n,r}` (`+1` in the first half `r ≤ ⌈m/2⌉`, `−1` after, or
//! the ablation's signs); the `m`-th write completes the pair. `D` is RMS-matched to `C` before
//! it is read (eq:rmsmatch). The last block's detail is never read: the final readout is
//! cumulative-only. Block AttnRes is the same walk with no detail slot.
//!
//! [`ResidualStream`] is the Burn module with the method's parameters: one depth router per
//! read site and the final router (routed methods), one ReZero gate or LayerScale scale per
//! event (those methods). [`ResidualStream::start`] begins a forward pass, and the
//! [`StreamState`] it returns walks the events in order: `read(t)`, the sublayer, `write(t, u)`,
//! …, then `finish()`. A call out of order is an error that names the call expected.
//! [`HaaresModel`](crate::HaaresModel) is built on it, two events per layer;
//! `docs/library.md` shows it around other sublayers.

mod parameters;
mod sources;
mod state;

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::{Tensor, backend::Backend};

use crate::accumulator::detail_signs;
use crate::error::HaaresError;
use crate::limits::{MAX_LAYERS, MAX_WIDTH, check_partition};
use crate::method::{HaaresOptions, ResidualMethod, layer_scale_init};
use crate::ops::{HaaresBackend, RoutingPath};
use crate::router::{DepthRouter, DepthRouterConfig};
use crate::telemetry::RoutingTrace;

pub use state::StreamState;

/// Configuration of a [`ResidualStream`]. Defaults are the paper's (tab:reprobackbone).
#[derive(Config, Debug, PartialEq)]
pub struct ResidualStreamConfig {
    /// Hidden width d of the embedding, of every sublayer's input and output.
    pub d_model: usize,
    /// Residual events T: the sublayers the stream runs through, in order (2L for a Transformer
    /// of L attention + MLP layers, 3L for three sublayers per layer).
    pub events: usize,
    /// Block count N of the routed methods; must divide `events`. Ignored by unrouted methods.
    pub blocks: usize,
    /// The residual method. Default: full HAARES.
    #[config(default = "ResidualMethod::Haares(HaaresOptions::paper())")]
    pub method: ResidualMethod,
    /// ε of the routers' key RMSNorm. Default: 1e-6 (docs/decisions.md, decision 2).
    #[config(default = 1e-6)]
    pub norm_epsilon: f64,
    /// How the depth routers are computed; results agree to float rounding. Default: `Auto`.
    #[config(default = "RoutingPath::Auto")]
    pub routing: RoutingPath,
    /// The depth L (layers, not events) whose rule ([`layer_scale_init`]) gives LayerScale's
    /// initial scale when the method names none: required then, since a stream does not know how
    /// many events make a layer. Default: `None` (refused for LayerScale without a scale).
    #[config(default = "None")]
    pub layer_scale_depth: Option<usize>,
}

impl ResidualStreamConfig {
    /// Events per block, m = T / N.
    pub fn events_per_block(&self) -> usize {
        self.events / self.blocks.max(1)
    }

    /// Checks that this configuration describes a valid stream; the error
    /// ([`HaaresError::InvalidStream`]) names the field and says how to fix it.
    pub fn validate(&self) -> crate::Result<()> {
        self.validate_fields().map_err(|error| match error {
            HaaresError::InvalidConfig { field, message } => {
                HaaresError::InvalidStream { field, message }
            }
            other => other,
        })
    }

    fn validate_fields(&self) -> crate::Result<()> {
        for (field, value, bound) in [
            ("d_model", self.d_model, MAX_WIDTH),
            ("events", self.events, 2 * MAX_LAYERS),
            ("blocks", self.blocks, 2 * MAX_LAYERS),
        ] {
            if value == 0 || value > bound {
                return Err(HaaresError::config(
                    field,
                    format!("must be between 1 and {bound}, got {value}"),
                ));
            }
        }
        if self.method.is_routed() {
            check_partition(self.events, self.blocks, "T")?;
        }
        if !(self.norm_epsilon.is_finite() && self.norm_epsilon > 0.0) {
            return Err(HaaresError::config(
                "norm_epsilon",
                format!(
                    "must be a positive finite number, got {}",
                    self.norm_epsilon
                ),
            ));
        }
        match (self.method, self.layer_scale_depth) {
            (ResidualMethod::LayerScale { init: None }, None) => {
                return Err(HaaresError::config(
                    "layer_scale_depth",
                    "LayerScale's initial scale follows the model's depth L in layers \
                     (method::layer_scale_init), which the event count alone does not give: set \
                     `with_layer_scale_depth(Some(L))`, or name the scale in the method \
                     (`ResidualMethod::LayerScale { init: Some(..) }`)",
                ));
            }
            (_, Some(0)) => {
                return Err(HaaresError::config(
                    "layer_scale_depth",
                    "must be at least 1 layer when given",
                ));
            }
            _ => {}
        }
        self.method.validate()
    }

    /// Builds the stream: router queries zero, detail biases at their initial value, ReZero gates
    /// zero, LayerScale at its initial scale. Nothing is drawn from the backend's RNG, so a clone
    /// holds the same values whether or not Burn has built the parameters yet; a model around
    /// the stream materialises its own random ones ([`crate::materialise()`]).
    pub fn init<B: Backend>(&self, device: &B::Device) -> crate::Result<ResidualStream<B>> {
        self.validate()?;
        let router = |detail_bias| {
            DepthRouterConfig::new(self.d_model)
                .with_detail_bias(detail_bias)
                .with_norm_epsilon(self.norm_epsilon)
                .init(device)
        };
        let detail_bias = self.method.haares_options().map(|o| o.detail_bias);
        let per_event = |width: usize, value: f64| -> Vec<Param<Tensor<B, 1>>> {
            (0..self.events)
                .map(|_| Param::from_tensor(Tensor::full([width], value, device)))
                .collect()
        };
        let routed = self.method.is_routed();
        let layer_scale = match (self.method, self.layer_scale_depth) {
            (ResidualMethod::LayerScale { init: Some(init) }, _) => Some(init),
            (ResidualMethod::LayerScale { init: None }, Some(depth)) => {
                Some(layer_scale_init(depth))
            }
            _ => None,
        };
        Ok(ResidualStream {
            routers: match routed {
                true => (0..self.events).map(|_| router(detail_bias)).collect(),
                false => Vec::new(),
            },
            final_router: routed.then(|| router(None)),
            gates: match self.method {
                ResidualMethod::ReZero => per_event(1, 0.0),
                _ => Vec::new(),
            },
            scales: layer_scale.map_or_else(Vec::new, |init| per_event(self.d_model, init)),
            signs: match self.method.haares_options() {
                Some(options) => detail_signs(options.detail, self.blocks, self.events_per_block()),
                None => Vec::new(),
            },
            config: self.clone(),
        })
    }
}

/// The residual method's parameters and its walk over the residual events (eq:sourceset,
/// eq:update, eq:rmsmatch, eq:routingweights, eq:final for the routed methods).
///
/// Its parts are reached through accessors (`parameters.rs`): the parameters can be read and
/// changed, but not the lists that hold them, the configuration (bar the routing path) or the
/// detail signs, so that the stream stays in step with the configuration it was built from.
#[derive(Module, Debug)]
pub struct ResidualStream<B: Backend> {
    /// The depth router of each read site, in event order (Block AttnRes, HAARES; else empty).
    routers: Vec<DepthRouter<B>>,
    /// The router of the final readout over `{e, C_1 … C_N}` (Block AttnRes, HAARES).
    final_router: Option<DepthRouter<B>>,
    /// ReZero's scalar gate `[1]` of each event, zero-initialised (ReZero; else empty).
    gates: Vec<Param<Tensor<B, 1>>>,
    /// LayerScale's per-channel scale `[d]` of each event (LayerScale; else empty).
    scales: Vec<Param<Tensor<B, 1>>>,
    /// Detail signs `s_{n,r}`, `[block][position]` (HAARES variants; else empty).
    #[module(skip)]
    signs: Vec<Vec<f64>>,
    /// The configuration the stream was built from.
    #[module(skip)]
    config: ResidualStreamConfig,
}

impl<B: Backend> ResidualStream<B> {
    /// The HAARES options, if the method is a HAARES variant.
    fn haares_options(&self) -> Option<&HaaresOptions> {
        self.config.method.haares_options()
    }
}

impl<B: HaaresBackend> ResidualStream<B> {
    /// Whether reads run on the fused path ([`RoutingPath::Fused`] for this backend), where
    /// [`StreamState::read_normed`] folds the sublayer's RMSNorm into the read itself.
    pub fn folds_norm(&self) -> bool {
        self.config.method.is_routed() && self.config.routing.resolve::<B>() == RoutingPath::Fused
    }

    /// Begins a forward pass from the token embedding `e`; with a `trace`, records the routing
    /// weights of every read site into it (nothing for unrouted methods), the final readout's
    /// once the pass finishes. A stream whose parameters no longer match its configuration (one
    /// replaced by a parameter of another width) is refused with [`HaaresError::InvalidStream`].
    ///
    /// # Shapes
    /// - embedding: `[batch, seq, d]`
    pub fn start<'a>(
        &'a self,
        embedding: Tensor<B, 3>,
        trace: Option<&'a mut RoutingTrace<B>>,
    ) -> crate::Result<StreamState<'a, B>> {
        self.check_parameters()?;
        StreamState::new(self, embedding, trace)
    }
}
