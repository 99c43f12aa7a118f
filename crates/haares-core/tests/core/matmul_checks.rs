//! Burn's matrix product at the contraction lengths where cubek-matmul 0.2.0 (the version Burn
//! 0.21 uses) is known to read past its operands, against f64 on the host.
//!
//! Its double-buffered kernels (`DoubleUnit`, `DoubleCyclic*`) and its specialized ones
//! (`Specialized*`) walk the contraction two stages at a time and round an odd stage count up to
//! even, while the bounds check that would stop the extra stage is only switched on when `k` is
//! not a multiple of one stage: at `k` an odd multiple of the stage's `k` extent (32 for the
//! tensor-core kernels: `k mod 64 = 32`) they add one stage of whatever lies past the operands
//! (tracel-ai/cubek#434, tracel-ai/burn#5237; fixed upstream only in later releases). An
//! autotuned build (the `autotune` feature) times these kernels on shapes of "medium" size and
//! larger and takes them when they are fastest; an untuned one never launches them.
//! docs/decisions.md, decision 24, says what the workspace does about it.
//!
//! So that an overrun cannot read zeros and pass: both operands hold values in `[0.5, 1.5]` and
//! are the leading rows of taller tensors of the same values, so that whatever a kernel reads one
//! stage past the contraction is a positive number and moves the product by a stage's share of it
//! (`stage / k`: 3% for a 32-deep stage at the largest `k` here).

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::common::{Rng, tensor_values};

/// Contraction lengths that are odd multiples of 4, 8, 16, 32, 64 and 128: for each stage depth
/// a kernel may take (the unit kernels' are small, the tensor-core kernels' 32), some of them are
/// an odd number of whole stages. 544 and 1056 are the paper's widths 512 and 1024 plus one
/// 32-deep stage.
pub const EVERY_STAGE_DEPTH: [usize; 13] =
    [36, 40, 48, 72, 80, 96, 160, 192, 224, 320, 384, 544, 1056];
/// Odd multiples of the tensor-core kernels' stage depths (16, 32, 64): on a GPU with tensor
/// cores, where every tuned candidate is compiled by NVRTC and the GPU check's time is short.
pub const TENSOR_CORE_STAGE_DEPTHS: [usize; 7] = [48, 80, 96, 160, 192, 544, 1056];
/// Rows of the product: 512 makes every shape "medium", where autotuning times the
/// double-buffered kernels first (`should_tune_double_buffering`).
const ROWS: usize = 512;
const COLUMNS: usize = 128;
/// Rows each operand's storage has past the contraction: a whole stage of the deepest (128).
const SPARE: usize = 128;

/// `rows × columns` values in `[0.5, 1.5]`, row-major.
fn positive(rng: &mut Rng, rows: usize, columns: usize) -> Vec<f64> {
    (0..rows * columns).map(|_| 0.5 + rng.uniform()).collect()
}

/// The first `rows` rows of a `[rows + SPARE, columns]` tensor of `stored` (which holds all
/// of them): a view whose buffer goes on past its end with more positive values.
fn leading_rows<B: Backend>(stored: &[f64], rows: usize, columns: usize) -> Tensor<B, 2> {
    let tall = Tensor::<B, 2>::from_data(
        TensorData::new(stored.to_vec(), [rows + SPARE, columns]),
        &Default::default(),
    );
    tall.slice([0..rows, 0..columns])
}

/// `Σ_k a[i][k] · b[k][j]` in f64, `a` row-major `m × k` read through `a_at`.
fn product_f64(
    a_at: impl Fn(usize, usize) -> f64,
    b: &[f64],
    (m, k, n): (usize, usize, usize),
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for l in 0..k {
            let a = a_at(i, l);
            for j in 0..n {
                out[i * n + j] += a * b[l * n + j];
            }
        }
    }
    out
}

/// The product at each of the `contractions`, with the left operand stored as it is read and
/// stored transposed (as the backward pass's `xᵀ ∂Y` reads the tokens), within `tolerance`
/// of f64 relative to each element (every term is positive, so an element is its own scale).
pub fn products_agree_with_f64_at_odd_stage_counts<B: Backend>(
    contractions: &[usize],
    tolerance: f64,
) {
    let mut rng = Rng::new(434);
    for &k in contractions {
        for lhs_transposed in [false, true] {
            let rhs_values = positive(&mut rng, k + SPARE, COLUMNS);
            let rhs = leading_rows::<B>(&rhs_values, k, COLUMNS);
            let (lhs, expected) = if lhs_transposed {
                let stored = positive(&mut rng, k + SPARE, ROWS);
                let lhs = leading_rows::<B>(&stored, k, ROWS).transpose();
                let at = |i: usize, l: usize| stored[l * ROWS + i];
                (lhs, product_f64(at, &rhs_values, (ROWS, k, COLUMNS)))
            } else {
                // A row past the last one holds more values, as the rows between them do.
                let stored = positive(&mut rng, ROWS + SPARE, k);
                let lhs = leading_rows::<B>(&stored, ROWS, k);
                let at = |i: usize, l: usize| stored[i * k + l];
                (lhs, product_f64(at, &rhs_values, (ROWS, k, COLUMNS)))
            };
            let actual = tensor_values(lhs.matmul(rhs));
            let worst = actual
                .iter()
                .zip(&expected)
                .map(|(a, e)| (a - e).abs() / e)
                .map(|error| if error.is_nan() { f64::INFINITY } else { error })
                .fold(0.0f64, f64::max);
            assert!(
                worst <= tolerance,
                "matmul [{ROWS}, {k}] x [{k}, {COLUMNS}] (left operand {}): largest relative \
                 error {worst:.2e}, over {tolerance:.0e}. An error of a few percent is one \
                 contraction stage read past the operands: the known overrun of cubek-matmul \
                 0.2.0's double-buffered and specialized kernels (docs/decisions.md, decision \
                 24); build without the `autotune` feature",
                if lhs_transposed {
                    "transposed"
                } else {
                    "row-major"
                },
            );
        }
    }
}
