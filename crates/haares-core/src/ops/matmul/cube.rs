//! [`MatmulBackend`] on Burn's cube backends. On CUDA a product goes to the process's
//! [`ProductProvider`]: cuBLAS (`cublas/`, f32 operands), or cubek's `Strategy::Auto` launched
//! directly (every other product), untuned whatever Burn's features (autotuning can pick cubek 0.2
//! kernels that read past the contraction on NVIDIA cards: decision 24). On wgpu it is Burn's
//! `matmul`.

use burn::tensor::Tensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::{MatmulBackend, naive};
use crate::ops::cube_shared::is_cuda;

impl<R, F, I, BT> MatmulBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        if !is_cuda::<R>() {
            return naive::matmul(lhs, rhs);
        }
        #[cfg(feature = "cuda")]
        return cuda::matmul(lhs, rhs);
        #[cfg(not(feature = "cuda"))]
        naive::matmul(lhs, rhs)
    }

    fn product_kernels() -> String {
        if !is_cuda::<R>() {
            return "cubek (Burn's matmul)".into();
        }
        #[cfg(feature = "cuda")]
        return cuda::product_kernels::<F>();
        #[cfg(not(feature = "cuda"))]
        "cubek (Burn's matmul)".into()
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::any::Any;
    use std::sync::Once;

    use burn::tensor::{DType, Tensor, TensorPrimitive};
    use burn_cubecl::cubecl::cuda::CudaRuntime;
    use burn_cubecl::kernel::matmul::{MatmulStrategy, matmul as launch};
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

    use super::super::cublas::{self, BlasPrecision, CublasFailure};
    use super::super::provider::{ProductProvider, product_provider};
    use crate::ops::cube_shared::primitive;

    /// The product on CUDA (`R` is CUDA's runtime): cuBLAS where chosen and possible, else
    /// cubek untuned.
    pub(super) fn matmul<R, F, I, BT, const D: usize>(
        lhs: Tensor<CubeBackend<R, F, I, BT>, D>,
        rhs: Tensor<CubeBackend<R, F, I, BT>, D>,
    ) -> Tensor<CubeBackend<R, F, I, BT>, D>
    where
        R: CubeRuntime,
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        let (lhs, rhs) = (primitive(lhs), primitive(rhs));
        let output = match cublas_product(&lhs, &rhs) {
            Some(output) => output,
            None => {
                let dtype = lhs.dtype;
                // As Burn's own `float_matmul`, which also unwraps: `Strategy::Auto` has a kernel
                // for every shape and layout.
                launch(lhs, rhs, None, MatmulStrategy::Cube, dtype)
                    .unwrap_or_else(|error| panic!("cubek's product failed to launch: {error:?}"))
            }
        };
        Tensor::from_primitive(TensorPrimitive::Float(output))
    }

    /// The product by cuBLAS when it is the process's provider and can take these operands;
    /// `None` (nothing computed) otherwise, a failure reported once.
    fn cublas_product<R: CubeRuntime>(
        lhs: &CubeTensor<R>,
        rhs: &CubeTensor<R>,
    ) -> Option<CubeTensor<R>> {
        if product_provider() != ProductProvider::Cublas || lhs.dtype != DType::F32 {
            return None;
        }
        let (lhs, rhs) = (as_cuda(lhs.clone())?, as_cuda(rhs.clone())?);
        match cublas::matmul(lhs, rhs, BlasPrecision::Tf32) {
            Ok(output) => (Box::new(output) as Box<dyn Any>)
                .downcast()
                .ok()
                .map(|output| *output),
            Err(failure) => {
                report_once(&failure);
                None
            }
        }
    }

    fn as_cuda<R: CubeRuntime>(tensor: CubeTensor<R>) -> Option<CubeTensor<CudaRuntime>> {
        (Box::new(tensor) as Box<dyn Any>)
            .downcast()
            .ok()
            .map(|tensor| *tensor)
    }

    /// Tells the process once that cuBLAS is not computing its products, and why: that the
    /// library is missing, or the first failure of another kind. A layout cuBLAS cannot take is
    /// not reported (its product goes to cubek, as any other backend's would).
    fn report_once(failure: &CublasFailure) {
        static MISSING: Once = Once::new();
        static FAILED: Once = Once::new();
        match failure {
            CublasFailure::Unavailable(message) => MISSING.call_once(|| eprintln!("haares: {message}")),
            CublasFailure::Call(message) => FAILED.call_once(|| {
                eprintln!("haares: a cuBLAS product failed ({message}); it and any other that fails run on cubek")
            }),
            CublasFailure::NotF32 | CublasFailure::Layout(_) => {}
        }
    }

    /// The kernels that take the products on CUDA, for a run's record (cuBLAS takes f32
    /// products only).
    pub(super) fn product_kernels<F: FloatElement>() -> String {
        if F::dtype() != DType::F32 {
            return "cubek Strategy::Auto".into();
        }
        match (product_provider(), cublas::availability()) {
            (ProductProvider::Cublas, Ok(())) => "cuBLAS (TF32)".into(),
            (ProductProvider::Cublas, Err(_)) => {
                "cubek Strategy::Auto (TF32; cuBLAS not loaded)".into()
            }
            (ProductProvider::Cubek, _) => "cubek Strategy::Auto (TF32)".into(),
        }
    }
}
