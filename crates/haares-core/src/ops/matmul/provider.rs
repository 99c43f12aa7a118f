//! Which kernels compute the matrix products on CUDA: cuBLAS (`cublas/`) or cubek, Burn's own
//! (`Strategy::Auto`, the single-stage tensor-core kernel). The choice is the process's, not a
//! run's: a run records it, but resumes under either, since both compute the same products to
//! within TF32's rounding.
//!
//! It is read from [`PRODUCTS_VARIABLE`] (`HAARES_PRODUCTS=cubek` or `cublas`) on the first
//! product, unless [`set_product_provider`] chose before. The default is cubek until the CUDA
//! portability suite has passed with cuBLAS products on a GPU (docs/decisions.md, decision 36).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::HaaresError;

/// The environment variable that picks the products' provider: `cubek` or `cublas`.
pub const PRODUCTS_VARIABLE: &str = "HAARES_PRODUCTS";

/// The kernels of the matrix products on CUDA. Other backends have one provider each (Flex's
/// `gemm`, NdArray's, cubek on wgpu) and ignore this choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProductProvider {
    /// Burn's product, cubek's `Strategy::Auto`, never autotuned (decision 24): TF32 tensor cores.
    Cubek,
    /// NVIDIA's cuBLAS with TF32 tensor cores, loaded at run time; cubek where it cannot be
    /// loaded.
    Cublas,
}

impl ProductProvider {
    /// The provider a process gets when nothing chooses one.
    pub const DEFAULT: Self = Self::Cubek;

    /// Its name, as [`PRODUCTS_VARIABLE`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cubek => "cubek",
            Self::Cublas => "cublas",
        }
    }

    /// The provider [`PRODUCTS_VARIABLE`] names, [`Self::DEFAULT`] when it is unset; an error
    /// naming the variable and its values when it holds anything else. Runners call it before
    /// a job starts, so that a misspelt value stops them instead of being ignored.
    pub fn from_env() -> Result<Self, HaaresError> {
        match std::env::var(PRODUCTS_VARIABLE) {
            Err(std::env::VarError::NotPresent) => Ok(Self::DEFAULT),
            Ok(value) => value.parse(),
            Err(std::env::VarError::NotUnicode(value)) => Err(Self::invalid(&format!("{value:?}"))),
        }
    }

    fn invalid(value: &str) -> HaaresError {
        HaaresError::InvalidInput(format!(
            "{PRODUCTS_VARIABLE}={value}: the matrix products' provider is `cubek` or `cublas` \
             (unset: `{}`)",
            Self::DEFAULT.name()
        ))
    }
}

impl FromStr for ProductProvider {
    type Err = HaaresError;

    fn from_str(value: &str) -> Result<Self, HaaresError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "cubek" | "cube" => Ok(Self::Cubek),
            "cublas" => Ok(Self::Cublas),
            _ => Err(Self::invalid(value)),
        }
    }
}

impl fmt::Display for ProductProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The process's choice: 0 while unread, else `1 + ` the provider's index.
static CHOSEN: AtomicU8 = AtomicU8::new(0);

const fn encode(provider: ProductProvider) -> u8 {
    match provider {
        ProductProvider::Cubek => 1,
        ProductProvider::Cublas => 2,
    }
}

/// Chooses the products' provider for the rest of the process, over [`PRODUCTS_VARIABLE`].
pub fn set_product_provider(provider: ProductProvider) {
    CHOSEN.store(encode(provider), Ordering::Relaxed);
}

/// The products' provider of this process: [`set_product_provider`]'s choice, else
/// [`PRODUCTS_VARIABLE`]'s, else [`ProductProvider::DEFAULT`]. A value the variable cannot hold
/// is reported once on stderr and the default taken (the runners refuse it before they start,
/// through [`ProductProvider::from_env`]).
pub fn product_provider() -> ProductProvider {
    match CHOSEN.load(Ordering::Relaxed) {
        1 => ProductProvider::Cubek,
        2 => ProductProvider::Cublas,
        _ => {
            let provider = ProductProvider::from_env().unwrap_or_else(|error| {
                eprintln!(
                    "haares: {error}; the products use `{}`",
                    ProductProvider::DEFAULT
                );
                ProductProvider::DEFAULT
            });
            // Another thread may have chosen meanwhile: its choice stands.
            let _ =
                CHOSEN.compare_exchange(0, encode(provider), Ordering::Relaxed, Ordering::Relaxed);
            product_provider()
        }
    }
}
