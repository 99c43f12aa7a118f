//! What the routing operator's kernel folders share: the sources as one kernel argument, a
//! launch's bound on them, and a Burn tensor as a kernel argument read in place.

use burn::tensor::Tensor;
use burn_cubecl::cubecl::prelude::{LaunchArg, SequenceArg, TensorArg};
use burn_cubecl::kernel::into_contiguous_aligned;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

/// Most sources one launch reads (fewer where the device allows fewer bindings).
pub(in crate::ops) const MAX_SLOTS_PER_LAUNCH: usize = 16;

/// The sources as one kernel argument (one binding each).
pub(in crate::ops) fn sequence<R, T>(slots: &[CubeTensor<R>]) -> SequenceArg<R, T>
where
    R: CubeRuntime,
    T: LaunchArg<RuntimeArg<R> = TensorArg<R>>,
{
    let mut sequence = SequenceArg::new();
    for slot in slots {
        sequence.push(slot.clone().into_tensor_arg());
    }
    sequence
}

/// A Burn tensor as the kernels' argument. Transposed views are copied, so that neighbouring
/// threads read neighbouring addresses; row-pitched tensors (CUDA's layout) are read in place.
pub(in crate::ops) fn cube_tensor<R, F, I, BT, const D: usize>(
    tensor: Tensor<CubeBackend<R, F, I, BT>, D>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    into_contiguous_aligned(tensor.into_primitive().tensor())
}
