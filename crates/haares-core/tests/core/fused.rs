//! The fused routing path against the reference path (FLA-style naive-vs-fused agreement): the
//! router's read and every gradient on fresh random banks of several shapes — one slot, mixed
//! kinds, the largest bank — with sources handed over plain, with cached mean squares and as
//! scaled details, and whole models of every method, in f64 where both paths must agree to
//! rounding.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use haares_core::router::{DepthRouter, DepthRouterConfig, RouterOutput};
use haares_core::{DetailBias, RoutingPath, SlotKind, Source, SourceBank, TrainingBackend};

use crate::common::*;

const TOLERANCE: f64 = 1e-10;

/// One random case: `kinds` after the embedding, each slot given its cached mean square or not.
struct BankCase {
    batch: usize,
    seq: usize,
    d: usize,
    kinds: Vec<SlotKind>,
    bias: Option<DetailBias>,
    seed: u64,
}

fn random_tensor<const D: usize>(rng: &mut Rng, shape: [usize; D], std: f64) -> Tensor<Ad64, D> {
    let n = shape.iter().product();
    Tensor::from_data(
        TensorData::new(rng.normals(n, std), shape),
        &Default::default(),
    )
}

fn random_router(case: &BankCase, rng: &mut Rng) -> DepthRouter<Ad64> {
    let mut router = DepthRouterConfig::new(case.d)
        .with_detail_bias(case.bias)
        .init::<Ad64>(&Default::default());
    router.query = Param::from_tensor(random_tensor(rng, [case.d], 0.8).require_grad());
    router.key_norm.weight =
        Param::from_tensor((random_tensor(rng, [case.d], 0.3) + 1.0).require_grad());
    if router.detail_bias.is_some() {
        router.detail_bias = Some(Param::from_tensor(
            random_tensor(rng, [1], 0.5).sub_scalar(1.0).require_grad(),
        ));
    }
    router
}

/// Slot values with widely different scales (the key norm must undo them), tracked for gradients.
fn random_values(case: &BankCase, rng: &mut Rng) -> Vec<Tensor<Ad64, 3>> {
    (0..=case.kinds.len())
        .map(|_| {
            let scale = 0.05 + 3.0 * rng.uniform();
            random_tensor(rng, [case.batch, case.seq, case.d], scale).require_grad()
        })
        .collect()
}

/// How the bank hands each slot to the router.
#[derive(Debug, Clone, Copy)]
enum Handover {
    /// The value itself; the router computes its mean square.
    Plain,
    /// The value with its mean square computed beforehand.
    Cached,
    /// Every detail slot as `a ⊙ raw` with a fixed per-token `a` and `raw = value / a`, as RMS
    /// matching hands `D̂` over (built as `√a ⊙ (√a ⊙ raw)`).
    ScaledDetails,
}

/// A fixed per-token scale in [1/4, 4], like RMS matching's clipped multiplier.
fn detail_scale(value: &Tensor<Ad64, 3>) -> Tensor<Ad64, 3> {
    let [batch, seq, _] = value.dims();
    let mut rng = Rng::new(batch as u64 * 31 + seq as u64);
    let scales: Vec<f64> = (0..batch * seq)
        .map(|_| 4f64.powf(2.0 * rng.uniform() - 1.0))
        .collect();
    Tensor::from_data(
        TensorData::new(scales, [batch, seq, 1]),
        &Default::default(),
    )
}

fn bank(values: &[Tensor<Ad64, 3>], kinds: &[SlotKind], handover: Handover) -> SourceBank<Ad64> {
    let source = |value: &Tensor<Ad64, 3>, kind: SlotKind| match (handover, kind) {
        (Handover::Plain, _) => Source::plain(value.clone()),
        (Handover::ScaledDetails, SlotKind::Detail) => {
            let scale = detail_scale(value);
            let raw = value.clone() / scale.clone();
            // In two steps, `√a` twice: a scaled source rescaled again must compose the factors.
            let half = scale.sqrt();
            let halfway = haares_core::source_bank::mean_square(raw.clone() * half.clone());
            let mean_square = haares_core::source_bank::mean_square(value.clone());
            Source::scaled(raw, half.clone(), halfway).rescaled(half, mean_square)
        }
        (Handover::Cached | Handover::ScaledDetails, _) => Source::with_mean_square(value.clone()),
    };
    let mut bank = SourceBank::from_embedding(source(&values[0], SlotKind::Embedding));
    for (kind, value) in kinds.iter().zip(&values[1..]) {
        bank.push_source(*kind, source(value, *kind));
    }
    bank
}

