//! A source's write's checks (`ops::routing::write`), generic over the backend: a source's mean
//! square and its backward pass, RMS matching's multiplier, eq:update's signed sum with the mean
//! square a cube backend forms in the same launch, and a HAARES pair's whole write (both sums,
//! their mean squares, the multiplier), against f64 host values on strided inputs.
//! `portability.rs` runs them on NdArray f32, Flex and the cube backends' kernels;
//! `core/source_write.rs` checks the signed sum's loop and node in f64 too.

use burn::tensor::Tensor;
use haares_core::HaaresBackend;
use haares_core::ops::SourceWriteBackend;

use super::common::{Rng, assert_close_at_scale, random_matrix, random_slot_views, tensor_values};
use super::slot_sums_checks::host_add_scaled;

/// (tokens, d): a single number, a width that does not divide a cube, a wide one.
const SHAPES: [(usize, usize); 3] = [(1, 1), (37, 70), (130, 256)];

/// The kernels round each element as the tensor operations do (one product, one addition, one
/// reduction); this leaves room only for the reduction's order.
const TOLERANCE: f64 = 1e-5;

pub fn mean_squares_and_their_gradients_match<B: HaaresBackend>() {
    let mut rng = Rng::new(2026);
    for (tokens, d) in SHAPES {
        // Contiguous, transposed and narrowed rows.
        for rows in random_slot_views::<B>(&mut rng, 3, tokens, d) {
            let values = tensor_values(rows.clone());
            let expected: Vec<f64> = values
                .chunks(d)
                .map(|row| row.iter().map(|x| x * x).sum::<f64>() / d as f64)
                .collect();
            let mean_square = B::row_mean_square(rows.clone());
            assert_eq!(mean_square.dims(), [tokens, 1], "mean square shape");
            let what = format!("row_mean_square, {tokens} × {d}");
            assert_close_at_scale(&tensor_values(mean_square), &expected, TOLERANCE, &what);

            let grad: Tensor<B, 2> = random_matrix(&mut rng, [tokens, 1]);
            let into: Tensor<B, 2> = random_matrix(&mut rng, [tokens, d]);
            let (grad_values, into_values) =
                (tensor_values(grad.clone()), tensor_values(into.clone()));
            for accumulated in [false, true] {
                let expected = host_add_scaled(
                    accumulated.then_some(into_values.as_slice()),
                    &grad_values,
                    &values,
                    d,
                    2.0 / d as f64,
                );
                let actual = B::row_mean_square_backward(
                    accumulated.then(|| into.clone()),
                    grad.clone(),
                    rows.clone(),
                );
                let what = format!("row_mean_square_backward, {tokens} × {d}, into {accumulated}");
                assert_eq!(actual.dims(), [tokens, d], "{what}: shape");
                assert_close_at_scale(&tensor_values(actual), &expected, TOLERANCE, &what);
            }
            // The accumulated gradient is read, never written.
            assert_eq!(tensor_values(into), into_values, "into changed in place");
        }
    }
}

