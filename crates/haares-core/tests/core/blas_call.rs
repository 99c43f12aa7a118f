//! The mapping of a strided row-major product onto column-major BLAS calls
//! (`ops::matmul::blas_call`), checked on the host: each call is carried out by an interpreter of
//! the BLAS definition (`C = op(A) · op(B)`, column-major, `ld` apart, strided batches), written
//! here from the definition alone, and the output read back through its own layout must equal the
//! product of the logical operands in f64. Every element outside the operands' layouts is NaN, so
//! a call that reads past an operand poisons the product; every element of the output's buffer
//! outside its layout must still be NaN afterwards, so a call that writes past it is caught.

use haares_core::ops::matmul::blas_call::{NoBlasCall, Operand, StridedLayout, gemm_calls};

use crate::blas_interpreter::{Storage, check, check_perturbed};
use crate::common::Rng;

#[test]
fn the_backbones_forward_and_backward_layouts_map_onto_blas() {
    let mut rng = Rng::new(7);
    let (tokens, d_in, d_out) = (12, 8, 5);
    // A projection, `[tokens, d_in] · [d_in, d_out]`, row-major, and into a pitched output
    // (CubeCL pads a new tensor's rows).
    let shapes: [&[usize]; 3] = [&[tokens, d_in], &[d_in, d_out], &[tokens, d_out]];
    check(
        &mut rng,
        shapes,
        [0, 0, 0].map(|_| Storage::row_major(2)),
        Some(1),
    );
    let pitched = [
        Storage::row_major(2),
        Storage::row_major(2),
        Storage::row_major(2).pitched(3),
    ];
    check(&mut rng, shapes, pitched, Some(1));
    // Its input gradient `∂C Wᵀ` (the weight as a transposed view) and its weight gradient
    // `Aᵀ ∂C` (the input as a transposed view).
    let input_grad: [&[usize]; 3] = [&[tokens, d_out], &[d_out, d_in], &[tokens, d_in]];
    check(
        &mut rng,
        input_grad,
        [
            Storage::row_major(2),
            Storage::transposed(2),
            Storage::row_major(2),
        ],
        Some(1),
    );
    let weight_grad: [&[usize]; 3] = [&[d_in, tokens], &[tokens, d_out], &[d_in, d_out]];
    check(
        &mut rng,
        weight_grad,
        [
            Storage::transposed(2),
            Storage::row_major(2),
            Storage::row_major(2),
        ],
        Some(1),
    );
    // Attention's scores `Q Kᵀ` over `[batch, heads, seq, d_h]`: one strided batch.
    let (batch, heads, seq, d_h) = (2, 3, 7, 4);
    let scores: [&[usize]; 3] = [
        &[batch, heads, seq, d_h],
        &[batch, heads, d_h, seq],
        &[batch, heads, seq, seq],
    ];
    check(
        &mut rng,
        scores,
        [
            Storage::row_major(4),
            Storage::transposed(4),
            Storage::row_major(4),
        ],
        Some(1),
    );
    // The heads as a view of `[batch, seq, heads, d_h]` (dimensions 1 and 2 swapped): the batch
    // dimensions do not nest, so one call per sequence of the batch.
    let heads_view = || Storage {
        order: vec![0, 2, 1, 3],
        pitch_padding: 0,
    };
    let values: [&[usize]; 3] = [
        &[batch, heads, seq, seq],
        &[batch, heads, seq, d_h],
        &[batch, heads, seq, d_h],
    ];
    check(
        &mut rng,
        values,
        [Storage::row_major(4), heads_view(), Storage::row_major(4)],
        Some(batch),
    );
    // A weight broadcast over the batch.
    let broadcast: [&[usize]; 3] = [&[3, tokens, d_in], &[1, d_in, d_out], &[3, tokens, d_out]];
    check(
        &mut rng,
        broadcast,
        [0, 0, 0].map(|_| Storage::row_major(3)),
        Some(1),
    );
}

#[test]
fn edge_cases_map_onto_blas() {
    let mut rng = Rng::new(11);
    let plain = || [0, 0, 0].map(|_| Storage::row_major(3));
    // A batch of one, a contraction of one, a single row, a single column.
    check(
        &mut rng,
        [&[1, 4, 3], &[1, 3, 5], &[1, 4, 5]],
        plain(),
        Some(1),
    );
    check(
        &mut rng,
        [&[2, 4, 1], &[2, 1, 5], &[2, 4, 5]],
        plain(),
        Some(1),
    );
    check(
        &mut rng,
        [&[2, 1, 3], &[2, 3, 5], &[2, 1, 5]],
        plain(),
        Some(1),
    );
    check(
        &mut rng,
        [&[2, 4, 3], &[2, 3, 1], &[2, 4, 1]],
        plain(),
        Some(1),
    );
    // A single column stored transposed, a pitched output, and a column-major output.
    let transposed_column = [
        Storage::row_major(3),
        Storage::transposed(3),
        Storage::row_major(3).pitched(4),
    ];
    check(
        &mut rng,
        [&[2, 4, 3], &[2, 3, 1], &[2, 4, 1]],
        transposed_column,
        Some(1),
    );
    let column_major_out = [
        Storage::transposed(3),
        Storage::row_major(3),
        Storage::transposed(3).pitched(2),
    ];
    check(
        &mut rng,
        [&[2, 4, 3], &[2, 3, 5], &[2, 4, 5]],
        column_major_out,
        Some(1),
    );
    // Pitched operands in every orientation.
    let all_pitched = [
        Storage::transposed(3).pitched(1),
        Storage::row_major(3).pitched(6),
        Storage::row_major(3).pitched(2),
    ];
    check(
        &mut rng,
        [&[2, 4, 3], &[2, 3, 5], &[2, 4, 5]],
        all_pitched,
        Some(1),
    );
    // An empty output needs no call.
    check(
        &mut rng,
        [&[2, 0, 3], &[2, 3, 5], &[2, 0, 5]],
        plain(),
        Some(0),
    );
}

