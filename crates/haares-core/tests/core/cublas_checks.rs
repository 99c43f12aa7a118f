//! cuBLAS's products on CUDA (`ops::matmul::cublas`) in every layout the model hands them, against
//! f64 on the host: the device half of `core/blas_call.rs`, which checks the same calls' arguments
//! against the BLAS definition without a GPU. Each case's operands are Burn tensors on the CUDA
//! backend as the model makes them: row-major, transposed views, batched with nesting, broadcast
//! and permuted batch dimensions, rows pitched inside a wider buffer, views that start inside a
//! larger buffer, and the edge sizes (a batch of one, `k = 1`, one row). Run by the portability
//! suite's `cuda` module (`--features cuda`).

use burn::tensor::{Tensor, TensorData};
use burn_cubecl::tensor::CubeTensor;
use haares_core::backend::Cuda;
use haares_core::ops::matmul::cublas::{self, BlasPrecision};

use super::common::{Rng, tensor_values};

/// An operand: its logical values (row-major over `dims`) and the tensor handed to the product.
struct Operand<const D: usize> {
    values: Vec<f64>,
    dims: [usize; D],
    tensor: Tensor<Cuda, D>,
}

/// How a case lays out an operand on the device.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Stored as it is read.
    RowMajor,
    /// Stored with the last two dimensions swapped, handed over as a transposed view.
    Transposed,
    /// The middle of a wider and taller tensor: rows pitched, the view starting 3 rows and 8
    /// columns in.
    Inside,
    /// Dimensions 1 and 2 stored swapped (a `[b, s, h, d_h]` tensor read as `[b, h, s, d_h]`).
    HeadsSwapped,
}

fn operand<const D: usize>(rng: &mut Rng, dims: [usize; D], layout: Layout) -> Operand<D> {
    let values = rng.normals(dims.iter().product(), 1.0);
    let device = Default::default();
    let stored = |dims: [usize; D], values: Vec<f64>| {
        Tensor::<Cuda, D>::from_data(TensorData::new(values, dims), &device)
    };
    let tensor = match layout {
        Layout::RowMajor => stored(dims, values.clone()),
        Layout::Transposed => {
            let mut swapped = dims;
            swapped.swap(D - 1, D - 2);
            let transposed = permuted(&values, &dims, D - 2, D - 1);
            stored(swapped, transposed).swap_dims(D - 2, D - 1)
        }
        Layout::HeadsSwapped => {
            let mut swapped = dims;
            swapped.swap(1, 2);
            stored(swapped, permuted(&values, &dims, 1, 2)).swap_dims(1, 2)
        }
        Layout::Inside => {
            let (rows, columns) = (dims[D - 2], dims[D - 1]);
            let mut wide = dims;
            (wide[D - 2], wide[D - 1]) = (rows + 5, columns + 40);
            let mut buffer = vec![f64::NAN; wide.iter().product()];
            for (index, value) in values.iter().enumerate() {
                let (matrix, within) = (index / (rows * columns), index % (rows * columns));
                let (row, column) = (within / columns, within % columns);
                let at = (matrix * wide[D - 2] + row + 3) * wide[D - 1] + column + 8;
                buffer[at] = *value;
            }
            let ranges: [std::ops::Range<usize>; D] = std::array::from_fn(|dim| match dim {
                d if d == D - 2 => 3..3 + rows,
                d if d == D - 1 => 8..8 + columns,
                d => 0..dims[d],
            });
            stored(wide, buffer).slice(ranges)
        }
    };
    Operand {
        values,
        dims,
        tensor,
    }
}

/// `values` (row-major over `dims`) with dimensions `a` and `b` swapped, row-major over the
/// swapped dimensions.
fn permuted<const D: usize>(values: &[f64], dims: &[usize; D], a: usize, b: usize) -> Vec<f64> {
    let mut swapped = *dims;
    swapped.swap(a, b);
    let mut out = vec![0.0; values.len()];
    for (index, value) in values.iter().enumerate() {
        let mut rest = index;
        let mut position = [0usize; D];
        for dim in (0..D).rev() {
            position[dim] = rest % dims[dim];
            rest /= dims[dim];
        }
        position.swap(a, b);
        let at = position
            .iter()
            .zip(&swapped)
            .fold(0, |at, (p, size)| at * size + p);
        out[at] = *value;
    }
    out
}

/// `lhs · rhs` in f64 with each element's scale `Σ_k |a||b|`, broadcasting batch dimensions of 1.
fn expected<const D: usize>(lhs: &Operand<D>, rhs: &Operand<D>) -> (Vec<f64>, Vec<f64>) {
    let (m, k, n) = (lhs.dims[D - 2], lhs.dims[D - 1], rhs.dims[D - 1]);
    let batch: Vec<usize> = (0..D - 2).map(|d| lhs.dims[d].max(rhs.dims[d])).collect();
    let matrix_of = |dims: &[usize; D], mut index: usize| {
        let (mut flat, mut scale) = (0, 1);
        for dim in (0..D - 2).rev() {
            let at = if dims[dim] == 1 {
                0
            } else {
                index % batch[dim]
            };
            index /= batch[dim];
            flat += at * scale;
            scale *= dims[dim];
        }
        flat
    };
    let matrices: usize = batch.iter().product();
    let (mut product, mut scale) = (vec![0.0; matrices * m * n], vec![0.0; matrices * m * n]);
    for matrix in 0..matrices {
        let a = matrix_of(&lhs.dims, matrix) * m * k;
        let b = matrix_of(&rhs.dims, matrix) * k * n;
        for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
            let at = matrix * m * n + i * n + j;
            for l in 0..k {
                let term = lhs.values[a + i * k + l] * rhs.values[b + l * n + j];
                product[at] += term;
                scale[at] += term.abs();
            }
        }
    }
    (product, scale)
}