/// eq:rmsmatch's multiplier and the matched mean square `m_D · a²` against f64, for ratios
/// inside and on both sides of the clip, and the degenerate cases the formula defines: `C = 0`
/// gives `1/γ`, `D = 0` gives `γ` (unless `C = 0` too). On the autodiff backend the gradient of
/// `Σ g ⊙ m_D a²` reaches `m_D` as `g a²`, and none reaches `m_C` (the stop-gradient).
pub fn rms_match_multipliers_match<B: HaaresBackend>() {
    type Tracked<B> = burn::backend::Autodiff<B>;
    let (gamma, epsilon) = (4.0, 1e-6);
    let mut rng = Rng::new(2028);
    let tokens = 300;
    // Mean squares spread over eight decades, so that ratios fall below, inside and above the clip.
    let spread = |rng: &mut Rng| -> Vec<f64> {
        rng.normals(tokens, 4.0)
            .into_iter()
            .map(|x| 10f64.powf(x.clamp(-8.0, 8.0) / 2.0))
            .collect()
    };
    let mut cumulative = spread(&mut rng);
    let mut detail = spread(&mut rng);
    (cumulative[0], detail[1], cumulative[2], detail[2]) = (0.0, 0.0, 0.0, 0.0);
    let column = |values: &[f64]| -> Tensor<Tracked<B>, 2> {
        let values: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        Tensor::from_data(
            burn::tensor::TensorData::new(values, [tokens, 1]),
            &Default::default(),
        )
    };
    let (cumulative_in, detail_in) = (
        column(&cumulative).require_grad(),
        column(&detail).require_grad(),
    );
    let (multiplier, matched) = Tracked::<B>::rms_match_multiplier(
        cumulative_in.clone(),
        detail_in.clone(),
        gamma,
        epsilon,
    );
    assert_eq!(multiplier.dims(), [tokens, 1], "multiplier shape");
    // From the f32 inputs the backend saw.
    let (cumulative, detail) = (
        tensor_values(column(&cumulative)),
        tensor_values(column(&detail)),
    );
    let expected: Vec<f64> = cumulative
        .iter()
        .zip(&detail)
        .map(|(c, d)| (c.sqrt() / (d.sqrt() + epsilon)).clamp(1.0 / gamma, gamma))
        .collect();
    let inside = expected
        .iter()
        .filter(|a| **a > 1.0 / gamma && **a < gamma)
        .count();
    let clipped = tokens - inside;
    assert!(
        inside > 20 && clipped > 20,
        "the inputs cover the clip: {inside} inside, {clipped} on it"
    );
    assert_eq!(
        (expected[0], expected[1], expected[2]),
        (1.0 / gamma, gamma, 1.0 / gamma)
    );
    let squares: Vec<f64> = expected.iter().map(|a| a * a).collect();
    let matched_expected: Vec<f64> = detail.iter().zip(&squares).map(|(m, a2)| m * a2).collect();
    assert_close_at_scale(
        &tensor_values(multiplier.clone()),
        &expected,
        TOLERANCE,
        "rms_match multiplier",
    );
    assert_close_at_scale(
        &tensor_values(matched.clone()),
        &matched_expected,
        TOLERANCE,
        "the matched mean square",
    );
    let g: Tensor<B, 2> = random_matrix(&mut rng, [tokens, 1]);
    let g_values = tensor_values(g.clone());
    let loss = (matched * Tensor::from_inner(g)).sum() + multiplier.sum();
    let grads = loss.backward();
    let of_detail = detail_in.grad(&grads).expect("m_D takes a gradient");
    let expected: Vec<f64> = g_values
        .iter()
        .zip(&squares)
        .map(|(g, a2)| g * a2)
        .collect();
    assert_close_at_scale(&tensor_values(of_detail), &expected, TOLERANCE, "∂m_D");
    assert!(
        cumulative_in.grad(&grads).is_none(),
        "m_C took a gradient through the stop-gradient"
    );
}

