//! The stream's parts as its users reach them: its configuration, its parameters (to read, to
//! initialise otherwise, to load), never the lists that hold them, and the check that a stream
//! still matches its configuration before a pass.

use burn::module::Param;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{ResidualStream, ResidualStreamConfig};
use crate::error::HaaresError;
use crate::ops::RoutingPath;
use crate::router::DepthRouter;
use crate::telemetry::ReadSite;

impl<B: Backend> ResidualStream<B> {
    /// The configuration the stream was built from.
    pub fn config(&self) -> &ResidualStreamConfig {
        &self.config
    }

    /// Chooses how the routers are computed from now on. The only field of the configuration
    /// that can change after `init`: the paths agree to float rounding and hold the same
    /// parameters.
    pub fn set_routing(&mut self, routing: RoutingPath) {
        self.config.routing = routing;
    }

    /// The depth router of each read site, in event order (Block AttnRes, HAARES; else empty).
    pub fn routers(&self) -> &[DepthRouter<B>] {
        &self.routers
    }

    /// The routers, to change their parameters (not their number).
    pub fn routers_mut(&mut self) -> &mut [DepthRouter<B>] {
        &mut self.routers
    }

    /// The router of the final readout over `{e, C_1 … C_N}` (Block AttnRes, HAARES).
    pub fn final_router(&self) -> Option<&DepthRouter<B>> {
        self.final_router.as_ref()
    }

    /// The final router, to change its parameters.
    pub fn final_router_mut(&mut self) -> Option<&mut DepthRouter<B>> {
        self.final_router.as_mut()
    }

    /// The routers and the final router at once, to change all their parameters in one walk.
    pub fn routers_and_final_mut(
        &mut self,
    ) -> (&mut [DepthRouter<B>], Option<&mut DepthRouter<B>>) {
        (&mut self.routers, self.final_router.as_mut())
    }

    /// The router of a read site; `None` for unrouted methods or an event past the last.
    pub fn router_at(&self, site: ReadSite) -> Option<&DepthRouter<B>> {
        match site {
            ReadSite::Event { event } => self.routers.get(event),
            ReadSite::Final => self.final_router.as_ref(),
        }
    }

    /// ReZero's scalar gate `[1]` of each event (ReZero; else empty).
    pub fn gates(&self) -> &[Param<Tensor<B, 1>>] {
        &self.gates
    }

    /// The gates, to change their values (not their number).
    pub fn gates_mut(&mut self) -> &mut [Param<Tensor<B, 1>>] {
        &mut self.gates
    }

    /// LayerScale's per-channel scale `[d]` of each event (LayerScale; else empty).
    pub fn scales(&self) -> &[Param<Tensor<B, 1>>] {
        &self.scales
    }

    /// The scales, to change their values (not their number).
    pub fn scales_mut(&mut self) -> &mut [Param<Tensor<B, 1>>] {
        &mut self.scales
    }

    /// The detail signs `s_{n,r}`, `[block][position]` (HAARES variants; else empty): fixed by
    /// the method and the partition.
    pub fn signs(&self) -> &[Vec<f64>] {
        &self.signs
    }

    /// Refuses a stream whose parameters no longer match its configuration: a parameter
    /// replaced (through [`routers_mut`](Self::routers_mut), [`gates_mut`](Self::gates_mut),
    /// [`scales_mut`](Self::scales_mut)) by one of another width. The lists themselves cannot
    /// change length from outside, and Burn refuses a record of another length.
    pub(super) fn check_parameters(&self) -> crate::Result<()> {
        let d = self.config.d_model;
        let widths = self
            .routers
            .iter()
            .chain(self.final_router.as_ref())
            .flat_map(|router| {
                [
                    ("routers", "query", router.query.val().dims()[0], d),
                    (
                        "routers",
                        "key-norm weight",
                        router.key_norm.weight.val().dims()[0],
                        d,
                    ),
                ]
            })
            .chain(
                self.gates
                    .iter()
                    .map(|g| ("gates", "gate", g.val().dims()[0], 1)),
            )
            .chain(
                self.scales
                    .iter()
                    .map(|s| ("scales", "scale", s.val().dims()[0], d)),
            );
        for (field, what, found, expected) in widths {
            if found != expected {
                return Err(HaaresError::InvalidStream {
                    field,
                    message: format!(
                        "a {what} of the stream has width {found}, and its configuration needs \
                         {expected} (d_model = {d}); replace a parameter only by one of its width"
                    ),
                });
            }
        }
        Ok(())
    }
}
