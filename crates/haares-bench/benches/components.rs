//! Criterion benchmarks of HAARES's source handling and of one full training step per method, on
//! Burn's Flex CPU backend at the small family's width (d = 128), batch 8 × 128.
//!
//! `cargo bench -p haares-bench --bench components`; a filter narrows it, e.g. `-- router`.
//! Each routing/RMS/accumulator case times forward and backward together, since training pays
//! both.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Distribution, Tensor};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use haares_bench::measure::worker::Trainer;
use haares_core::ResidualMethod;
use haares_core::accumulator::BlockAccumulator;
use haares_core::config::DetailBias;
use haares_core::ops::SourceWriteBackend;
use haares_core::ops::routing::write::naive;
use haares_core::rms_match::rms_match;
use haares_core::router::DepthRouterConfig;
use haares_core::{ModelFamily, RoutingPath, SlotKind, Source, SourceBank};
use haares_train::cpu::on_cpu_pool;

type B = Autodiff<Flex>;

const BATCH: usize = 8;
const SEQ: usize = 128;
const D: usize = 128;

fn activation() -> Tensor<B, 3> {
    Tensor::random(
        [BATCH, SEQ, D],
        Distribution::Normal(0.0, 1.0),
        &Default::default(),
    )
    .require_grad()
}

/// A read over the largest intermediate banks of tab:sourcecounts at 48 layers, N = 4: 5 slots
/// (Block AttnRes) and 9 (HAARES: the embedding, three completed pairs, the active pair), on the
/// reference path and on the fused path. The fused read computes every slot's mean square inside
/// the timed loop, so it gets no credit for the sharing across read sites that the model enjoys.
fn router(c: &mut Criterion) {
    let mut group = c.benchmark_group("router");
    for (label, slots, detail) in [("block-attnres", 5, false), ("haares", 9, true)] {
        let config = DepthRouterConfig::new(D)
            .with_detail_bias(detail.then_some(DetailBias::Learned { init: -2.0 }));
        let router = config.init::<B>(&Default::default());
        let values: Vec<_> = (0..slots).map(|_| activation()).collect();
        let bank = |cached: bool| {
            let source = |value: &Tensor<B, 3>| match cached {
                true => Source::with_mean_square(value.clone()),
                false => Source::plain(value.clone()),
            };
            let mut bank = SourceBank::from_embedding(source(&values[0]));
            for (slot, value) in values.iter().enumerate().skip(1) {
                let kind = match (detail, slot % 2) {
                    (true, 0) => SlotKind::Detail,
                    _ => SlotKind::Cumulative,
                };
                bank.push_source(kind, source(value));
            }
            bank
        };
        // On the CPU pool, as a training step runs (haares_train::cpu::on_cpu_pool).
        group.bench_function(BenchmarkId::new(format!("{label}/reference"), slots), |b| {
            on_cpu_pool(|| b.iter(|| router.forward(&bank(false)).mixture.sum().backward()))
        });
        group.bench_function(BenchmarkId::new(format!("{label}/fused"), slots), |b| {
            on_cpu_pool(|| b.iter(|| router.forward_fused(&bank(true)).mixture.sum().backward()))
        });
    }
    group.finish();
}

/// Why the fused path works on token rows: one per-token factor times an activation, as the
/// reference mixture does it (a weight column narrowed out of `[batch, seq, S]`, broadcast over
/// the last dimension of a rank-3 tensor) and as the fused path does it (a contiguous `[tokens, 1]`
/// column after the `[tokens, d]` rows). Forward only.
fn layout(c: &mut Criterion) {
    let mut group = c.benchmark_group("layout");
    let value = activation().detach();
    let weights =
        Tensor::<B, 3>::random([BATCH, SEQ, 9], Distribution::Default, &Default::default());
    group.bench_function("rank-3 narrowed weight", |b| {
        b.iter(|| weights.clone().narrow(2, 3, 1) * value.clone())
    });
    let rows = value.clone().reshape([BATCH * SEQ, D]);
    let column = weights
        .clone()
        .reshape([BATCH * SEQ * 9, 1])
        .narrow(0, 0, BATCH * SEQ);
    group.bench_function("rows times contiguous column", |b| {
        b.iter(|| rows.clone() * column.clone())
    });
    group.finish();
}

