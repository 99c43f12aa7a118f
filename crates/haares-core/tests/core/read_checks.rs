//! The read's checks (`ops::routing::read`), generic over the backend: the backend's whole read,
//! forward and backward, against the reference (the composition of the scores, Burn's softmax
//! and the mixture), with and without a bias and a norm, on fresh random slots; and the whole
//! operator through a router on the autodiff backend against the reference read, gradients
//! included. `portability.rs` runs them on NdArray f32, Flex and the cube backends' kernels;
//! `core/read.rs` checks Flex's loops in f64 too.

use burn::module::Param;
use burn::tensor::Tensor;
use haares_core::router::DepthRouterConfig;
use haares_core::{DetailBias, HaaresBackend, SourceBank};

use super::common::{Rng, max_abs_diff, random_on, tensor_values};
use super::slot_sums_checks::SHAPES;

/// Each combination of a bias and a norm on a read.
const BIAS_AND_NORM: [(bool, bool); 4] =
    [(false, false), (true, false), (false, true), (true, true)];

/// A read's forward pass on the device (one kernel where the slots fit one launch, the
/// composition beyond) against the composition on the CPU (NdArray's host loops, f32): the
/// mixture, the weights, the scores and the normalised mixture, with and without a bias and a
/// norm, slots with and without an RMS scale, one slot to more than a launch takes.
pub fn read_forward_matches_the_composition<B: HaaresBackend>() {
    type Cpu = burn::backend::NdArray<f32>;
    let mut rng = Rng::new(2027);
    for count in [1, 3, 16, 17] {
        for (tokens, d) in SHAPES {
            for (biased, normed) in BIAS_AND_NORM {
                let seed = rng.next_u64();
                let device = read_forward_of::<B>(seed, count, tokens, d, biased, normed);
                let host = read_forward_of::<Cpu>(seed, count, tokens, d, biased, normed);
                assert_eq!(
                    (device.normed.is_some(), host.normed.is_some()),
                    (normed, normed),
                    "read forward, S = {count}: a normalised mixture answered against the norm"
                );
                for (name, actual, expected) in [
                    ("mixture", Some(device.mixture), Some(host.mixture)),
                    ("weights", Some(device.weights), Some(host.weights)),
                    ("scores", Some(device.scores), Some(host.scores)),
                    ("normed mixture", device.normed, host.normed),
                ] {
                    let (Some(actual), Some(expected)) = (actual, expected) else {
                        continue;
                    };
                    let expected = tensor_values(expected);
                    let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    let diff = max_abs_diff(&tensor_values(actual), &expected);
                    assert!(
                        diff < 1e-5 * scale,
                        "read forward, S = {count}, {tokens} × {d}, bias {biased}, norm \
                         {normed}: {name} differs from the composition by {diff:e} (scale \
                         {scale:.2})"
                    );
                }
            }
        }
    }
}

/// `RoutingBackend::routing_read_forward` on `B` of inputs drawn from `seed`: the slots of
/// [`random_slots`], a query and key weight, a bias, a norm.
fn read_forward_of<B: HaaresBackend>(
    seed: u64,
    count: usize,
    tokens: usize,
    d: usize,
    biased: bool,
    normed: bool,
) -> haares_core::ops::routing::read::ReadForward<B> {
    let mut rng = Rng::new(seed);
    let slots = random_slots::<B>(&mut rng, count, tokens, d);
    let query = random_query::<B>(&mut rng, d);
    let bias = haares_core::ops::routing::read::ReadBias {
        value: random_on::<B, 1>(&mut rng, [1], 1.0),
        slots: biased_slots(count),
    };
    let norm = random_norm::<B>(&mut rng, d);
    B::routing_read_forward(
        &slots,
        &query,
        biased.then_some(&bias),
        1e-6,
        normed.then_some(&norm),
    )
}

/// An RMSNorm's gain around 1 and the paper's ε.
fn random_norm<B: HaaresBackend>(
    rng: &mut Rng,
    d: usize,
) -> haares_core::ops::routing::read::ReadNorm<B> {
    haares_core::ops::routing::read::ReadNorm {
        gain: random_on::<B, 1>(rng, [d], 0.3).add_scalar(1.0),
        epsilon: 1e-6,
    }
}

/// Which slots take the bias: every slot but each third from the second (the first always does).
fn biased_slots(count: usize) -> Vec<bool> {
    (0..count).map(|slot| slot % 3 != 1).collect()
}