/// eq:update's signed sum with its mean square (`SourceWriteBackend::signed_sum_with_mean_square`),
/// on `[1, tokens, d]` views of every layout, for the signs ±1 and a general one: the sum against
/// f64, the mean square where the backend forms one (`forms_mean_square`; `None` where it does
/// not), and on the autodiff backend the gradients of `Σ out ⊙ r + Σ m ⊙ g` reaching both inputs
/// through the sum's node and the mean square's: `∂sum = r + (2/d) g ⊙ out`, `∂term = sign · ∂sum`.
pub fn signed_sums_with_mean_squares_match<B: HaaresBackend>(forms_mean_square: bool) {
    type Tracked<B> = burn::backend::Autodiff<B>;
    let mut rng = Rng::new(2029);
    for (tokens, d) in SHAPES {
        let views = random_slot_views::<B>(&mut rng, 3, tokens, d);
        let terms = random_slot_views::<B>(&mut rng, 3, tokens, d);
        for ((sum, term), sign) in views.into_iter().zip(terms).zip([1.0, -1.0, 0.5]) {
            let what = format!("signed sum, {tokens} × {d}, sign {sign}");
            let (sums, terms) = (tensor_values(sum.clone()), tensor_values(term.clone()));
            let out: Vec<f64> = sums.iter().zip(&terms).map(|(s, t)| s + sign * t).collect();
            let mean_squares: Vec<f64> = out
                .chunks(d)
                .map(|row| row.iter().map(|x| x * x).sum::<f64>() / d as f64)
                .collect();
            let r: Tensor<B, 3> = random_matrix(&mut rng, [tokens, d]).unsqueeze();
            let g: Tensor<B, 3> = random_matrix(&mut rng, [tokens, 1]).unsqueeze();
            let (r_values, g_values) = (tensor_values(r.clone()), tensor_values(g.clone()));

            let tracked = |x: Tensor<B, 2>| Tensor::<Tracked<B>, 3>::from_inner(x.unsqueeze());
            let (sum, term) = (tracked(sum).require_grad(), tracked(term).require_grad());
            let (output, mean_square) =
                Tracked::<B>::signed_sum_with_mean_square(sum.clone(), term.clone(), sign);
            assert_eq!(output.dims(), [1, tokens, d], "{what}: shape");
            assert_close_at_scale(&tensor_values(output.clone()), &out, TOLERANCE, &what);
            assert_eq!(
                mean_square.is_some(),
                forms_mean_square,
                "{what}: a mean square formed against the backend's kind"
            );
            let mut loss = (output * Tensor::from_inner(r)).sum();
            let mut mean_square_grads = vec![0.0; tokens];
            if let Some(mean_square) = mean_square {
                assert_eq!(
                    mean_square.dims(),
                    [1, tokens, 1],
                    "{what}: mean square shape"
                );
                let values = tensor_values(mean_square.clone());
                assert_close_at_scale(&values, &mean_squares, TOLERANCE, &format!("{what}: m"));
                loss = loss + (mean_square * Tensor::from_inner(g)).sum();
                mean_square_grads = g_values;
            }
            let grads = loss.backward();
            let expected: Vec<f64> = (0..tokens * d)
                .map(|i| r_values[i] + 2.0 / d as f64 * mean_square_grads[i / d] * out[i])
                .collect();
            let of_term: Vec<f64> = expected.iter().map(|x| sign * x).collect();
            for (input, expected, name) in [(sum, expected, "∂sum"), (term, of_term, "∂term")] {
                let grad = input.grad(&grads).expect("a tracked input's gradient");
                let what = format!("{what}: {name}");
                assert_close_at_scale(&tensor_values(grad), &expected, TOLERANCE, &what);
            }
        }
    }
}