fn primitive<const D: usize>(
    tensor: Tensor<Cuda, D>,
) -> CubeTensor<burn_cubecl::cubecl::cuda::CudaRuntime> {
    tensor.into_primitive().tensor()
}

/// One case at both precisions: TF32 within `2e-3` of each element's scale (an operand's TF32
/// rounding is 4.9e-4 of it), f32 within `1e-5`.
fn check<const D: usize>(
    rng: &mut Rng,
    [lhs_dims, rhs_dims]: [[usize; D]; 2],
    layouts: [Layout; 2],
) {
    let lhs = operand(rng, lhs_dims, layouts[0]);
    let rhs = operand(rng, rhs_dims, layouts[1]);
    let (exact, scale) = expected(&lhs, &rhs);
    for (precision, tolerance) in [(BlasPrecision::Tf32, 2e-3), (BlasPrecision::Fp32, 1e-5)] {
        let out = cublas::matmul(
            primitive(lhs.tensor.clone()),
            primitive(rhs.tensor.clone()),
            precision,
        )
        .unwrap_or_else(|failure| panic!("{lhs_dims:?} · {rhs_dims:?} {layouts:?}: {failure}"));
        let actual = tensor_values(Tensor::<Cuda, D>::from_primitive(
            burn::tensor::TensorPrimitive::Float(out),
        ));
        assert_eq!(
            actual.len(),
            exact.len(),
            "{lhs_dims:?} · {rhs_dims:?}: output size"
        );
        let worst = actual
            .iter()
            .zip(exact.iter().zip(&scale))
            .map(|(a, (e, s))| (a - e).abs() / s.max(1e-30))
            .map(|error| if error.is_nan() { f64::INFINITY } else { error })
            .fold(0.0f64, f64::max);
        assert!(
            worst <= tolerance,
            "{lhs_dims:?} · {rhs_dims:?} {layouts:?} at {precision:?}: {worst:.2e} of the scale"
        );
    }
}

/// Every layout the backbone and its backward pass hand the product, and the edge cases.
pub fn cublas_products_match_f64_in_every_layout() {
    use Layout::{HeadsSwapped, Inside, RowMajor, Transposed};
    let mut rng = Rng::new(8_2026);
    // A projection at sizes that are no multiple of a tile, its input gradient `∂C Wᵀ` (the
    // weight a transposed view) and its weight gradient `Aᵀ ∂C` (the input a transposed view).
    check(&mut rng, [[300, 96], [96, 200]], [RowMajor, RowMajor]);
    check(&mut rng, [[300, 200], [200, 96]], [RowMajor, Transposed]);
    check(&mut rng, [[96, 300], [300, 200]], [Transposed, RowMajor]);
    check(&mut rng, [[96, 300], [300, 200]], [Transposed, Transposed]);
    // A `d_ff` whose rows CubeCL pads (352 f32), operands inside larger buffers.
    check(&mut rng, [[130, 352], [352, 352]], [RowMajor, RowMajor]);
    check(&mut rng, [[130, 72], [72, 352]], [Inside, Inside]);
    // Batched: nesting strides, a broadcast weight, the heads as a view, a transposed key.
    check(
        &mut rng,
        [[2, 3, 40, 24], [2, 3, 24, 56]],
        [RowMajor, RowMajor],
    );
    check(
        &mut rng,
        [[2, 3, 40, 24], [1, 1, 24, 56]],
        [RowMajor, RowMajor],
    );
    check(
        &mut rng,
        [[2, 3, 40, 40], [2, 3, 40, 24]],
        [RowMajor, HeadsSwapped],
    );
    check(
        &mut rng,
        [[2, 3, 40, 24], [2, 3, 24, 40]],
        [HeadsSwapped, Transposed],
    );
    check(
        &mut rng,
        [[2, 3, 40, 24], [2, 3, 24, 56]],
        [Inside, Transposed],
    );
    // Edge sizes: a batch of one, a contraction of one, one row, one column.
    check(&mut rng, [[1, 17, 9], [1, 9, 33]], [RowMajor, RowMajor]);
    check(&mut rng, [[4, 17, 1], [4, 1, 33]], [RowMajor, Transposed]);
    check(&mut rng, [[4, 1, 9], [4, 9, 33]], [RowMajor, RowMajor]);
    check(&mut rng, [[4, 17, 9], [4, 9, 1]], [Transposed, RowMajor]);
}

/// The test, named `cublas_checks::cuda::…` so that the GPU check's filter of the backend's tests
/// (`cuda::`) takes it.
pub mod cuda {
    #[test]
    fn products_match_f64_in_every_layout() {
        super::cublas_products_match_f64_in_every_layout();
    }
}