/// A read's backward pass on the device (one kernel and the query's, key weight's, bias's and
/// gain's gradients in one more where the slots fit one launch, the composition beyond) against
/// the composition on the CPU: every wanted slot's gradient (added to an accumulated one for some
/// slots, none for others; two slots with the same rows from four slots on), every wanted mean
/// square's, the query's, the key weight's, the bias's and the norm's gain's, with and without a
/// gradient reaching the weights (with one, the mean squares' gradients are folded into the
/// rows', `fold_mean_squares`) and a norm, to within `relative` of each gradient's largest value.
/// Five slots fit one launch on lavapipe too.
pub fn read_backward_matches_the_composition<B: HaaresBackend>(relative: f64) {
    type Cpu = burn::backend::NdArray<f32>;
    let mut rng = Rng::new(2028);
    for count in [1, 3, 5, 16, 17] {
        for (tokens, d) in SHAPES {
            for (weights_reach_the_loss, normed) in BIAS_AND_NORM {
                let seed = rng.next_u64();
                // A norm over one channel is `sign(h̃)·g`: its gradient is of the size of ε and
                // would compare the two backends' rounding of `h̃`, not their read.
                if normed && d == 1 {
                    continue;
                }
                let case = (count, tokens, d, weights_reach_the_loss, normed);
                let device = read_backward_of::<B>(seed, case);
                let host = read_backward_of::<Cpu>(seed, case);
                assert_eq!(device.len(), host.len());
                for (index, (actual, expected)) in device.iter().zip(&host).enumerate() {
                    let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    let diff = max_abs_diff(actual, expected);
                    assert!(
                        diff < relative * scale,
                        "read backward, S = {count}, {tokens} × {d}, ∂α {weights_reach_the_loss}, \
                         norm {normed}: entry {index} (wanted slots, wanted mean squares, query, \
                         key weight, bias, gain) differs from the composition by {diff:e} \
                         (scale {scale:.2})"
                    );
                }
            }
        }
    }
}

/// `RoutingBackend::routing_read_backward` on `B` of inputs drawn from `seed`, its gradients
/// as host vectors: the wanted slots' (every slot but slot 1; even slots add to an accumulated
/// gradient), the wanted mean squares' (every one but the last), the query's, the key weight's,
/// the bias's, and with a norm the gain's.
fn read_backward_of<B: HaaresBackend>(
    seed: u64,
    (count, tokens, d, weights_reach_the_loss, normed): (usize, usize, usize, bool, bool),
) -> Vec<Vec<f64>> {
    let mut rng = Rng::new(seed);
    let mut slots = random_slots::<B>(&mut rng, count, tokens, d);
    // From four slots on, slot 3 reads slot 2's rows with a scale of its own, as HAARES's
    // early-half detail reads its cumulative sum: a backend may give their gradient in slot 2's
    // entry alone.
    let mut same_rows: Vec<usize> = (0..count).collect();
    if count >= 4 {
        slots[3].raw = slots[2].raw.clone();
        same_rows[3] = 2;
    }
    let query = random_query::<B>(&mut rng, d);
    let scores = random_on::<B, 2>(&mut rng, [count, tokens], 2.0);
    let weights =
        burn::tensor::activation::softmax(random_on::<B, 2>(&mut rng, [count, tokens], 2.0), 0);
    let mixture_grad = random_on::<B, 2>(&mut rng, [tokens, d], 1.0);
    let weights_grad = random_on::<B, 2>(&mut rng, [count, tokens], 1.0);
    let into = (0..count)
        .map(|slot| {
            let earlier = random_on::<B, 2>(&mut rng, [tokens, d], 1.0);
            (slot % 2 == 0).then_some(earlier)
        })
        .collect();
    let wanted: Vec<bool> = (0..count).map(|slot| slot != 1).collect();
    let mean_squares_wanted: Vec<bool> = (0..count).map(|slot| slot + 1 != count).collect();
    // Every other slot count forms `∂b`; `None` where it is not wanted. Where the weights reach
    // the loss, the mean squares' gradients are folded into the rows'.
    let bias_wanted = count % 2 == 1;
    let fold_mean_squares = weights_reach_the_loss;
    // The read's own mixture: a backend may form it again from the slots and weights.
    let norm = normed.then(|| haares_core::ops::routing::read::NormBackward {
        norm: random_norm::<B>(&mut rng, d),
        mixture: B::routing_mixture(&slots, weights.clone()),
    });
    let read = haares_core::ops::routing::read::ReadBackward {
        slots,
        query,
        epsilon: 1e-6,
        scores,
        weights,
        mixture_grad,
        weights_grad: weights_reach_the_loss.then_some(weights_grad),
        bias_wanted,
        biased_slots: biased_slots(count),
        fold_mean_squares,
        same_rows: same_rows.clone(),
        norm,
    };
    let grads = B::routing_read_backward(read, into, &wanted, &mean_squares_wanted);
    assert_eq!(
        grads.bias.is_some(),
        bias_wanted,
        "∂b answered against `bias_wanted` (S = {count})"
    );
    assert_eq!(
        grads.gain.is_some(),
        normed,
        "∂g answered against the norm (S = {count})"
    );
    assert!(
        !fold_mean_squares || grads.mean_squares.iter().all(Option::is_none),
        "a folded read returned a mean-square gradient (S = {count})"
    );
    // Shared rows' gradients as one entry, the first slot's, whichever way the backend gave them.
    let mut raws = grads.raws;
    for (slot, &first) in same_rows
        .iter()
        .enumerate()
        .filter(|(slot, first)| *first < slot)
    {
        if let Some(later) = raws[slot].take() {
            raws[first] = Some(
                raws[first]
                    .take()
                    .map_or(later.clone(), |grad| grad + later),
            );
        }
    }
    let mut all: Vec<Vec<f64>> = raws.into_iter().flatten().map(tensor_values).collect();
    all.extend(grads.mean_squares.into_iter().flatten().map(tensor_values));
    all.push(tensor_values(grads.query.query));
    all.push(tensor_values(grads.query.key_weight));
    all.extend(grads.bias.map(tensor_values));
    all.extend(grads.gain.map(tensor_values));
    all
}

