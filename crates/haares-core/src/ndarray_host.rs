//! What every operation's NdArray implementation shares: the float types NdArray stores, with a
//! view of a tensor as a 2-D host array (the NdArray counterpart of `simd.rs`'s Flex floats). The
//! operations whose NdArray path is the reference name it in their `uses_the_reference!` bound.

use burn::backend::ndarray::{FloatNdArrayElement, NdArrayTensor};
use ndarray::{ArrayView2, Ix2, LinalgScalar};

/// A float type NdArray stores, with a view of its tensors as 2-D arrays.
pub trait NdArrayFloat: FloatNdArrayElement + LinalgScalar {
    /// `tensor` as a 2-D array of `Self`, or `None` when it holds another type or rank.
    fn view(tensor: &NdArrayTensor) -> Option<ArrayView2<'_, Self>>;
}

impl NdArrayFloat for f32 {
    fn view(tensor: &NdArrayTensor) -> Option<ArrayView2<'_, f32>> {
        match tensor {
            NdArrayTensor::F32(storage) => storage.view().into_dimensionality::<Ix2>().ok(),
            _ => None,
        }
    }
}

impl NdArrayFloat for f64 {
    fn view(tensor: &NdArrayTensor) -> Option<ArrayView2<'_, f64>> {
        match tensor {
            NdArrayTensor::F64(storage) => storage.view().into_dimensionality::<Ix2>().ok(),
            _ => None,
        }
    }
}
