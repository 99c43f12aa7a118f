//! What every CubeCL kernel folder of the operations shares: the threads of a row, the launch
//! shapes, the outputs' allocation, a Burn tensor as a kernel argument, and the kernels' index
//! arithmetic and cube-wide reduction. It imports none of the operations.
//!
//! Inputs are read through their strides (no copy of a transposed or pitched view); outputs are
//! allocated contiguous.

use burn::tensor::{Shape, Tensor};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

/// Threads that share one row: the softmax's, RMSNorm's, the cross-entropy's, and a token row of
/// the routing kernels.
pub(crate) const ROW_THREADS: usize = 64;

/// A Burn tensor as the kernels' argument, read through its strides.
pub(crate) fn primitive<R, F, I, BT, const D: usize>(
    tensor: Tensor<CubeBackend<R, F, I, BT>, D>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    tensor.into_primitive().tensor()
}

/// A contiguous output of `like`'s shape and type.
pub(crate) fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    empty_device_contiguous_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        like.meta.shape().clone(),
        like.dtype,
    )
}

/// One thread per element of `output`.
pub(crate) fn elementwise<R: CubeRuntime>(output: &CubeTensor<R>) -> (CubeCount, CubeDim) {
    let elements = output.meta.shape().num_elements();
    let cube_dim = CubeDim::new(&output.client, elements);
    (
        calculate_cube_count_elemwise(&output.client, elements, cube_dim),
        cube_dim,
    )
}

/// One cube of [`ROW_THREADS`] per row of `output`'s last dimension.
pub(crate) fn per_row<R: CubeRuntime>(output: &CubeTensor<R>) -> (CubeCount, CubeDim) {
    let shape = output.meta.shape();
    let rows = shape.num_elements() / shape[shape.num_dims() - 1].max(1);
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    (
        calculate_cube_count_elemwise(&output.client, rows * ROW_THREADS, cube_dim),
        cube_dim,
    )
}

/// A contiguous `shape` tensor of `like`'s type on its device.
pub(crate) fn empty_shaped<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: Vec<usize>,
) -> CubeTensor<R> {
    empty_device_contiguous_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        like.dtype,
    )
}

/// A new `[rows, width]` tensor on `like`'s device, of its element type, its values unset (CUDA
/// may pitch its rows).
pub(crate) fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: [usize; 2]) -> CubeTensor<R> {
    empty_device_dtype::<R>(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        like.dtype,
    )
}

/// The kernels' shared pieces, in a module of their own because CubeCL's `Tensor` is not Burn's.
pub(crate) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    /// Where element `index` of the row-major order of `tensor`'s shape lies in its buffer.
    #[cube]
    pub(crate) fn strided<F: Float>(tensor: &Tensor<F>, index: usize) -> usize {
        let rank = tensor.rank();
        let mut rest = index;
        let mut offset = 0;
        for i in 0..rank {
            let dim = rank - 1 - i;
            offset += (rest % tensor.shape(dim)) * tensor.stride(dim);
            rest /= tensor.shape(dim);
        }
        offset
    }

    /// `x[row, column]` of a matrix, through its strides.
    #[cube]
    pub(crate) fn at<F: Float>(x: &Tensor<F>, row: usize, column: usize) -> usize {
        row * x.stride(0) + column * x.stride(1)
    }

    /// Reduces `partials[0..threads]` into `partials[0]`, by sum or by maximum; every thread of
    /// the cube calls it. One thread adds the 64 partials: a tree would need a runtime loop
    /// bound, and it is not what a row's time goes into.
    #[cube]
    pub(crate) fn reduce<F: Float>(
        partials: &mut SharedMemory<F>,
        lane: usize,
        #[comptime] threads: usize,
        #[comptime] maximum: bool,
    ) {
        sync_cube();
        if lane == 0 {
            let mut total = partials[0];
            for thread in 1..threads {
                let value = partials[thread];
                if maximum {
                    if value > total {
                        total = value;
                    }
                } else {
                    total += value;
                }
            }
            partials[0] = total;
        }
        sync_cube();
    }
}
