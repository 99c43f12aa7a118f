//! RMSNorm with its gain as CubeCL kernels, the row's sums reduced in shared memory or on the
//! device's planes ([`reduce`](crate::ops::cube_shared::kernels::reduce)). The forward pass is
//! one cube per row. The backward pass takes a block of [`ROWS_PER_CUBE`] rows per cube: for each
//! row it writes `∂x` and adds the row's share of `∂w`, `∂y⊙x̂`, into the cube's own partial sum
//! in shared memory; a second, small launch adds the blocks' partial sums. No `[rows, d]` tensor
//! of shares is written, and no Burn reduction runs: untuned, Burn's sum over the rows gives each
//! thread four columns to walk down every row, and a 48-layer step on an H200 launched its reduce
//! kernel 97 times (the 2L + 1 gain sums' count) at 0.48 ms each (docs/benchmarks.md).

use burn::tensor::Tensor;
use burn_cubecl::cubecl::calculate_cube_count_elemwise;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::NormBackend;
use crate::autodiff_node::from_primitive;
use crate::ops::cube_shared::{
    ROW_THREADS, empty_like, empty_shaped, per_row, plane_reduction, primitive,
};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
/// `(∂x, ∂w)`.
type InputAndGainGrads<R, F, I, BT> = (Tensor<Cube<R, F, I, BT>, 2>, Tensor<Cube<R, F, I, BT>, 1>);

/// Rows one cube of the backward pass takes, one after another: at 8,192 rows, 512 cubes, a few
/// per multiprocessor, and a `[512, d]` tensor of partial sums for the second launch to add.
pub(in crate::ops) const ROWS_PER_CUBE: usize = 16;

/// The widest row whose gain partials the backward kernel keeps in shared memory: 12 KiB of f32,
/// with the row sums' 256 bytes within the 16 KiB every WebGPU adapter grants a cube (the
/// paper's widths are at most 768); wider rows write each row's share and the second launch adds
/// all of them.
pub(in crate::ops) const SHARED_GAIN_WIDTH: usize = 3072;

/// Threads of a cube of the column sums, one per column.
pub(in crate::ops) const COLUMN_THREADS: usize = 256;

impl<R, F, I, BT> NormBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 2> {
        rms_norm(x, weight, epsilon)
    }

    fn rms_norm_backward(
        x: Tensor<Self, 2>,
        weight: Tensor<Self, 1>,
        grad: Tensor<Self, 2>,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 1>) {
        rms_norm_backward(x, weight, grad, epsilon)
    }
}

/// [`NormBackend::rms_norm`] in one launch.
fn rms_norm<R, F, I, BT>(
    x: Tensor<Cube<R, F, I, BT>, 2>,
    weight: Tensor<Cube<R, F, I, BT>, 1>,
    epsilon: f64,
) -> Tensor<Cube<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let (x, weight) = (primitive(x), primitive(weight));
    let output = empty_like(&x);
    let (cube_count, cube_dim) = per_row(&output);
    kernels::rms_norm_kernel::launch::<R>(
        &x.client.clone(),
        cube_count,
        cube_dim,
        x.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        epsilon as f32,
        ROW_THREADS,
        plane_reduction(&x.client, ROW_THREADS),
        x.dtype.into(),
    );
    from_primitive(output)
}

/// [`NormBackend::rms_norm_backward`] in two launches: `∂x` and each block's partial sum of `∂w`,
/// then the partial sums' total.
fn rms_norm_backward<R, F, I, BT>(
    x: Tensor<Cube<R, F, I, BT>, 2>,
    weight: Tensor<Cube<R, F, I, BT>, 1>,
    grad: Tensor<Cube<R, F, I, BT>, 2>,
    epsilon: f64,
) -> InputAndGainGrads<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let [rows, d] = x.dims();
    let (x, weight, grad) = (primitive(x), primitive(weight), primitive(grad));
    let x_grad = empty_like(&x);
    // A block's partials live in shared memory up to `SHARED_GAIN_WIDTH`; beyond it each row is
    // a block of its own and writes its share.
    let rows_per_cube = if d <= SHARED_GAIN_WIDTH {
        ROWS_PER_CUBE
    } else {
        1
    };
    let blocks = rows.div_ceil(rows_per_cube);
    if blocks == 0 {
        // No rows: no gradient to form, and a gain gradient of zeros.
        let zeros = zeros_client(x.client.clone(), x.device.clone(), [d].into(), x.dtype);
        return (from_primitive(x_grad), from_primitive(zeros));
    }
    let partials = empty_shaped(&x, vec![blocks, d]);
    let client = x.client.clone();
    let cube_dim = CubeDim::new_1d(ROW_THREADS as u32);
    let cube_count = calculate_cube_count_elemwise(&client, blocks * ROW_THREADS, cube_dim);
    kernels::rms_norm_backward_kernel::launch::<R>(
        &client,
        cube_count,
        cube_dim,
        x.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        grad.into_tensor_arg(),
        x_grad.clone().into_tensor_arg(),
        partials.clone().into_tensor_arg(),
        epsilon as f32,
        rows_per_cube as u32,
        ROW_THREADS,
        d.min(SHARED_GAIN_WIDTH + 1),
        plane_reduction(&client, ROW_THREADS),
        x.dtype.into(),
    );
    (
        from_primitive(x_grad),
        from_primitive(column_sums(&partials)),
    )
}

