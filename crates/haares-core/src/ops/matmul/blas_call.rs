//! A product of strided tensors as column-major BLAS calls: how
//! [`MatmulBackend::matmul`](super::MatmulBackend::matmul)'s row-major operands, in whatever
//! layout the model hands them over, become the arguments of cuBLAS's `gemmStridedBatched`.
//!
//! BLAS reads a matrix column-major: element `(i, j)` of a matrix stored `ld` apart lies at
//! `i + j · ld`, and a call computes `C = op(A) · op(B)` with `op` either the matrix or its
//! transpose. A row-major matrix `X` (`[rows, columns]`, columns one apart) is, read column-major,
//! `Xᵀ` with `ld` its row stride; a transposed view (rows one apart) is `X` itself, `ld` its
//! column stride. A product with a row-major output is therefore taken as `Cᵀ = Bᵀ · Aᵀ`: BLAS's
//! `A` is our right operand and its `B` our left one, `m` and `n` swapped. Rows padded to a
//! pitch (CubeCL's allocator pads a new tensor's rows) only change `ld`; a view into a larger
//! buffer only its offset.
//!
//! Batch dimensions become one strided batch where their strides nest (each the next one's
//! stride times its size, for every operand; a broadcast dimension has stride 0); the batch
//! dimensions outside the innermost nesting run are taken one call per index.
//!
//! This module is pure arithmetic on shapes and strides, so it is tested on any machine
//! against a host interpreter of the BLAS definition (`tests/core/blas_call.rs`); the CUDA path
//! (`cublas/`) only turns a [`GemmCall`] into pointers.

use std::fmt;

/// One operand as it lies in memory: its shape and its strides in elements, the batch
/// dimensions first, then the matrix's rows and columns.
#[derive(Debug, Clone, Copy)]
pub struct StridedLayout<'a> {
    /// `[..., rows, columns]`.
    pub shape: &'a [usize],
    /// One stride per dimension, in elements.
    pub strides: &'a [usize],
}

/// Which of the product's operands a BLAS argument reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// The left operand, `[..., m, k]`.
    Lhs,
    /// The right operand, `[..., k, n]`.
    Rhs,
}

/// One input of a BLAS call: which operand, whether BLAS transposes it (`op = T`), its leading
/// dimension, the distance between consecutive matrices of the batch, and the offset of the
/// call's first matrix, all in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlasInput {
    /// The operand this input reads.
    pub operand: Operand,
    /// BLAS's `op`: the stored column-major matrix (`false`) or its transpose (`true`).
    pub transposed: bool,
    /// The leading dimension (`lda` or `ldb`).
    pub ld: usize,
    /// Elements between the batch's matrices (0 for a broadcast operand).
    pub batch_stride: usize,
    /// Offset of the call's first matrix from the operand's first element.
    pub offset: usize,
}

/// The output of a BLAS call, column-major: `ld`, batch stride and offset, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlasOutput {
    /// The leading dimension (`ldc`).
    pub ld: usize,
    /// Elements between the batch's matrices.
    pub batch_stride: usize,
    /// Offset of the call's first matrix from the output's first element.
    pub offset: usize,
}

/// One `gemmStridedBatched` call: `C = op(A) · op(B)` for `batch` matrices, `op(A)` being
/// `m × k` and `op(B)` `k × n` in BLAS's own (column-major) terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmCall {
    /// BLAS's `A`.
    pub a: BlasInput,
    /// BLAS's `B`.
    pub b: BlasInput,
    /// BLAS's `C`.
    pub c: BlasOutput,
    /// Rows of `op(A)` and `C`.
    pub m: usize,
    /// Columns of `op(B)` and `C`.
    pub n: usize,
    /// The contraction: columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// Matrices in this call.
    pub batch: usize,
}

/// Why a product's layout has no BLAS call. The caller copies the operand into a dense
/// row-major layout and asks again, or refuses shapes that cannot multiply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoBlasCall {
    /// The shapes cannot be multiplied, or a shape and its strides differ in length.
    Shapes(String),
    /// An operand's matrix is neither row-major nor column-major (both strides other than one,
    /// rows that overlap, or a broadcast row or column).
    Layout(Operand),
    /// The output's matrix or batch layout cannot be written by BLAS.
    OutputLayout,
    /// A size or leading dimension beyond BLAS's 32-bit integers.
    TooLarge,
    /// The contraction is empty (`k = 0`): the product is zero and needs no call.
    EmptyContraction,
}

impl fmt::Display for NoBlasCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shapes(message) => write!(f, "shapes that do not multiply: {message}"),
            Self::Layout(operand) => write!(f, "{operand:?} is neither row- nor column-major"),
            Self::OutputLayout => write!(f, "the output is neither row- nor column-major"),
            Self::TooLarge => write!(f, "a size beyond BLAS's 32-bit integers"),
            Self::EmptyContraction => write!(f, "an empty contraction (k = 0)"),
        }
    }
}

