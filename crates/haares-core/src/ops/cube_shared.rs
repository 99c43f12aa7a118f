//! What every CubeCL kernel folder of the operations shares: the threads of a row, the launch
//! shapes, the outputs' allocation, a Burn tensor as a kernel argument, and the kernels' index
//! arithmetic and cube-wide reduction. It imports none of the operations.
//!
//! Inputs are read through their strides (no copy of a transposed or pitched view); outputs are
//! allocated contiguous.

use burn::tensor::{Shape, Tensor};
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::ir::features::Plane;
use burn_cubecl::cubecl::prelude::{ComputeClient, CubeCount, CubeDim};
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

/// Threads that share one row: the softmax's, RMSNorm's, the cross-entropy's, and a token row of
/// the routing kernels.
pub(crate) const ROW_THREADS: usize = 64;

/// Whether `R` is CubeCL's CUDA runtime. Only this crate's `cuda` feature names that runtime, so
/// without it every runtime counts as not CUDA.
#[cfg(feature = "cuda")]
pub(crate) fn is_cuda<R: CubeRuntime>() -> bool {
    std::any::TypeId::of::<R>() == std::any::TypeId::of::<burn_cubecl::cubecl::cuda::CudaRuntime>()
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::extra_unused_type_parameters)] // the same signature as with the feature
pub(crate) fn is_cuda<R: CubeRuntime>() -> bool {
    false
}

/// Whether [`kernels::reduce`] may sum a cube of `threads` on the device's planes (warps): the
/// device has plane operations, one plane size, and it divides `threads`. CubeCL reports none
/// for a CPU adapter (lavapipe), which takes the shared-memory tree.
pub(crate) fn plane_reduction<R: CubeRuntime>(client: &ComputeClient<R>, threads: usize) -> bool {
    let properties = client.properties();
    let (smallest, largest) = (
        properties.hardware.plane_size_min as usize,
        properties.hardware.plane_size_max as usize,
    );
    properties.features.plane.contains(Plane::Ops)
        && smallest == largest
        && smallest > 0
        && threads % smallest == 0
}

/// Whether every one of `inputs` is contiguous (row-major, unpadded): an element-wise kernel then
/// finds each element at its own index ([`kernels::element_at`]), without the division and
/// remainder per dimension that reading through the strides takes.
pub(crate) fn dense<R: CubeRuntime>(inputs: &[&CubeTensor<R>]) -> bool {
    inputs.iter().all(|tensor| tensor.is_contiguous())
}

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

    /// Where element `index` of the row-major order of `tensor`'s shape lies: at `index` itself
    /// in a `dense` (contiguous) tensor, with no index arithmetic, else through [`strided`].
    #[cube]
    pub(crate) fn element_at<F: Float>(
        tensor: &Tensor<F>,
        index: usize,
        #[comptime] dense: bool,
    ) -> usize {
        let mut at = index;
        if !dense {
            at = strided(tensor, index);
        }
        at
    }

    /// `x[row, column]` of a matrix, through its strides.
    #[cube]
    pub(crate) fn at<F: Float>(x: &Tensor<F>, row: usize, column: usize) -> usize {
        row * x.stride(0) + column * x.stride(1)
    }

    /// Reduces `partials[0..threads]` into `partials[0]`, by sum or by maximum; every thread of
    /// the cube (one-dimensional, `threads` threads) calls it, each having written its own
    /// `partials[lane]`. With `planes` (the device
    /// has plane operations and its plane divides `threads`: [`super::plane_reduction`]) each
    /// plane sums in registers and one thread adds the planes' totals; otherwise a tree of
    /// shared-memory steps, `log₂ threads` of them. Both orders are fixed, so a row's total is the
    /// same from run to run.
    #[cube]
    pub(crate) fn reduce<F: Float>(
        partials: &mut SharedMemory<F>,
        lane: usize,
        #[comptime] threads: usize,
        #[comptime] maximum: bool,
        #[comptime] planes: bool,
    ) {
        sync_cube();
        if planes {
            let own = partials[lane];
            let plane_total = if maximum {
                plane_max(own)
            } else {
                plane_sum(own)
            };
            // Every thread has read its partial before a plane's first thread overwrites one.
            sync_cube();
            if UNIT_POS_PLANE == 0 {
                partials[lane / PLANE_DIM as usize] = plane_total;
            }
            sync_cube();
            if lane == 0 {
                let mut total = partials[0];
                for plane in 1..threads / PLANE_DIM as usize {
                    total = combine::<F>(total, partials[plane], maximum);
                }
                partials[0] = total;
            }
        } else {
            // The cube is one-dimensional, of `threads` threads (every caller launches
            // `CubeDim::new_1d(threads)`): its size is the stride's runtime start, since a
            // compile-time value cannot change in a loop.
            let mut stride = CUBE_DIM_X as usize / 2;
            while stride > 0 {
                if lane < stride {
                    partials[lane] = combine::<F>(partials[lane], partials[lane + stride], maximum);
                }
                sync_cube();
                stride /= 2;
            }
        }
        sync_cube();
    }

    /// The cube's sum (or maximum) of every thread's `value`, in every thread; `partials` is the
    /// cube's scratch of `threads` elements, free again on return.
    #[cube]
    pub(crate) fn cube_total<F: Float>(
        partials: &mut SharedMemory<F>,
        lane: usize,
        value: F,
        #[comptime] threads: usize,
        #[comptime] maximum: bool,
        #[comptime] planes: bool,
    ) -> F {
        partials[lane] = value;
        reduce::<F>(partials, lane, threads, maximum, planes);
        let total = partials[0];
        sync_cube();
        total
    }

    /// `a + b`, or the larger of the two.
    #[cube]
    fn combine<F: Float>(a: F, b: F, #[comptime] maximum: bool) -> F {
        let mut result = a;
        if maximum {
            if b > a {
                result = b;
            }
        } else {
            result = a + b;
        }
        result
    }
}