/// `Σ_rows partials[row, k]` for every column `k` of a contiguous `[rows, d]` tensor, one thread
/// per column adding its rows in order.
pub(in crate::ops) fn column_sums<R: CubeRuntime>(partials: &CubeTensor<R>) -> CubeTensor<R> {
    let d = partials.meta.shape()[1];
    let sums = empty_shaped(partials, vec![d]);
    let cube_dim = CubeDim::new_1d(COLUMN_THREADS as u32);
    let cube_count: CubeCount = calculate_cube_count_elemwise(&partials.client, d, cube_dim);
    kernels::column_sums_kernel::launch::<R>(
        &partials.client,
        cube_count,
        cube_dim,
        partials.clone().into_tensor_arg(),
        sums.clone().into_tensor_arg(),
        partials.dtype.into(),
    );
    sums
}

pub(super) mod kernels {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;

    use crate::ops::cube_shared::kernels::{at, cube_total};

    /// `sqrt(Σ x² / d + ε)`.
    #[cube]
    fn rms_of<F: Float>(squares: F, d: usize, epsilon: f32) -> F {
        (squares / F::cast_from(d) + F::cast_from(epsilon)).sqrt()
    }

    /// `y = x / rms ⊙ w`, one cube per row.
    #[cube(launch)]
    pub(in crate::ops) fn rms_norm_kernel<F: Float>(
        x: &Tensor<F>,
        weight: &Tensor<F>,
        output: &mut Tensor<F>,
        epsilon: f32,
        #[comptime] threads: usize,
        #[comptime] planes: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let d = output.shape(1);
        let row = CUBE_POS;
        if row >= output.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let mut partials = SharedMemory::<F>::new(threads);
        let mut squares = F::new(0.0);
        let mut k = lane;
        while k < d {
            let value = x[at(x, row, k)];
            squares += value * value;
            k += threads;
        }
        let squares = cube_total::<F>(&mut partials, lane, squares, threads, false, planes);
        let rms = rms_of::<F>(squares, d, epsilon);
        k = lane;
        while k < d {
            output[row * d + k] = x[at(x, row, k)] / rms * weight[k * weight.stride(0)];
            k += threads;
        }
    }

    /// `∂x = (∂y⊙w − x̂ mean(∂y⊙w⊙x̂)) / rms`, with `x̂ = x / rms`, for a block of
    /// `rows_per_cube` rows per cube, and the block's sum of `∂w`'s shares `∂y⊙x̂` in row
    /// `CUBE_POS` of `gain_partials`. A thread keeps the columns `k ≡ lane (mod threads)` of the
    /// sum in shared memory (`width` is the row's width, or `SHARED_GAIN_WIDTH + 1` for rows too
    /// wide for it, which come one per cube and write their shares straight out).
    #[cube(launch)]
    pub(in crate::ops) fn rms_norm_backward_kernel<F: Float>(
        x: &Tensor<F>,
        weight: &Tensor<F>,
        grad: &Tensor<F>,
        x_grad: &mut Tensor<F>,
        gain_partials: &mut Tensor<F>,
        epsilon: f32,
        rows_per_cube: u32,
        #[comptime] threads: usize,
        #[comptime] width: usize,
        #[comptime] planes: bool,
        #[define(F)] _dtype: StorageType,
    ) {
        let (rows, d) = (x_grad.shape(0), x_grad.shape(1));
        let block = CUBE_POS;
        if block >= gain_partials.shape(0) {
            terminate!();
        }
        let lane = UNIT_POS_X as usize;
        let first = block * rows_per_cube as usize;
        let mut end = first + rows_per_cube as usize;
        if end > rows {
            end = rows;
        }
        let shared_gain = comptime!(width <= crate::ops::norm::cube::SHARED_GAIN_WIDTH);
        let mut gain = SharedMemory::<F>::new(comptime!(if shared_gain { width } else { 1 }));
        let mut partials = SharedMemory::<F>::new(threads);
        let mut k = lane;
        if shared_gain {
            while k < d {
                gain[k] = F::new(0.0);
                k += threads;
            }
        }
        for row in first..end {
            let mut squares = F::new(0.0);
            let mut along = F::new(0.0);
            k = lane;
            while k < d {
                let value = x[at(x, row, k)];
                squares += value * value;
                along += grad[at(grad, row, k)] * weight[k * weight.stride(0)] * value;
                k += threads;
            }
            let squares = cube_total::<F>(&mut partials, lane, squares, threads, false, planes);
            let along = cube_total::<F>(&mut partials, lane, along, threads, false, planes);
            let rms = rms_of::<F>(squares, d, epsilon);
            let along_row = along / rms / F::cast_from(d);
            k = lane;
            while k < d {
                let normed = x[at(x, row, k)] / rms;
                let dy = grad[at(grad, row, k)];
                x_grad[row * d + k] =
                    (dy * weight[k * weight.stride(0)] - normed * along_row) / rms;
                if shared_gain {
                    gain[k] += dy * normed;
                } else {
                    gain_partials[block * d + k] = dy * normed;
                }
                k += threads;
            }
        }
        if shared_gain {
            k = lane;
            while k < d {
                gain_partials[block * d + k] = gain[k];
                k += threads;
            }
        }
    }

    /// `sums[k] = Σ_rows partials[row, k]` of a contiguous `[rows, d]` tensor, one thread per
    /// column, the rows in order.
    #[cube(launch)]
    pub(in crate::ops) fn column_sums_kernel<F: Float>(
        partials: &Tensor<F>,
        sums: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        let (rows, d) = (partials.shape(0), partials.shape(1));
        let column = ABSOLUTE_POS;
        if column >= d {
            terminate!();
        }
        let mut total = F::new(0.0);
        for row in 0..rows {
            total += partials[row * d + column];
        }
        sums[column] = total;
    }
}