/// How a matrix lies: its columns one apart (row-major, `ld` its row stride) or its rows one
/// apart (column-major, `ld` its column stride). A dimension of size one may have any stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    RowMajor { ld: usize },
    ColumnMajor { ld: usize },
}

/// The order of a `rows × columns` matrix with strides `row_stride` and `column_stride`, or
/// `None` when BLAS cannot read it (no unit stride, overlapping or broadcast rows or columns).
/// Row-major is preferred where both fit (a matrix of one row or one column).
fn order(rows: usize, columns: usize, row_stride: usize, column_stride: usize) -> Option<Order> {
    if columns == 1 || column_stride == 1 {
        // Column-major reading: `Xᵀ`, `columns × rows`, needs `ld ≥ columns`.
        let ld = if rows == 1 { columns } else { row_stride };
        if ld >= columns.max(1) {
            return Some(Order::RowMajor { ld });
        }
    }
    if rows == 1 || row_stride == 1 {
        let ld = if columns == 1 { rows } else { column_stride };
        if ld >= rows.max(1) {
            return Some(Order::ColumnMajor { ld });
        }
    }
    None
}

/// The product `lhs · rhs` written into `out` as BLAS calls, in the order given (their outputs
/// are disjoint, so any order gives the same result).
///
/// `lhs` is `[..., m, k]`, `rhs` `[..., k, n]` and `out` `[..., m, n]`, of one rank; each batch
/// dimension of an operand equals the output's or is 1 (broadcast). An operand whose matrix has
/// no unit stride, or an output with a broadcast batch, has no call ([`NoBlasCall`]).
pub fn gemm_calls(
    lhs: StridedLayout,
    rhs: StridedLayout,
    out: StridedLayout,
) -> Result<Vec<GemmCall>, NoBlasCall> {
    let [m, k, n] = product_sizes(lhs, rhs, out)?;
    let rank = out.shape.len();
    // An empty output needs no call, whatever its strides (an empty dimension's are arbitrary).
    let empty = m == 0 || n == 0 || out.shape[..rank - 2].contains(&0);
    let batch_dims = batch_dimensions(&[lhs, rhs, out], empty)?;
    if empty {
        return Ok(Vec::new());
    }
    if k == 0 {
        return Err(NoBlasCall::EmptyContraction);
    }
    let matrix = |layout: StridedLayout, rows, columns| {
        let strides = &layout.strides[rank - 2..];
        order(rows, columns, strides[0], strides[1])
    };
    let lhs_order = matrix(lhs, m, k).ok_or(NoBlasCall::Layout(Operand::Lhs))?;
    let rhs_order = matrix(rhs, k, n).ok_or(NoBlasCall::Layout(Operand::Rhs))?;
    let out_order = matrix(out, m, n).ok_or(NoBlasCall::OutputLayout)?;
    let template = matrix_call([lhs_order, rhs_order, out_order], [m, k, n])?;
    batched_calls(template, &batch_dims)
}

/// `[m, k, n]` of `lhs · rhs` into `out`, or why the shapes do not multiply.
fn product_sizes(
    lhs: StridedLayout,
    rhs: StridedLayout,
    out: StridedLayout,
) -> Result<[usize; 3], NoBlasCall> {
    let rank = out.shape.len();
    let ranks_agree = [lhs, rhs, out]
        .iter()
        .all(|l| l.shape.len() == rank && l.strides.len() == rank);
    if rank < 2 || !ranks_agree {
        return Err(NoBlasCall::Shapes(format!(
            "ranks {:?}, {:?}, {:?} (one rank of at least 2, one stride per dimension)",
            lhs.shape, rhs.shape, out.shape
        )));
    }
    let [m, k] = [lhs.shape[rank - 2], lhs.shape[rank - 1]];
    let n = rhs.shape[rank - 1];
    if rhs.shape[rank - 2] != k || out.shape[rank - 2..] != [m, n] {
        return Err(NoBlasCall::Shapes(format!(
            "{:?} · {:?} into {:?}",
            lhs.shape, rhs.shape, out.shape
        )));
    }
    Ok([m, k, n])
}

