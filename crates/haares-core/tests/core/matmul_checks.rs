//! The matrix product's checks (`ops::matmul`), generic over the backend: the products' autodiff
//! nodes against Burn's autodiff of `matmul` (`core/matmul.rs` runs it on NdArray f64 and Flex,
//! `portability.rs` on NdArray f32, Flex and the cube backends); and the backend's product
//! (`MatmulBackend::matmul`, the one the model runs: on CUDA the process's provider) at the
//! contraction lengths where cubek-matmul 0.2.0 (the version Burn 0.21 uses) is known to read past
//! its operands, against f64 on the host (on the cube backends).
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

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use haares_core::HaaresBackend;

use super::common::{Rng, max_abs_diff, tensor, tensor_values};

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
pub fn products_agree_with_f64_at_odd_stage_counts<B: HaaresBackend>(
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
            let actual = tensor_values(B::matmul(lhs, rhs));
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

/// How a case hands its stored right operand to the product.
#[derive(Debug, Clone, Copy)]
enum Rhs {
    /// `A · B`, `B` stored `[k, n]`.
    AsStored,
    /// `A · Bᵀ` through `matmul` of a transposed view, `B` stored `[n, k]` (the view's gradient
    /// goes back through Burn's `swap_dims`).
    TransposedView,
    /// `A · Bᵀ` by `matmul_transposed_rhs`, `B` stored `[n, k]`.
    TransposedOperation,
}

/// The nodes' gradients against Burn's autodiff of `matmul`, with either operand tracked or
/// both: a projection (`[tokens, d] · [d, d']`), attention's batched `Q Kᵀ` as a view and as its
/// own operation, and the tied head's `h Eᵀ`.
pub fn nodes_agree_with_autodiff_of_matmul<B: AutodiffBackend + HaaresBackend>(tolerance: f64) {
    let mut rng = Rng::new(304);
    let cases = [
        ([1, 1, 12, 8], [1, 1, 8, 6], Rhs::AsStored),
        ([2, 3, 7, 5], [2, 3, 7, 5], Rhs::TransposedView),
        ([2, 3, 7, 5], [2, 3, 7, 5], Rhs::TransposedOperation),
        ([1, 1, 12, 8], [1, 1, 10, 8], Rhs::TransposedOperation),
    ];
    for (lhs_dims, rhs_dims, form) in cases {
        let (a, b) = (
            rng.normals(lhs_dims.iter().product(), 1.0),
            rng.normals(rhs_dims.iter().product(), 1.0),
        );
        let columns = match form {
            Rhs::AsStored => rhs_dims[3],
            Rhs::TransposedView | Rhs::TransposedOperation => rhs_dims[2],
        };
        let weights = rng.normals(lhs_dims[..3].iter().product::<usize>() * columns, 1.0);
        for (lhs_tracked, rhs_tracked) in [(true, true), (true, false), (false, true)] {
            let inputs = || {
                let track = |x: Tensor<B, 4>, on: bool| if on { x.require_grad() } else { x };
                (
                    track(tensor::<B, 4>(a.clone(), lhs_dims), lhs_tracked),
                    track(tensor::<B, 4>(b.clone(), rhs_dims), rhs_tracked),
                )
            };
            let total = |output: Tensor<B, 4>| {
                let dims = output.dims();
                (output * tensor::<B, 4>(weights.clone(), dims))
                    .sum()
                    .backward()
            };
            let transposed = |x: Tensor<B, 4>| x.swap_dims(2, 3);
            let (ours_lhs, ours_rhs) = inputs();
            let ours = total(match form {
                Rhs::AsStored => B::matmul(ours_lhs.clone(), ours_rhs.clone()),
                Rhs::TransposedView => B::matmul(ours_lhs.clone(), transposed(ours_rhs.clone())),
                Rhs::TransposedOperation => {
                    B::matmul_transposed_rhs(ours_lhs.clone(), ours_rhs.clone())
                }
            });
            let (burns_lhs, burns_rhs) = inputs();
            let burns = total(match form {
                Rhs::AsStored => burns_lhs.clone().matmul(burns_rhs.clone()),
                _ => burns_lhs.clone().matmul(transposed(burns_rhs.clone())),
            });
            let what =
                format!("{lhs_dims:?}, {rhs_dims:?} {form:?}, tracked {lhs_tracked}/{rhs_tracked}");
            for (ours_input, burns_input, tracked) in [
                (ours_lhs, burns_lhs, lhs_tracked),
                (ours_rhs, burns_rhs, rhs_tracked),
            ] {
                match (ours_input.grad(&ours), burns_input.grad(&burns)) {
                    (Some(ours), Some(burns)) => {
                        let (ours, burns) = (tensor_values(ours), tensor_values(burns));
                        let scale = burns.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                        let diff = max_abs_diff(&ours, &burns);
                        assert!(diff <= tolerance * scale, "{what}: {diff:e}");
                    }
                    (None, None) => assert!(!tracked, "{what}: a tracked input has no gradient"),
                    _ => panic!("{what}: one side has a gradient, the other none"),
                }
            }
        }
    }
}