/// A HAARES pair's write (`SourceWriteBackend::pair_write`) against f64, on `[1, tokens, d]` views
/// of every layout: with a detail of its own for the signs ±1, and with the detail still the
/// cumulative sum. The sums, their mean squares, eq:rmsmatch's multiplier and the matched mean
/// square `m_D a²`; on the autodiff backend the gradients of
/// `Σ C'⊙r + Σ D'⊙q + Σ m_C g + Σ m_D h + Σ m_D a² · f + Σ a` reaching `C`, `D` and `u`:
/// `∂C' = r + (2/d)(g [+ (h + f a²)]) C'`, `∂D' = q + (2/d)(h + f a²) D'` (the bracket where the
/// detail is the cumulative sum), `∂u = ∂C' + s ∂D'`, and nothing through the multiplier.
pub fn pair_writes_match<B: HaaresBackend>() {
    use haares_core::ops::RmsMatching;
    type Tracked<B> = burn::backend::Autodiff<B>;
    let matching = RmsMatching {
        gamma: 1.5,
        epsilon: 1e-6,
    };
    let mut rng = Rng::new(2030);
    for (tokens, d) in SHAPES {
        let inputs = random_slot_views::<B>(&mut rng, 3, tokens, d);
        let terms = random_slot_views::<B>(&mut rng, 3, tokens, d);
        let details = random_slot_views::<B>(&mut rng, 3, tokens, d);
        let cases = inputs.into_iter().zip(terms).zip(details);
        for (((cumulative, term), detail), (sign, own)) in
            cases.zip([(1.0, true), (-1.0, true), (1.0, false)])
        {
            let what = format!("pair write, {tokens} × {d}, sign {sign}, own detail {own}");
            let [c, u, dv] = [&cumulative, &term, &detail].map(|x| tensor_values(x.clone()));
            let mean_squares = |rows: &[f64]| -> Vec<f64> {
                let squares = |row: &[f64]| row.iter().map(|x| x * x).sum::<f64>() / d as f64;
                rows.chunks(d).map(squares).collect()
            };
            let c_out: Vec<f64> = c.iter().zip(&u).map(|(c, u)| c + u).collect();
            let d_out: Vec<f64> = match own {
                true => dv.iter().zip(&u).map(|(x, u)| x + sign * u).collect(),
                false => c_out.clone(),
            };
            let (m_c, m_d) = (mean_squares(&c_out), mean_squares(&d_out));
            let a: Vec<f64> = m_c
                .iter()
                .zip(&m_d)
                .map(|(c, x)| (c.sqrt() / (x.sqrt() + matching.epsilon)).clamp(1.0 / 1.5, 1.5))
                .collect();
            let squares: Vec<f64> = a.iter().map(|a| a * a).collect();
            let matched: Vec<f64> = m_d.iter().zip(&squares).map(|(m, s)| m * s).collect();
            assert!(
                a.iter().any(|a| (a - 1.0).abs() > 1e-3) || !own,
                "{what}: the inputs give multipliers other than 1"
            );

            let tracked = |x: Tensor<B, 2>| Tensor::<Tracked<B>, 3>::from_inner(x.unsqueeze());
            let [cumulative, detail, term] =
                [cumulative, detail, term].map(|x| tracked(x).require_grad());
            let write = Tracked::<B>::pair_write(
                cumulative.clone(),
                own.then(|| detail.clone()),
                term.clone(),
                sign,
                matching,
            );
            let check = |tensor: Tensor<Tracked<B>, 3>, expected: &[f64], name: &str| {
                let what = format!("{what}: {name}");
                assert_close_at_scale(&tensor_values(tensor), expected, TOLERANCE, &what);
            };
            check(write.cumulative.clone(), &c_out, "C'");
            check(write.cumulative_mean_square.clone(), &m_c, "m_C");
            check(write.multiplier.clone(), &a, "a");
            check(write.matched_mean_square.clone(), &matched, "m_D a²");
            assert_eq!(write.detail.is_some(), own, "{what}: a detail of its own");
            assert_eq!(write.multiplier.dims(), [1, tokens, 1], "{what}: a's shape");

            let weights = |rng: &mut Rng, width: usize| random_matrix::<B>(rng, [tokens, width]);
            let [r, q] = [d, d].map(|width| weights(&mut rng, width));
            let [g, h, f] = [1, 1, 1].map(|width| weights(&mut rng, width));
            let [r_v, q_v, g_v, h_v, f_v] = [&r, &q, &g, &h, &f].map(|x| tensor_values(x.clone()));
            let weighted = |x: Tensor<Tracked<B>, 3>, w: Tensor<B, 2>| {
                (x * Tensor::from_inner(w.unsqueeze())).sum()
            };
            let mut loss = weighted(write.cumulative, r)
                + weighted(write.cumulative_mean_square, g)
                + weighted(write.matched_mean_square, f)
                + write.multiplier.sum();
            if let Some((value, mean_square)) = write.detail {
                check(value.clone(), &d_out, "D'");
                check(mean_square.clone(), &m_d, "m_D");
                loss = loss + weighted(value, q) + weighted(mean_square, h);
            }
            let grads = loss.backward();
            // The detail's mean-square gradient, per token, and what it gives each row.
            let detail_column: Vec<f64> = (0..tokens)
                .map(|n| own as u8 as f64 * h_v[n] + f_v[n] * squares[n])
                .collect();
            let of_c: Vec<f64> = (0..tokens * d)
                .map(|i| {
                    let n = i / d;
                    let column = g_v[n] + if own { 0.0 } else { detail_column[n] };
                    r_v[i] + 2.0 / d as f64 * column * c_out[i]
                })
                .collect();
            let of_d: Vec<f64> = (0..tokens * d)
                .map(|i| q_v[i] + 2.0 / d as f64 * detail_column[i / d] * d_out[i])
                .collect();
            let of_u: Vec<f64> = match own {
                true => of_c.iter().zip(&of_d).map(|(c, x)| c + sign * x).collect(),
                false => of_c.clone(),
            };
            let gradient = |input: &Tensor<Tracked<B>, 3>, expected: &[f64], name: &str| {
                let grad = input.grad(&grads).expect("a tracked input's gradient");
                check(Tensor::from_inner(grad), expected, name);
            };
            gradient(&cumulative, &of_c, "∂C");
            gradient(&term, &of_u, "∂u");
            match own {
                true => gradient(&detail, &of_d, "∂D"),
                false => assert!(detail.grad(&grads).is_none(), "{what}: ∂D without a detail"),
            }
        }
    }
}
