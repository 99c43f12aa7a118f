//! The operations HAARES and its backbone compute, one folder each: the operation's trait (its
//! equation, shapes and the paper's label) in `mod.rs`, its reference in plain tensor operations
//! in `naive.rs`, one file per backend that computes it faster (`flex.rs`, `ndarray.rs`,
//! `cube.rs` with its kernels), its graph node in `autodiff.rs`, and on the cube backends the
//! list of its kernels' CUDA sources in `sources.rs`.
//!
//! | operation | trait | paper |
//! |---|---|---|
//! | [`matmul`] | [`MatmulBackend`] | every projection, attention's products, the tied head |
//! | [`projections`] | [`ProjectionBackend`] | side-by-side projections (docs/decisions.md, decision 23) |
//! | [`swiglu`] | [`SwigluBackend`] | App. A, the MLP's gated product |
//! | [`softmax`] | [`SoftmaxBackend`] | App. A, attention's causal softmax |
//! | [`norm`] | [`NormBackend`] | tab:reprobackbone, RMSNorm |
//! | [`rotary`] | [`RotaryBackend`] | App. A, RoPE |
//! | [`attention`] | [`AttentionBackend`] | App. A, causal attention |
//! | [`cross_entropy`] | [`CrossEntropyBackend`] | the training objective |
//! | [`routing::sums`] | [`SlotSumsBackend`] | eq:routingweights, the sums over slots |
//! | [`routing::write`](mod@routing::write) | [`SourceWriteBackend`] | eq:update, eq:rmsmatch |
//! | [`routing::read`] | [`RoutingBackend`] | eq:routingweights, a whole read |
//!
//! [`HaaresBackend`] combines them: it is the one bound a user of the modules writes, and every
//! Burn backend the crate's features enable (NdArray, Flex, wgpu, CUDA, their autodiff and kernel
//! fusion) has it. [`TrainingBackend`] adds autodiff over such a backend. Every trait's methods
//! default to the reference, so a backend with no fast path of an operation implements its trait
//! with an empty `impl`. docs/architecture.md ("How to add …", "A fused operation") says which
//! files and tests a new one takes.

use burn::tensor::backend::AutodiffBackend;

/// Implements an operation's trait with its defaults (the reference) for the backends named that
/// have no fast path of it: `ndarray` (Burn's NdArray, f32 and f64), `flex`, `cube` (Burn's cube
/// backends, CUDA and wgpu) and `fusion` (Burn's kernel fusion over any backend, which may merge
/// the plain operations).
macro_rules! uses_the_reference {
    ($operation:ident on $($backend:ident),+) => {
        $(uses_the_reference!(@ $operation, $backend);)+
    };
    (@ $operation:ident, ndarray) => {
        #[cfg(feature = "ndarray")]
        impl<E: crate::ndarray_host::NdArrayFloat> $operation for burn::backend::NdArray<E>
        where
            burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
        {
        }
    };
    (@ $operation:ident, flex) => {
        #[cfg(feature = "flex")]
        impl $operation for burn::backend::Flex {}
    };
    (@ $operation:ident, cube) => {
        #[cfg(feature = "cube")]
        impl<R, F, I, BT> $operation for burn_cubecl::CubeBackend<R, F, I, BT>
        where
            R: burn_cubecl::CubeRuntime,
            F: burn_cubecl::FloatElement,
            I: burn_cubecl::IntElement,
            BT: burn_cubecl::BoolElement,
        {
        }
    };
    (@ $operation:ident, fusion) => {
        #[cfg(feature = "fusion")]
        impl<B: burn_fusion::FusionBackend> $operation for burn_fusion::Fusion<B> {}
    };
}

pub mod attention;
pub mod cross_entropy;
#[cfg(feature = "cube")]
pub(crate) mod cube_shared;
pub mod matmul;
pub mod norm;
pub mod projections;
pub mod rotary;
pub mod routing;
pub mod softmax;
pub mod swiglu;

pub use attention::AttentionBackend;
pub use cross_entropy::CrossEntropyBackend;
pub use matmul::MatmulBackend;
pub use norm::NormBackend;
pub use projections::ProjectionBackend;
pub use rotary::RotaryBackend;
pub use routing::SlotRows;
pub use routing::read::{RoutingBackend, RoutingPath};
pub use routing::sums::SlotSumsBackend;
pub use routing::write::{PairWrite, RmsMatching, SourceWriteBackend};
pub use softmax::SoftmaxBackend;
pub use swiglu::SwigluBackend;

/// A trait that combines `$first` and `$rest`, implemented for every type that has them all.
macro_rules! combined_backend {
    ($(#[$doc:meta])* $name:ident: $first:ident $(+ $rest:ident)*) => {
        $(#[$doc])*
        pub trait $name: $first $(+ $rest)* {}

        impl<B: $first $(+ $rest)*> $name for B {}
    };
}

combined_backend!(
    /// A backend that computes every operation of HAARES and its backbone: the one bound a user
    /// of the modules writes. Every backend that has each operation's trait has it.
    HaaresBackend: MatmulBackend
        + ProjectionBackend
        + SwigluBackend
        + SoftmaxBackend
        + NormBackend
        + RotaryBackend
        + AttentionBackend
        + CrossEntropyBackend
        + SlotSumsBackend
        + SourceWriteBackend
        + RoutingBackend
);

/// A backend that trains HAARES models: autodiff over a [`HaaresBackend`], so that both the
/// training model and its `valid()` copy can route.
pub trait TrainingBackend: AutodiffBackend<InnerBackend: HaaresBackend> + HaaresBackend {}

impl<B> TrainingBackend for B where B: AutodiffBackend<InnerBackend: HaaresBackend> + HaaresBackend {}

/// The CUDA sources of every kernel of the operations, at the variants the backbone and the
/// residual methods launch on CUDA: the fused attention's at each of `head_dims`, then the
/// others' (docs/benchmarks.md lists them).
///
/// # Errors
/// As [`CudaSources::new`](crate::cuda_sources::CudaSources::new) and
/// [`CudaSources::add`](crate::cuda_sources::CudaSources::add), or a head width the fused
/// attention does not take.
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub fn core_kernel_sources(
    sources: &mut crate::cuda_sources::CudaSources,
    head_dims: &[usize],
) -> crate::Result<()> {
    for &head_dim in head_dims {
        attention::cube::sources::attention_sources(sources, head_dim)?;
    }
    norm::sources::cuda_sources(sources)?;
    softmax::sources::cuda_sources(sources)?;
    cross_entropy::sources::cuda_sources(sources)?;
    swiglu::sources::cuda_sources(sources)?;
    rotary::sources::cuda_sources(sources)?;
    projections::sources::cuda_sources(sources)?;
    routing::sources::cuda_sources(sources)
}
