//! A host interpreter of the BLAS definition and the layouts the mapping's tests lay operands
//! out in (`blas_call.rs`): `C = op(A) · op(B)`, column-major, `ld` apart, strided batches,
//! written from the definition alone; every element outside an operand's layout is NaN.

use haares_core::ops::matmul::blas_call::{
    BlasInput, GemmCall, Operand, StridedLayout, gemm_calls,
};

use crate::common::Rng;

/// A tensor laid out in a buffer: its logical shape, strides, and the buffer (NaN outside it).
pub(crate) struct Laid {
    pub(crate) shape: Vec<usize>,
    pub(crate) strides: Vec<usize>,
    pub(crate) buffer: Vec<f64>,
}

impl Laid {
    pub(crate) fn layout(&self) -> StridedLayout<'_> {
        StridedLayout {
            shape: &self.shape,
            strides: &self.strides,
        }
    }

    /// Buffer offsets of every logical element, row-major over the logical shape.
    pub(crate) fn offsets(&self) -> Vec<usize> {
        let count: usize = self.shape.iter().product();
        (0..count)
            .map(|mut index| {
                let mut offset = 0;
                for (size, stride) in self.shape.iter().zip(&self.strides).rev() {
                    offset += (index % size) * stride;
                    index /= size;
                }
                offset
            })
            .collect()
    }

    pub(crate) fn values(&self) -> Vec<f64> {
        self.offsets()
            .into_iter()
            .map(|at| self.buffer[at])
            .collect()
    }
}

/// How to lay a tensor out: the order its dimensions are stored in (outermost first, as indices
/// of the logical shape) and the padding added to the innermost stored dimension's pitch. A view
/// that starts inside a larger buffer differs only in its pointer, which the device path takes
/// from the view itself (CubeCL's resource of a handle starts at the handle's offset), so its
/// layout here starts at 0.
pub(crate) struct Storage {
    pub(crate) order: Vec<usize>,
    pub(crate) pitch_padding: usize,
}

impl Storage {
    pub(crate) fn row_major(rank: usize) -> Self {
        Self {
            order: (0..rank).collect(),
            pitch_padding: 0,
        }
    }

    /// The last two dimensions stored swapped: a transposed view of a row-major tensor.
    pub(crate) fn transposed(rank: usize) -> Self {
        let mut order: Vec<usize> = (0..rank).collect();
        order.swap(rank - 1, rank - 2);
        Self {
            order,
            pitch_padding: 0,
        }
    }

    pub(crate) fn pitched(mut self, padding: usize) -> Self {
        self.pitch_padding = padding;
        self
    }
}

/// `values` (row-major over `shape`) laid out as `storage` says, NaN everywhere else.
pub(crate) fn lay_out(shape: &[usize], values: &[f64], storage: &Storage) -> Laid {
    let mut strides = vec![0; shape.len()];
    let mut stride = 1;
    for (position, &dim) in storage.order.iter().enumerate().rev() {
        strides[dim] = stride;
        let padding = if position + 1 == storage.order.len() {
            storage.pitch_padding
        } else {
            0
        };
        stride *= shape[dim] + padding;
    }
    // Three more elements past the layout's span, NaN like every gap inside it.
    let mut laid = Laid {
        shape: shape.to_vec(),
        strides,
        buffer: vec![f64::NAN; stride + 3],
    };
    for (offset, value) in laid.offsets().into_iter().zip(values) {
        laid.buffer[offset] = *value;
    }
    laid
}

/// Element `(row, column)` of `op(X)` for matrix `matrix` of a call's batch.
pub(crate) fn read(
    input: &BlasInput,
    buffer: &[f64],
    matrix: usize,
    row: usize,
    column: usize,
) -> f64 {
    let (i, j) = if input.transposed {
        (column, row)
    } else {
        (row, column)
    };
    buffer[input.offset + matrix * input.batch_stride + i + j * input.ld]
}

/// BLAS's `C = op(A) · op(B)` (α = 1, β = 0), column-major, for every matrix of the batch.
pub(crate) fn interpret(call: &GemmCall, lhs: &[f64], rhs: &[f64], out: &mut [f64]) {
    // cuBLAS's own argument rules (it refuses a call that breaks one): positive sizes within
    // its 32-bit integers, `lda ≥ max(1, rows of A as stored)`, the same for `ldb`, `ldc ≥ m`.
    let int = |value: usize| value >= 1 && i32::try_from(value).is_ok();
    assert!(
        [call.m, call.n, call.k, call.batch].into_iter().all(int),
        "sizes: {call:?}"
    );
    let stored_rows = |input: &BlasInput, rows: usize, columns: usize| match input.transposed {
        false => rows,
        true => columns,
    };
    assert!(
        call.a.ld >= stored_rows(&call.a, call.m, call.k).max(1),
        "lda: {call:?}"
    );
    assert!(
        call.b.ld >= stored_rows(&call.b, call.k, call.n).max(1),
        "ldb: {call:?}"
    );
    assert!(call.c.ld >= call.m.max(1), "ldc: {call:?}");
    let buffer = |input: &BlasInput| match input.operand {
        Operand::Lhs => lhs,
        Operand::Rhs => rhs,
    };
    let (a, b) = (buffer(&call.a), buffer(&call.b));
    for matrix in 0..call.batch {
        for (i, j) in (0..call.m).flat_map(|i| (0..call.n).map(move |j| (i, j))) {
            let sum: f64 = (0..call.k)
                .map(|l| read(&call.a, a, matrix, i, l) * read(&call.b, b, matrix, l, j))
                .sum();
            out[call.c.offset + matrix * call.c.batch_stride + i + j * call.c.ld] = sum;
        }
    }
}