/// A router's query and a key weight around 1 (where a key norm's weight starts).
fn random_query<B: HaaresBackend>(
    rng: &mut Rng,
    d: usize,
) -> haares_core::ops::routing::read::ReadQuery<B> {
    haares_core::ops::routing::read::ReadQuery {
        query: random_on::<B, 1>(rng, [d], 0.5),
        key_weight: random_on::<B, 1>(rng, [d], 0.3).add_scalar(1.0),
    }
}

/// `count` slots of `[tokens, d]` rows of different sizes, an RMS scale on every other one, and
/// positive mean squares.
fn random_slots<B: HaaresBackend>(
    rng: &mut Rng,
    count: usize,
    tokens: usize,
    d: usize,
) -> Vec<haares_core::SlotRows<B>> {
    (0..count)
        .map(|slot| {
            let std = 0.1 + 2.0 * rng.uniform();
            let raw = random_on::<B, 2>(rng, [tokens, d], std);
            let positive = |rng: &mut Rng| random_on::<B, 2>(rng, [tokens, 1], 1.0).abs() + 0.1;
            let scale = positive(rng);
            let mean_square = positive(rng);
            haares_core::SlotRows {
                raw,
                scale: (slot % 2 == 1).then_some(scale),
                mean_square,
            }
        })
        .collect()
}

/// The whole routing operator on the kernels, forward and backward: a fused read on the autodiff
/// backend `Ad` against the reference read on the CPU (NdArray, f32), in its mixture, its weights
/// and every gradient (each slot, the query, the key-norm weight, the detail bias), for one slot, a
/// HAARES bank and the largest bank (97 slots: several kernel launches and autodiff nodes); the two
/// banks also with the mixture normalised in the read (against the reference read, then the norm),
/// with the norm gain's gradient. The reference runs on the CPU because on CUDA its matrix products
/// (a row shared by all tokens, and their gradients) most likely round their inputs to TF32: on an
/// H200 the two reads' query gradients differed by 1.3e-4 of their scale, the rest agreeing to
/// 1e-4. The kernels run no matrix product, so they must agree with a CPU's f32 sums.
pub fn operator_matches_the_reference_read<
    Ad: HaaresBackend + burn::tensor::backend::AutodiffBackend,