/// eq:rmsmatch on one active pair.
fn rms_matching(c: &mut Criterion) {
    let (detail, cumulative) = (activation(), activation());
    c.bench_function("rms_match", |b| {
        b.iter(|| {
            rms_match(detail.clone(), cumulative.clone(), 4.0, 1e-6)
                .sum()
                .backward()
        })
    });
}

/// eq:update over a block of 24 events (48 layers, N = 4): `C` only, and `C` with `D`; and the
/// detail's running sum alone, by Burn's addition and subtraction (`plain`) and by the signed sum
/// operation the accumulator uses (`signed_sum`). On the CPU pool, as a training step runs.
fn accumulator(c: &mut Criterion) {
    type Write = fn(Tensor<B, 3>, Tensor<B, 3>, f64) -> Tensor<B, 3>;
    let outputs: Vec<Tensor<B, 3>> = (0..24).map(|_| activation()).collect();
    let mut group = c.benchmark_group("accumulator");
    let detail_sums: [(&str, Write); 2] = [
        ("detail/plain", naive::signed_sum),
        ("detail/signed_sum", B::signed_sum),
    ];
    for (label, write) in detail_sums {
        group.bench_function(label, |b| {
            on_cpu_pool(|| {
                b.iter(|| {
                    let sign = |r: usize| if r < 12 { 1.0 } else { -1.0 };
                    let mut events = outputs.iter().enumerate();
                    let (_, first) = events.next().expect("24 events");
                    let detail = events.fold(first.clone(), |detail, (r, output)| {
                        write(detail, output.clone(), sign(r))
                    });
                    detail.sum().backward()
                })
            })
        });
    }
    for (label, with_detail) in [("cumulative", false), ("cumulative+detail", true)] {
        group.bench_function(label, |b| {
            on_cpu_pool(|| {
                b.iter(|| {
                    let mut active = BlockAccumulator::<B, 3>::new();
                    for (r, output) in outputs.iter().enumerate() {
                        if with_detail {
                            active.write(output.clone(), if r < 12 { 1.0 } else { -1.0 });
                        } else {
                            active.write_cumulative(output.clone());
                        }
                    }
                    let (cumulative, detail) = active.take().expect("24 writes");
                    let total = detail.map_or(cumulative.clone(), |d| cumulative + d);
                    total.sum().backward()
                })
            })
        });
    }
    group.finish();
}

/// One learner step (forward, masked cross-entropy, backward, clipped AdamW) of the small family
/// at 12 layers, per method, with the routed methods on both routing paths.
fn training_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("training_step");
    group.sample_size(10);
    let cases = [
        ("standard", RoutingPath::Auto),
        ("block-attnres", RoutingPath::Reference),
        ("block-attnres", RoutingPath::Fused),
        ("haares", RoutingPath::Reference),
        ("haares", RoutingPath::Fused),
    ];
    for (method, routing) in cases {
        let config = ModelFamily::Small
            .config(
                12,
                256,
                method.parse::<ResidualMethod>().expect("a known method"),
            )
            .with_max_seq_len(SEQ.max(512))
            .with_routing(routing);
        let mut trainer =
            Trainer::<B>::new(&config, BATCH, SEQ, &Default::default()).expect("a valid model");
        let label = match routing {
            RoutingPath::Auto => method.to_string(),
            _ => format!("{method}/{routing:?}").to_lowercase(),
        };
        group.bench_function(label, |b| {
            b.iter(|| trainer.step(|_| ()).expect("a finite step"))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    router,
    layout,
    rms_matching,
    accumulator,
    training_step
);
criterion_main!(benches);