/// The product of the logical operands, broadcasting batch dimensions of size one.
pub(crate) fn product(lhs: &Laid, rhs: &Laid, out_shape: &[usize]) -> Vec<f64> {
    let rank = out_shape.len();
    let (m, k, n) = (
        lhs.shape[rank - 2],
        lhs.shape[rank - 1],
        rhs.shape[rank - 1],
    );
    let (lhs_values, rhs_values) = (lhs.values(), rhs.values());
    let batch = &out_shape[..rank - 2];
    let matrices: usize = batch.iter().product();
    let matrix_of = |laid: &Laid, mut index: usize| {
        let (mut flat, mut scale) = (0, 1);
        for (dim, &size) in batch.iter().enumerate().rev() {
            let at = if laid.shape[dim] == 1 {
                0
            } else {
                index % size
            };
            index /= size;
            flat += at * scale;
            scale *= laid.shape[dim];
        }
        flat
    };
    let mut out = vec![0.0; matrices * m * n];
    for matrix in 0..matrices {
        let (a, b) = (
            matrix_of(lhs, matrix) * m * k,
            matrix_of(rhs, matrix) * k * n,
        );
        for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
            out[matrix * m * n + i * n + j] = (0..k)
                .map(|l| lhs_values[a + i * k + l] * rhs_values[b + l * n + j])
                .sum();
        }
    }
    out
}

/// Lays out both operands and the output as given, runs the calls through the interpreter and
/// checks the product, the untouched padding and, where given, the number of calls.
pub(crate) fn check(
    rng: &mut Rng,
    [lhs_shape, rhs_shape, out_shape]: [&[usize]; 3],
    [lhs_storage, rhs_storage, out_storage]: [Storage; 3],
    expected_calls: Option<usize>,
) {
    check_perturbed(
        rng,
        [lhs_shape, rhs_shape, out_shape],
        [lhs_storage, rhs_storage, out_storage],
        expected_calls,
        false,
    );
}

/// [`check`], and with `perturbed` the strides Burn's views give: an input's broadcast batch
/// dimension expanded to the output's size with stride 0 (`Tensor::expand`), and any dimension of
/// size one given an arbitrary stride (0, 1, 7 or 1,000; it is never stepped along).
pub(crate) fn check_perturbed(
    rng: &mut Rng,
    [lhs_shape, rhs_shape, out_shape]: [&[usize]; 3],
    [lhs_storage, rhs_storage, out_storage]: [Storage; 3],
    expected_calls: Option<usize>,
    perturbed: bool,
) {
    let random = |rng: &mut Rng, shape: &[usize]| rng.normals(shape.iter().product(), 1.0);
    let mut lhs = lay_out(lhs_shape, &random(rng, lhs_shape), &lhs_storage);
    let mut rhs = lay_out(rhs_shape, &random(rng, rhs_shape), &rhs_storage);
    let mut out = lay_out(
        out_shape,
        &vec![f64::NAN; out_shape.iter().product()],
        &out_storage,
    );
    if perturbed {
        let rank = out_shape.len();
        for laid in [&mut lhs, &mut rhs] {
            for dim in 0..rank - 2 {
                if laid.shape[dim] == 1 && out_shape[dim] > 1 && rng.below(2) == 0 {
                    (laid.shape[dim], laid.strides[dim]) = (out_shape[dim], 0);
                }
            }
        }
        for laid in [&mut lhs, &mut rhs, &mut out] {
            for dim in 0..rank {
                if laid.shape[dim] == 1 {
                    laid.strides[dim] = [0, 1, 7, 1000][rng.below(4)];
                }
            }
        }
    }
    let (lhs_shape, rhs_shape) = (lhs.shape.clone(), rhs.shape.clone());
    let calls = gemm_calls(lhs.layout(), rhs.layout(), out.layout())
        .unwrap_or_else(|why| panic!("{lhs_shape:?} · {rhs_shape:?}: no BLAS call ({why})"));
    if let Some(expected) = expected_calls {
        assert_eq!(
            calls.len(),
            expected,
            "calls for {lhs_shape:?} · {rhs_shape:?}: {calls:?}"
        );
    }
    for call in &calls {
        interpret(call, &lhs.buffer, &rhs.buffer, &mut out.buffer);
    }
    let expected = product(&lhs, &rhs, out_shape);
    for (index, (got, want)) in out.values().iter().zip(&expected).enumerate() {
        assert!(
            (got - want).abs() <= 1e-12 * (1.0 + want.abs()),
            "{lhs_shape:?} · {rhs_shape:?}, element {index}: {got} against {want} ({calls:?})"
        );
    }
    let inside: std::collections::HashSet<usize> = out.offsets().into_iter().collect();
    for (at, value) in out.buffer.iter().enumerate() {
        assert!(
            inside.contains(&at) || value.is_nan(),
            "a write outside the output at {at}"
        );
    }
}