>() {
    type Cpu = burn::backend::Autodiff<burn::backend::NdArray<f32>>;
    let mut rng = Rng::new(2026);
    for (pairs, normed) in [(0, false), (4, false), (4, true), (48, false), (48, true)] {
        let seed = rng.next_u64();
        let reference = read_everything::<Cpu>(seed, pairs, false, normed);
        let fused = read_everything::<Ad>(seed, pairs, true, normed);
        if pairs == 0 {
            // One slot: weight 1 everywhere, and the mixture is the slot itself, on both paths of
            // the device.
            let on_device = read_everything::<Ad>(seed, pairs, false, normed);
            for (path, read) in [("reference", &on_device), ("fused", &fused)] {
                let slot = &read[read.len() - 1];
                let mixture_error = max_abs_diff(&read[0], slot);
                let weight_error = read[1].iter().fold(0.0f64, |m, w| m.max((w - 1.0).abs()));
                assert!(
                    mixture_error < 1e-5 && weight_error < 1e-6,
                    "S = 1, {path} read: mixture off by {mixture_error:e}, weights off 1 by \
                     {weight_error:e}"
                );
            }
        }
        assert_eq!(reference.len(), fused.len());
        for (index, (expected, actual)) in reference.iter().zip(&fused).enumerate() {
            let scale = expected.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let diff = max_abs_diff(expected, actual);
            assert!(
                diff < 1e-4 * scale,
                "S = {}, norm {normed}: entry {index} (mixture, weights, slots…, query, key \
                 norm, bias, gain, slot 0) differs by {diff:e} (scale {scale:.2})",
                2 * pairs + 1
            );
        }
    }
}

/// One read of `2 · pairs + 1` slots on backend `B` from the inputs `seed` draws (the same on
/// every backend), and a loss that weighs its mixture and weights at random: the mixture, the
/// weights, every slot's gradient, the query's, the key norm's, the detail bias's (with pairs),
/// the norm gain's (`normed`: the mixture is the read's output through an RMSNorm), then slot 0's
/// values.
fn read_everything<B: HaaresBackend + burn::tensor::backend::AutodiffBackend>(
    seed: u64,
    pairs: usize,
    fused: bool,
    normed: bool,
) -> Vec<Vec<f64>> {
    let mut rng = Rng::new(seed);
    let (batch, seq, d) = (2, 5, 24);
    let mut router = DepthRouterConfig::new(d)
        .with_detail_bias(Some(DetailBias::Learned { init: -2.0 }))
        .init::<B>(&Default::default());
    router.query = Param::from_tensor(random_on(&mut rng, [d], 0.8).require_grad());
    router.key_norm.weight =
        Param::from_tensor((random_on::<B, 1>(&mut rng, [d], 0.3) + 1.0).require_grad());
    let values: Vec<Tensor<B, 3>> = (0..=2 * pairs)
        .map(|_| {
            let std = 0.05 + 3.0 * rng.uniform();
            random_on(&mut rng, [batch, seq, d], std).require_grad()
        })
        .collect();
    let mut bank = SourceBank::new(values[0].clone());
    for pair in values[1..].chunks(2) {
        bank.push_pair(pair[0].clone(), Some(pair[1].clone()));
    }
    let mut norm = haares_core::norm::RmsNormConfig::new(d).init::<B>(&Default::default());
    norm.weight = Param::from_tensor((random_on::<B, 1>(&mut rng, [d], 0.3) + 1.0).require_grad());
    let mut read = match (fused, normed) {
        (true, true) => router.forward_fused_normed(&bank, &norm),
        (true, false) => router.forward_fused(&bank),
        (false, _) => router.forward(&bank),
    };
    if normed && !fused {
        read.mixture = norm.forward(read.mixture);
    }
    let mixture_weights = random_on::<B, 3>(&mut rng, read.mixture.dims(), 1.0);
    let weight_weights = random_on::<B, 3>(&mut rng, read.weights.dims(), 1.0);
    let grads = ((read.mixture.clone() * mixture_weights).sum()
        + (read.weights.clone() * weight_weights).sum())
    .backward();
    let mut all = vec![tensor_values(read.mixture), tensor_values(read.weights)];
    all.extend(
        values
            .iter()
            .map(|v| tensor_values(v.grad(&grads).unwrap())),
    );
    all.push(tensor_values(router.query.val().grad(&grads).unwrap()));
    all.push(tensor_values(
        router.key_norm.weight.val().grad(&grads).unwrap(),
    ));
    if pairs > 0 {
        let bias = router.detail_bias.as_ref().unwrap().val();
        all.push(tensor_values(bias.grad(&grads).unwrap()));
    }
    if normed {
        all.push(tensor_values(norm.weight.val().grad(&grads).unwrap()));
    }
    all.push(tensor_values(values[0].clone()));
    all
}