/// Which of a read's outputs reach the loss. The fused read is one graph node per output, and
/// the weights' node must start the read's backward pass when the mixture has no gradient.
#[derive(Debug, Clone, Copy)]
enum Reach {
    Both,
    MixtureOnly,
    WeightsOnly,
}

/// A scalar loss that weighs every output element differently, so every gradient is exercised.
fn loss(read: &RouterOutput<Ad64>, rng: &mut Rng) -> Tensor<Ad64, 1> {
    loss_through(read, rng, Reach::Both)
}

fn loss_through(read: &RouterOutput<Ad64>, rng: &mut Rng, reach: Reach) -> Tensor<Ad64, 1> {
    let mixture_weights = random_tensor(rng, read.mixture.dims(), 1.0);
    let weight_weights = random_tensor(rng, read.weights.dims(), 1.0);
    let mixture = (read.mixture.clone() * mixture_weights).sum();
    let weights = (read.weights.clone() * weight_weights).sum();
    match reach {
        Reach::Both => mixture + weights,
        Reach::MixtureOnly => mixture,
        Reach::WeightsOnly => weights,
    }
}

/// Every gradient a read produces: the slot values', then the router's parameters'.
fn gradients(
    read: RouterOutput<Ad64>,
    router: &DepthRouter<Ad64>,
    values: &[Tensor<Ad64, 3>],
    seed: u64,
    reach: Reach,
) -> Vec<Vec<f64>> {
    let grads = loss_through(&read, &mut Rng::new(seed), reach).backward();
    let mut all: Vec<Vec<f64>> = values
        .iter()
        .map(|value| tensor_values(value.grad(&grads).expect("every slot receives a gradient")))
        .collect();
    let mut collect = GradCollector::<Ad64> {
        grads: &grads,
        out: &mut all,
    };
    router.visit(&mut collect);
    all
}

struct GradCollector<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: &'a mut Vec<Vec<f64>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradCollector<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // A parameter with no path to the loss (the first read site's router sees one slot) has
        // no gradient; both paths must agree on that too.
        let grad = param.val().grad(self.grads).map(tensor_values);
        self.out.push(grad.unwrap_or_default());
    }
}

/// A read on one path and everything it produces: the outputs, then every gradient.
fn read_and_gradients(
    router: &DepthRouter<Ad64>,
    values: &[Tensor<Ad64, 3>],
    kinds: &[SlotKind],
    path: Option<Handover>,
    seed: u64,
    reach: Reach,
) -> Vec<Vec<f64>> {
    let read = match path {
        None => router.forward(&bank(values, kinds, Handover::Plain)),
        Some(handover) => router.forward_fused(&bank(values, kinds, handover)),
    };
    let mut all = vec![
        tensor_values(read.mixture.clone()),
        tensor_values(read.weights.clone()),
    ];
    all.extend(gradients(read, router, values, seed, reach));
    all
}

fn check_case(case: BankCase) {
    let mut rng = Rng::new(case.seed);
    let router = random_router(&case, &mut rng);
    let values = random_values(&case, &mut rng);
    let seed = case.seed + 1;
    for reach in [Reach::Both, Reach::MixtureOnly, Reach::WeightsOnly] {
        let reference = read_and_gradients(&router, &values, &case.kinds, None, seed, reach);
        for handover in [Handover::Plain, Handover::Cached, Handover::ScaledDetails] {
            let path = Some(handover);
            let fused = read_and_gradients(&router, &values, &case.kinds, path, seed, reach);
            let label = format!(
                "S = {}, sources {handover:?}, {reach:?}",
                case.kinds.len() + 1
            );
            assert_agree(&reference, &fused, &label);
        }
    }
}

