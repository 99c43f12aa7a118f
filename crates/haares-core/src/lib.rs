//! # haares-core
//!
//! HAARES (Half-Split Residual Basis Routing for Deep Transformers) and its baselines as
//! backend-generic [Burn](https://burn.dev) modules.
//!
//! A HAARES Transformer groups its 2L residual events (attention, MLP, attention, …) into N
//! contiguous blocks. Each block keeps its cumulative sum `C` and the detail `D` = first-half sum −
//! second-half sum (eq:bases), accumulated online (eq:partial, eq:update). Every attention and MLP
//! sublayer reads its input as a softmax mixture over the embedding, the completed pairs and the
//! active written prefix (eq:sourceset, eq:routingweights); the detail is RMS-matched to `C` first
//! (eq:rmsmatch). The final readout routes over cumulative sources only (eq:final).
//!
//! The same [`HaaresModel`] runs every residual method of the paper, chosen by
//! [`ResidualMethod`]: Standard Residual, ReZero, LayerScale, Block AttnRes, HAARES and its
//! ablations ([`HaaresOptions`]).
//!
//! To run a residual method around sublayers of your own, any number per layer, hold a
//! [`ResidualStream`] and walk its events: [`stream`] has the protocol, the repository's
//! `docs/library.md` the guide.
//!
//! Equation names (`eq:…`, `tab:…`) are the `\label`s of the paper's LaTeX source.
//!
//! ## Example
//!
//! Build a small HAARES model, run a forward pass and read the routing weights:
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::{Int, Tensor};
//! use haares_core::{ModelConfig, ResidualMethod};
//!
//! type B = NdArray<f32>;
//! let device = Default::default();
//! // 2 layers = 4 residual events in N = 2 blocks of m = 2.
//! let config = ModelConfig::new(256, 32, 64, 2).with_blocks(2).with_method(ResidualMethod::haares());
//! let model = config.init::<B>(&device)?;
//!
//! let tokens = Tensor::<B, 2, Int>::from_ints([[2, 72, 105, 33]], &device);
//! let (logits, trace) = model.forward_with_trace(tokens)?;
//! assert_eq!(logits.dims(), [1, 4, 256]);
//!
//! // One entry per read site: 4 events and the final readout.
//! assert_eq!(trace.sites.len(), 5);
//! // At initialisation queries are zero, so the weights follow the biases alone: the first
//! // active read sees e, C, D̂ with biases 0, 0, −2, i.e. p_D = e⁻²/(2 + e⁻²) ≈ 6.3% (eq:initialmass).
//! let p_detail: f32 = trace.sites[1].detail_share().mean().into_scalar();
//! assert!((p_detail - 0.0634).abs() < 1e-3);
//! # Ok::<(), haares_core::HaaresError>(())
//! ```
#![warn(missing_docs)]

/// The crate README's examples, compiled and run as doctests so that they cannot drift.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod accumulator;
pub mod analysis;
pub mod attention;
mod autodiff_node;
pub mod backend;
pub mod checkpoint;
pub mod config;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub mod cuda_sources;
pub mod error;
pub mod flops;
pub mod graph_gate;
pub mod layer;
pub mod limits;
pub mod materialise;
pub mod method;
pub mod model;
#[cfg(feature = "ndarray")]
mod ndarray_host;
pub mod norm;
pub mod op_times;
pub mod ops;
pub mod rms_match;
pub mod rotary;
pub mod router;
pub mod routing_stats;
#[cfg(feature = "flex")]
mod simd;
pub mod source_bank;
pub mod stream;
pub mod swiglu;
pub mod telemetry;

/// RoPE's table under its earlier module name ([`rotary`]).
#[doc(hidden)]
pub use rotary as rope;
/// The SwiGLU MLP's module under its earlier name ([`swiglu`]).
#[doc(hidden)]
pub use swiglu as mlp;

pub use checkpoint::LoadOptions;
pub use config::{ModelConfig, ModelFamily, RoutingPath};
pub use error::{HaaresError, Result};
pub use materialise::materialise;
pub use method::{DetailBias, DetailSource, HaaresOptions, ResidualMethod};
pub use model::HaaresModel;
pub use ops::{HaaresBackend, SlotRows, TrainingBackend};
pub use routing_stats::{GroupMass, RoutingStatistics, RoutingTally, SiteStatistics};
pub use source_bank::{SlotKind, Source, SourceBank};
pub use stream::{ResidualStream, ResidualStreamConfig, StreamState};
pub use telemetry::{ReadSite, RoutingTrace, SiteTrace, SlotGroup, SlotId};