/// The call for one matrix of the product, from the orders of `[lhs, rhs, out]`. A row-major
/// output is `Cᵀ = Bᵀ Aᵀ`: BLAS's `A` reads `rhs` as `Bᵀ`, which a row-major `rhs` already is (no
/// transpose); a column-major output is `C = A B` itself, which a row-major operand gives only
/// transposed.
fn matrix_call([lhs, rhs, out]: [Order; 3], [m, k, n]: [usize; 3]) -> Result<GemmCall, NoBlasCall> {
    let input = |operand, order: Order, read_transposed_when_row_major: bool| {
        let (ld, row_major) = match order {
            Order::RowMajor { ld } => (ld, true),
            Order::ColumnMajor { ld } => (ld, false),
        };
        let transposed = row_major == read_transposed_when_row_major;
        BlasInput {
            operand,
            transposed,
            ld,
            batch_stride: 0,
            offset: 0,
        }
    };
    let (c_ld, a, b, (call_m, call_n)) = match out {
        Order::RowMajor { ld } => (
            ld,
            input(Operand::Rhs, rhs, false),
            input(Operand::Lhs, lhs, false),
            (n, m),
        ),
        Order::ColumnMajor { ld } => (
            ld,
            input(Operand::Lhs, lhs, true),
            input(Operand::Rhs, rhs, true),
            (m, n),
        ),
    };
    let fits = |value: usize| i32::try_from(value).is_ok();
    if ![call_m, call_n, k, a.ld, b.ld, c_ld].into_iter().all(fits) {
        return Err(NoBlasCall::TooLarge);
    }
    Ok(GemmCall {
        a,
        b,
        c: BlasOutput {
            ld: c_ld,
            batch_stride: 0,
            offset: 0,
        },
        m: call_m,
        n: call_n,
        k,
        batch: 1,
    })
}

/// A batch dimension of the output with the strides each operand takes along it (`[lhs, rhs,
/// out]`; 0 where an operand is broadcast).
#[derive(Debug, Clone, Copy)]
struct BatchDimension {
    size: usize,
    strides: [usize; 3],
}

/// The output's batch dimensions of size above one, with each operand's stride along them; an
/// `empty` output's strides are not checked.
fn batch_dimensions(
    layouts: &[StridedLayout; 3],
    empty: bool,
) -> Result<Vec<BatchDimension>, NoBlasCall> {
    let [lhs, rhs, out] = layouts;
    let rank = out.shape.len();
    let mut dims = Vec::new();
    for dim in 0..rank - 2 {
        let size = out.shape[dim];
        let stride_of = |layout: &StridedLayout| match layout.shape[dim] {
            same if same == size => Ok(if size == 1 { 0 } else { layout.strides[dim] }),
            1 => Ok(0),
            other => Err(NoBlasCall::Shapes(format!(
                "batch dimension {dim}: {other} against the output's {size}"
            ))),
        };
        let strides = [stride_of(lhs)?, stride_of(rhs)?, stride_of(out)?];
        if size > 1 {
            if strides[2] == 0 && !empty {
                return Err(NoBlasCall::OutputLayout);
            }
            dims.push(BatchDimension { size, strides });
        }
    }
    Ok(dims)
}

/// `template` over the batch: the innermost dimensions whose strides nest for every operand
/// become the call's strided batch, the others one call per index.
fn batched_calls(template: GemmCall, dims: &[BatchDimension]) -> Result<Vec<GemmCall>, NoBlasCall> {
    // The nesting run starts at `first`: each dimension's stride is the next one's stride
    // times its size, for all three operands.
    let mut first = dims.len();
    while first > 0 {
        let nests = |dim: usize| {
            (0..3).all(|o| dims[dim].strides[o] == dims[dim + 1].strides[o] * dims[dim + 1].size)
        };
        if first < dims.len() && !nests(first - 1) {
            break;
        }
        first -= 1;
    }
    let (outer, inner) = dims.split_at(first);
    let batch: usize = inner.iter().map(|dim| dim.size).product();
    let innermost = inner.last().map_or([0; 3], |dim| dim.strides);
    if i32::try_from(batch).is_err() {
        return Err(NoBlasCall::TooLarge);
    }
    let calls: usize = outer.iter().map(|dim| dim.size).product();
    let by_operand = |input: BlasInput| match input.operand {
        Operand::Lhs => 0,
        Operand::Rhs => 1,
    };
    let (a_at, b_at) = (by_operand(template.a), by_operand(template.b));
    Ok((0..calls)
        .map(|mut index| {
            let mut offsets = [0usize; 3];
            for dim in outer.iter().rev() {
                let at = index % dim.size;
                index /= dim.size;
                for (offset, stride) in offsets.iter_mut().zip(dim.strides) {
                    *offset += at * stride;
                }
            }
            let mut call = template;
            call.batch = batch;
            call.a.offset = offsets[a_at];
            call.a.batch_stride = innermost[a_at];
            call.b.offset = offsets[b_at];
            call.b.batch_stride = innermost[b_at];
            call.c.offset = offsets[2];
            call.c.batch_stride = innermost[2];
            call
        })
        .collect())
}