fn assert_agree(reference: &[Vec<f64>], fused: &[Vec<f64>], label: &str) {
    assert_eq!(reference.len(), fused.len());
    // Entries: mixture, weights, each slot's gradient, then query, key-norm weight, bias.
    for (index, (a, b)) in reference.iter().zip(fused).enumerate() {
        assert_eq!(
            a.len(),
            b.len(),
            "{label}: entry {index} has another length"
        );
        let diff = max_abs_diff(a, b);
        let scale = a.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        assert!(
            diff < TOLERANCE * scale,
            "{label}: entry {index} differs by {diff}"
        );
    }
}

fn haares_kinds(pairs: usize) -> Vec<SlotKind> {
    (0..pairs)
        .flat_map(|_| [SlotKind::Cumulative, SlotKind::Detail])
        .collect()
}

#[test]
fn a_single_slot_reads_the_embedding_on_both_paths() {
    check_case(BankCase {
        batch: 2,
        seq: 3,
        d: 8,
        kinds: vec![],
        bias: None,
        seed: 101,
    });
}

#[test]
fn block_attnres_banks_agree() {
    let kinds = vec![SlotKind::Cumulative; 4];
    check_case(BankCase {
        batch: 3,
        seq: 5,
        d: 16,
        kinds,
        bias: None,
        seed: 102,
    });
}

#[test]
fn haares_banks_with_a_learned_bias_agree() {
    let kinds = haares_kinds(4);
    let bias = Some(DetailBias::Learned { init: -2.0 });
    check_case(BankCase {
        batch: 2,
        seq: 7,
        d: 12,
        kinds,
        bias,
        seed: 103,
    });
}

#[test]
fn haares_banks_with_a_fixed_bias_agree() {
    let kinds = haares_kinds(2);
    let bias = Some(DetailBias::Fixed { value: -4.0 });
    check_case(BankCase {
        batch: 1,
        seq: 4,
        d: 6,
        kinds,
        bias,
        seed: 104,
    });
}

/// The largest bank a 48-layer model forms with one block per layer (N = 48): the embedding and
/// 48 pairs, 97 slots.
#[test]
fn the_largest_bank_agrees() {
    let kinds = haares_kinds(48);
    let bias = Some(DetailBias::Learned { init: -2.0 });
    check_case(BankCase {
        batch: 2,
        seq: 3,
        d: 8,
        kinds,
        bias,
        seed: 105,
    });
}

/// Whole models: logits and every parameter's gradient, fused against reference, for every
/// method and ablation (the reference tests separately pin `Auto` to the f64 reference forward).
/// Every method's logits and parameter gradients, on both routing paths, on backend `B`, within
/// `tolerance` of each tensor's largest magnitude (at least 1).
fn methods_agree_across_routing_paths<B: TrainingBackend>(tolerance: f64) {
    let mut rng = Rng::new(106);
    let device = Default::default();
    for method in all_methods() {
        for (layers, blocks) in [(4, 4), (3, 2), (2, 4)] {
            let config = tiny_config(method, layers, blocks);
            let params = random_params(&config, rng.next_u64());
            let tokens = random_tokens(&mut rng, 2, 6, config.vocab_size);
            let run = |routing: RoutingPath| {
                let config = config.clone().with_routing(routing);
                let model = model_on::<B>(&config, &params, &device);
                let logits = model
                    .forward(token_tensor::<B>(&tokens, &device))
                    .expect("valid tokens");
                let values = Rng::new(7).normals(logits.shape().num_elements(), 1.0);
                let weights = Tensor::from_data(TensorData::new(values, logits.dims()), &device);
                let grads = (logits.clone() * weights).sum().backward();
                let mut all = vec![tensor_values(logits)];
                model.visit(&mut GradCollector::<B> {
                    grads: &grads,
                    out: &mut all,
                });
                all
            };
            let (reference, fused) = (run(RoutingPath::Reference), run(RoutingPath::Fused));
            for (index, (a, b)) in reference.iter().zip(&fused).enumerate() {
                let scale = a.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let diff = max_abs_diff(a, b);
                assert!(
                    diff < tolerance * scale,
                    "{} with L = {layers}, N = {blocks}: tensor {index} differs by {diff} \
                     (largest magnitude {scale})",
                    method.name()
                );
            }
        }
    }
}

