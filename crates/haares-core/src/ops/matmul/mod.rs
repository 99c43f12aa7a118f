//! The matrix product over the last two dimensions, `[..., m, k] · [..., k, n]`, and
//! `lhs · rhsᵀ`: every projection of the backbone, attention's two products, RoPE's quarter turn
//! and the tied head. Its backward pass is two more products, `∂A = ∂C Bᵀ` and `∂B = Aᵀ ∂C`.
//!
//! - [`naive`]: Burn's `matmul`.
//! - `flex.rs`: Flex's `gemm` kernel writing into a buffer of its own.
//! - `cube.rs`: on CUDA, the [`provider`]'s kernels (cuBLAS, or cubek untuned); elsewhere Burn's.
//! - [`blas_call`]: a product of strided tensors as column-major BLAS calls (pure arithmetic);
//!   `cublas` (feature `cuda`) makes those calls on the device.
//! - `autodiff.rs`: one graph node per product, each operand kept only for the other's gradient.
//!
//! `tests/core/matmul_checks.rs` checks the nodes and the products against f64 on every backend
//! (from `tests/core/matmul.rs` and `tests/portability.rs`); `tests/core/matmul.rs` checks Flex's
//! product against f64 and Burn's; `tests/core/blas_call.rs` checks the BLAS calls against a host
//! interpreter of the BLAS definition.

mod autodiff;
pub mod blas_call;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cuda")]
pub mod cublas;
#[cfg(feature = "flex")]
mod flex;
pub mod naive;
pub mod provider;

pub use provider::{PRODUCTS_VARIABLE, ProductProvider, product_provider, set_product_provider};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A backend that computes the backbone's matrix products. Every Burn backend can implement it with
/// the defaults, Burn's own product ([`naive`]).
pub trait MatmulBackend: Backend {
    /// The matrix product over the last two dimensions, `[..., m, k] · [..., k, n]`, both
    /// operands with the same leading (batch) dimensions: every projection of the backbone (as
    /// `[tokens, d_in] · [d_in, d_out]`), attention's two products, RoPE's quarter turn and the
    /// tied head. Its backward pass is two more products, `∂A = ∂C Bᵀ` and `∂B = Aᵀ ∂C`.
    ///
    /// The plain form is Burn's `matmul`. Flex's allocates each output as zeroed bytes and copies
    /// them into an aligned buffer before writing the product, ≈ 10% of a CPU step; Flex's form
    /// here writes the product into a buffer of its own (`flex.rs`). A projection written
    /// as one `[tokens, d_in]` product, where Burn's `Linear` multiplies a `[batch, seq, d_in]`
    /// input, also takes its weight's gradient in one product, not one per batch row and a sum.
    ///
    /// # Shapes
    /// - lhs: `[..., m, k]`; rhs: `[..., k, n]`
    /// - output: `[..., m, n]`
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        naive::matmul(lhs, rhs)
    }

    /// `lhs · rhsᵀ` over the last two dimensions: attention's scores `Q Kᵀ` and the tied head's
    /// `h Eᵀ`. As [`matmul`](Self::matmul) of a transposed view it computes the same; as an
    /// operation of its own its backward pass writes `∂rhs = ∂Cᵀ lhs` in `rhs`'s own layout,
    /// where the view's gradient is a transposed view again, which every later use (the heads'
    /// swap, RoPE's reshapes, the embedding's gradient sum) would copy element by element.
    ///
    /// # Shapes
    /// - lhs: `[..., m, k]`; rhs: `[..., n, k]`
    /// - output: `[..., m, n]`
    fn matmul_transposed_rhs<const D: usize>(
        lhs: Tensor<Self, D>,
        rhs: Tensor<Self, D>,
    ) -> Tensor<Self, D> {
        Self::matmul(lhs, rhs.swap_dims(D - 2, D - 1))
    }

    /// The kernels that compute this backend's products, as a run's record and the reports name
    /// them (on CUDA they depend on the process's [`ProductProvider`]).
    fn product_kernels() -> String {
        "Burn's matmul".into()
    }
}

uses_the_reference!(MatmulBackend on ndarray, fusion);