#[test]
fn random_layouts_map_onto_blas() {
    let mut rng = Rng::new(2024);
    for _ in 0..300 {
        let rank = 2 + rng.below(3);
        let batch: Vec<usize> = (0..rank - 2).map(|_| 1 + rng.below(3)).collect();
        let [m, k, n] = [0, 0, 0].map(|_| 1 + rng.below(6));
        let shape = |rows, columns, rng: &mut Rng| {
            let mut shape: Vec<usize> = batch
                .iter()
                .map(|&b| if rng.below(4) == 0 { 1 } else { b })
                .collect();
            shape.extend([rows, columns]);
            shape
        };
        let (lhs_shape, rhs_shape) = (shape(m, k, &mut rng), shape(k, n, &mut rng));
        let mut out_shape = batch.clone();
        out_shape.extend([m, n]);
        // Batch dimensions stored in any order, each matrix row- or column-major.
        let storage = |rng: &mut Rng, output: bool| {
            let mut order: Vec<usize> = (0..rank - 2).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let matrix = if rng.below(2) == 0 {
                [rank - 2, rank - 1]
            } else {
                [rank - 1, rank - 2]
            };
            // Now and then an input's batch stored between its matrix's two dimensions: its
            // matrices interleave, with a leading dimension wider than a whole matrix.
            if !output && rank > 2 && rng.below(5) == 0 {
                order.insert(0, matrix[0]);
                order.push(matrix[1]);
            } else {
                order.extend(matrix);
            }
            Storage {
                order,
                pitch_padding: rng.below(3),
            }
        };
        let storages = [false, false, true].map(|output| storage(&mut rng, output));
        let perturbed = rng.below(2) == 0;
        check_perturbed(
            &mut rng,
            [&lhs_shape, &rhs_shape, &out_shape],
            storages,
            None,
            perturbed,
        );
    }
}

#[test]
fn layouts_blas_cannot_read_are_refused() {
    let strided =
        |shape: &'static [usize], strides: &'static [usize]| StridedLayout { shape, strides };
    let dense_2x3 = strided(&[2, 3], &[3, 1]);
    let dense_3x4 = strided(&[3, 4], &[4, 1]);
    let dense_2x4 = strided(&[2, 4], &[4, 1]);
    // Every other column of a wider matrix: no unit stride.
    let every_other = strided(&[2, 3], &[6, 2]);
    assert_eq!(
        gemm_calls(every_other, dense_3x4, dense_2x4),
        Err(NoBlasCall::Layout(Operand::Lhs))
    );
    // Rows that overlap (a row stride below the row's length), and a broadcast row.
    let overlapping = strided(&[3, 4], &[2, 1]);
    assert_eq!(
        gemm_calls(dense_2x3, overlapping, dense_2x4),
        Err(NoBlasCall::Layout(Operand::Rhs))
    );
    let broadcast_rows = strided(&[3, 4], &[0, 1]);
    assert_eq!(
        gemm_calls(dense_2x3, broadcast_rows, dense_2x4),
        Err(NoBlasCall::Layout(Operand::Rhs))
    );
    // An output broadcast over its batch, shapes that do not multiply, an empty contraction.
    let out_broadcast = strided(&[2, 2, 4], &[0, 4, 1]);
    let batched = |shape: &'static [usize], strides: &'static [usize]| strided(shape, strides);
    assert_eq!(
        gemm_calls(
            batched(&[2, 2, 3], &[6, 3, 1]),
            batched(&[2, 3, 4], &[12, 4, 1]),
            out_broadcast
        ),
        Err(NoBlasCall::OutputLayout)
    );
    assert!(matches!(
        gemm_calls(dense_2x3, dense_2x4, dense_2x4),
        Err(NoBlasCall::Shapes(_))
    ));
    let empty_k = strided(&[2, 0], &[0, 1]);
    assert_eq!(
        gemm_calls(empty_k, strided(&[0, 4], &[4, 1]), dense_2x4),
        Err(NoBlasCall::EmptyContraction)
    );
    // Sizes beyond BLAS's 32-bit integers.
    let tall = strided(&[1 << 31, 1], &[1, 1]);
    assert_eq!(
        gemm_calls(
            tall,
            strided(&[1, 1], &[1, 1]),
            strided(&[1 << 31, 1], &[1, 1])
        ),
        Err(NoBlasCall::TooLarge)
    );
}