#[test]
fn every_method_agrees_across_routing_paths() {
    methods_agree_across_routing_paths::<Ad64>(1e-9);
}

/// The same on Flex in f32, where the fused path runs Flex's own loops (`ops/routing/read/flex.rs`)
/// and adds slot gradients into accumulated ones in place. The tolerance is f32's: in the
/// random-sign model at L = 3, N = 2, two parameter gradients of either f32 path differ from the
/// f64 ones by up to 1.2e-4 of their magnitude (measured for both paths; a wrong gradient
/// differs by a large fraction of it).
#[test]
fn every_method_agrees_across_routing_paths_on_flex() {
    methods_agree_across_routing_paths::<burn::backend::Autodiff<burn::backend::Flex>>(2.5e-4);
}

/// Slots that take no gradient (detached inputs) are left out of the operator's backward pass
/// while the other slots' gradients still agree with the reference path; and a read with nothing
/// tracked at all (the operator's untracked branch) gives the reference path's mixture.
#[test]
fn untracked_slots_are_skipped_and_the_rest_agree() {
    let case = BankCase {
        batch: 2,
        seq: 5,
        d: 10,
        kinds: haares_kinds(3),
        bias: Some(DetailBias::Learned { init: -2.0 }),
        seed: 106,
    };
    let mut rng = Rng::new(case.seed);
    let router = random_router(&case, &mut rng);
    let values: Vec<_> = random_values(&case, &mut rng)
        .into_iter()
        .enumerate()
        .map(|(slot, value)| if slot % 2 == 1 { value.detach() } else { value })
        .collect();
    let slot_gradients = |fused: bool| {
        let bank = bank(&values, &case.kinds, Handover::Cached);
        let read = match fused {
            false => router.forward(&bank),
            true => router.forward_fused(&bank),
        };
        let grads = loss(&read, &mut Rng::new(7)).backward();
        values
            .iter()
            .map(|value| value.grad(&grads).map(tensor_values))
            .collect::<Vec<_>>()
    };
    let (reference, fused) = (slot_gradients(false), slot_gradients(true));
    for (slot, pair) in reference.iter().zip(&fused).enumerate() {
        match pair {
            (Some(expected), Some(actual)) => {
                let scale = expected.iter().fold(1.0f64, |m, x| m.max(x.abs()));
                let diff = max_abs_diff(expected, actual);
                assert!(diff < TOLERANCE * scale, "slot {slot} differs by {diff}");
            }
            (None, None) => assert_eq!(slot % 2, 1, "tracked slot {slot} got no gradient"),
            _ => panic!("slot {slot}: one path gives a gradient, the other none"),
        }
    }

    let frozen = router.no_grad();
    let detached: Vec<_> = values.iter().map(|value| value.clone().detach()).collect();
    let expected = tensor_values(
        frozen
            .forward(&bank(&detached, &case.kinds, Handover::Plain))
            .mixture,
    );
    let actual = tensor_values(
        frozen
            .forward_fused(&bank(&detached, &case.kinds, Handover::Cached))
            .mixture,
    );
    let scale = expected.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    assert!(max_abs_diff(&expected, &actual) < TOLERANCE * scale);
}

/// On the CPU backends `Auto` is the fused path (the faster one in every measurement,
/// docs/benchmarks.md, "Current results"), also under autodiff, which asks its inner backend.
#[test]
fn auto_takes_the_fused_path_on_the_cpu_backends() {
    type NdArray32 = burn::backend::NdArray<f32>;
    assert_eq!(RoutingPath::Auto.resolve::<B64>(), RoutingPath::Fused);
    assert_eq!(RoutingPath::Auto.resolve::<Ad64>(), RoutingPath::Fused);
    assert_eq!(RoutingPath::Auto.resolve::<NdArray32>(), RoutingPath::Fused);
    assert_eq!(
        RoutingPath::Auto.resolve::<burn::backend::Autodiff<burn::backend::Flex>>(),
        RoutingPath::Fused
    );
    for explicit in [RoutingPath::Reference, RoutingPath::Fused] {
        assert_eq!(explicit.resolve::<Ad64>(), explicit);
    }
}
