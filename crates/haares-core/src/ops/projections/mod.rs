//! Side-by-side projections: the products of one input with several weights as one product,
//! `Y = x [W₁ … W_k]`. Attention's query, key and value (App. A) become one `[tokens, 3d]`
//! product, SwiGLU's gate and up projections one `[tokens, 2 d_ff]` product; in the backward pass
//! the input's gradient is then one product, `∂x = ∂Y [W₁ … W_k]ᵀ`, where the separate projections
//! take `k` products and `k − 1` additions, and the weights' gradients one product, `xᵀ ∂Y`,
//! split by columns (docs/decisions.md, decision 23). RoPE, attention and SwiGLU read the packed
//! product in place ([`crate::ops::rotary`], [`crate::ops::attention`], [`crate::ops::swiglu`]).
//!
//! - [`naive`]: the reference, Burn's `cat` and `narrow`, and the views that unpack a packed
//!   projection.
//! - `cube.rs`: the joins and splits as one kernel each.
//! - `autodiff.rs`: the product as one graph node with every weight as a parent.
//!
//! `tests/core/projections_checks.rs` checks the backend's operation and its node against f64 and the
//! reference; `tests/core/projections.rs` runs it on NdArray f64 and Flex, `tests/portability.rs` on
//! NdArray f32, Flex, wgpu and CUDA.

mod autodiff;
#[cfg(feature = "cube")]
pub(super) mod cube;
pub mod naive;
#[cfg(all(feature = "cuda", feature = "wgpu"))]
pub(super) mod sources;

use crate::ops::MatmulBackend;
use burn::tensor::Tensor;

/// A backend that multiplies the projections of one input side by side, where that saves launches.
/// Every Burn backend can implement it with the defaults, Burn's `cat` and `narrow` around one
/// product ([`naive`]).
pub trait ProjectionBackend: MatmulBackend {
    /// Whether the backbone multiplies projections of one input side by side and reads the
    /// packed product in place (this module; docs/decisions.md, decision 23): the cube backends,
    /// where every product and addition is a kernel launch. The CPU backends keep them apart.
    fn packs_projections() -> bool {
        false
    }

    /// `x [W₁ … W_k]`, one product: `x` `[tokens, d_in]`, weights `[d_in, d_i]`, output
    /// `[tokens, Σ d_i]`.
    fn projections(x: Tensor<Self, 2>, weights: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        Self::matmul(x, Self::concat_columns(weights))
    }

    /// `[A₁ … A_k]` for `[rows, c_i]` parts: `[rows, Σ c_i]`.
    fn concat_columns(parts: Vec<Tensor<Self, 2>>) -> Tensor<Self, 2> {
        naive::concat_columns(parts)
    }

    /// The inverse of [`concat_columns`](Self::concat_columns): `[rows, widths[i]]` parts.
    fn split_columns(whole: Tensor<Self, 2>, widths: &[usize]) -> Vec<Tensor<Self, 2>> {
        naive::split_columns(whole, widths)
    }
}

uses_the_reference!(ProjectionBackend on ndarray, flex, fusion);
