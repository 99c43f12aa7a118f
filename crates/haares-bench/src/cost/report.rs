//! Summaries of a cost run: per-method medians, ratios, model FLOP utilisation, the targets.

use std::fmt::Write as _;

use haares_core::ModelFamily;
use haares_train::config::method_label;
use serde::{Deserialize, Serialize};

use super::CostRun;
use super::worker::TrainSample;

/// One method's summary within a family.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MethodCost {
    /// Method name.
    pub method: String,
    /// Median start-up seconds.
    pub startup_s: f64,
    /// Median seconds of the first step (on a GPU: kernel compilation and autotuning).
    #[serde(default)]
    pub first_step_s: f64,
    /// Median tokens / s over K steps from step zero, start-up included (the paper's throughput).
    pub tokens_per_s_from_start: f64,
    /// Median step seconds after the warm-up, over every repeat.
    pub steady_step_s: f64,
    /// The same median within each repeat, in run order: the methods are interleaved, so the
    /// i-th entries of two methods ran side by side, and their ratio is one paired comparison.
    pub repeat_steps_s: Vec<f64>,
    /// Peak memory in bytes, the paper's allocated (not reserved) memory: device bytes in use
    /// on GPU backends, peak allocated heap bytes on CPU (peak RSS for runs recorded without
    /// the counting allocator).
    pub peak_memory_bytes: Option<u64>,
    /// Which memory `peak_memory_bytes` is.
    pub memory_kind: String,
    /// Peak resident set size of the worker process, allocator retention included.
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// Training FLOPs per token (analytic).
    pub training_flops_per_token: f64,
    /// Model FLOP utilisation: training FLOP/s at the steady step time / the GEMM peak.
    pub mfu: f64,
    /// Median seconds of a validation batch without and with routing statistics (routed
    /// methods measured with them).
    #[serde(default)]
    pub validation_s: Option<(f64, f64)>,
}

impl MethodCost {
    /// The routing statistics' share of training time at the spec's validation schedule:
    /// `V·(t_routing − t_plain) / (E·t_step)` for `V` validation batches every `E` steps.
    pub fn telemetry_share(&self, every: usize, batches: usize) -> Option<f64> {
        let (plain, routing) = self.validation_s?;
        Some(batches as f64 * (routing - plain) / (every as f64 * self.steady_step_s))
    }
}

/// A method's label with its pinned routing path, e.g. `haares/fused` → `HAARES (fused)`.
pub fn method_with_path(method: &str) -> String {
    match method.split_once('/') {
        Some((name, path)) => format!("{} ({path})", method_label(name)),
        None => method_label(method),
    }
}

/// The median of `values` (the mean of the middle two for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Summaries of every family's methods, in the spec's method order.
pub fn summarise(run: &CostRun) -> Vec<(ModelFamily, Vec<MethodCost>)> {
    let spec = &run.spec;
    let tokens = (spec.batch * spec.seq) as f64;
    let peak = run.gemm_flops_per_s.iter().copied().fold(0.0, f64::max);
    run.samples
        .iter()
        .map(|(family, samples)| {
            let costs = spec
                .methods
                .iter()
                .map(|method| {
                    let mine: Vec<_> = samples.iter().filter(|s| &s.method == method).collect();
                    let steady_of =
                        |s: &TrainSample| s.step_s[spec.warmup.min(s.step_s.len())..].to_vec();
                    let steady: Vec<f64> = mine.iter().flat_map(|s| steady_of(s)).collect();
                    let steady_step_s = median(&steady);
                    let repeat_steps_s = mine.iter().map(|s| median(&steady_of(s))).collect();
                    let from_start: Vec<f64> = mine
                        .iter()
                        .map(|s| tokens * s.step_s.len() as f64 / s.total_s)
                        .collect();
                    let largest = |of: fn(&TrainSample) -> Option<u64>| {
                        mine.iter().filter_map(|s| of(s)).max()
                    };
                    let peak_rss_bytes = largest(|s| s.peak_rss_bytes);
                    let (peak_memory_bytes, memory_kind) = [
                        (largest(|s| s.device_in_use_bytes), "device in use"),
                        (largest(|s| s.peak_allocated_bytes), "allocated"),
                        (peak_rss_bytes, "peak RSS"),
                    ]
                    .into_iter()
                    .find(|(bytes, _)| bytes.is_some())
                    .unwrap_or((None, "none"));
                    let training_flops_per_token = run
                        .training_flops
                        .iter()
                        .find(|(f, m, _)| f == family && m == method)
                        .map_or(f64::NAN, |(_, _, flops)| *flops);
                    MethodCost {
                        method: method.clone(),
                        startup_s: median(&mine.iter().map(|s| s.startup_s).collect::<Vec<_>>()),
                        first_step_s: median(
                            &mine
                                .iter()
                                .filter_map(|s| s.step_s.first().copied())
                                .collect::<Vec<_>>(),
                        ),
                        tokens_per_s_from_start: median(&from_start),
                        steady_step_s,
                        repeat_steps_s,
                        peak_memory_bytes,
                        memory_kind: memory_kind.to_string(),
                        peak_rss_bytes,
                        training_flops_per_token,
                        mfu: training_flops_per_token * tokens / steady_step_s / peak,
                        validation_s: validation_medians(&mine),
                    }
                })
                .collect();
            (*family, costs)
        })
        .collect()
}

/// Medians of the validation batch times over every sample that has them.
fn validation_medians(samples: &[&TrainSample]) -> Option<(f64, f64)> {
    let timed: Vec<_> = samples
        .iter()
        .filter_map(|s| s.validation.as_ref())
        .collect();
    let all = |of: fn(&super::worker::ValidationCost) -> &Vec<f64>| {
        median(
            &timed
                .iter()
                .flat_map(|v| of(v).iter().copied())
                .collect::<Vec<_>>(),
        )
    };
    (!timed.is_empty()).then(|| (all(|v| &v.plain_s), all(|v| &v.with_routing_s)))
}

fn ratio(
    costs: &[MethodCost],
    method: &str,
    base: &str,
    of: impl Fn(&MethodCost) -> f64,
) -> Option<f64> {
    let find = |name: &str| costs.iter().find(|c| c.method == name);
    Some(of(find(method)?) / of(find(base)?))
}

/// The smallest and largest ratio of two methods' step times repeat by repeat, when there are at
/// least two repeats: how far one run's ratio can move with the machine.
fn repeat_ratio_range(costs: &[MethodCost], method: &str, base: &str) -> Option<(f64, f64)> {
    let find = |name: &str| costs.iter().find(|c| c.method == name);
    let (method, base) = (find(method)?, find(base)?);
    let ratios: Vec<f64> = method
        .repeat_steps_s
        .iter()
        .zip(&base.repeat_steps_s)
        .map(|(mine, theirs)| mine / theirs)
        .collect();
    (ratios.len() >= 2).then(|| {
        let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lowest, highest)
    })
}

fn memory(c: &MethodCost) -> f64 {
    c.peak_memory_bytes.map_or(f64::NAN, |b| b as f64)
}

fn rss(c: &MethodCost) -> f64 {
    c.peak_rss_bytes.map_or(f64::NAN, |b| b as f64)
}

/// Bytes as whole megabytes, `–` when unknown.
pub(crate) fn megabytes(bytes: Option<u64>) -> String {
    bytes.map_or("–".into(), |b| format!("{:.0}", b as f64 / 1e6))
}

fn cell(value: Option<f64>) -> String {
    value.map_or("–".into(), |v| format!("{v:.3}×"))
}

/// The markdown report: the protocol, one row per family × method, and the targets.
pub fn cost_table(run: &CostRun) -> String {
    let spec = &run.spec;
    let peak = run.gemm_flops_per_s.iter().copied().fold(0.0, f64::max);
    let mut out = format!(
        "Cost protocol on `{}`: {} layers, N = {}, batch {} × {}, K = {} steps from step zero \
         (start-up included), steady state after {} warm-up steps, {} interleaved repeat(s), fp32. \
         GEMM peak {:.1} GFLOP/s ({n}×{n}, best of before/after: {}).\n\n\
         Peak memory is allocated memory, as in the paper (device bytes in use on a GPU, heap \
         bytes on a CPU); peak RSS adds what the allocator keeps.\n\n\
         | family | d | method | start-up (s) | first step (s) | tokens/s from step 0 | steady step (s) | peak memory (MB) | peak RSS (MB) | step / Block | memory / Block | RSS / Block | step / Standard | MFU |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        spec.backend,
        spec.layers,
        spec.blocks,
        spec.batch,
        spec.seq,
        spec.steps,
        spec.warmup,
        spec.repeats,
        peak / 1e9,
        run.gemm_flops_per_s
            .iter()
            .map(|r| format!("{:.1}", r / 1e9))
            .collect::<Vec<_>>()
            .join(" / "),
        n = spec.gemm_n,
    );
    let summaries = summarise(run);
    for (family, costs) in &summaries {
        for c in costs {
            let step = |c: &MethodCost| c.steady_step_s;
            let _ = writeln!(
                out,
                "| {family:?} | {} | {} | {:.2} | {:.2} | {:.0} | {:.4} | {} ({}) | {} | {} | {} | {} | {} | {:.1}% |",
                family.widths().0,
                method_with_path(&c.method),
                c.startup_s,
                c.first_step_s,
                c.tokens_per_s_from_start,
                c.steady_step_s,
                megabytes(c.peak_memory_bytes),
                c.memory_kind,
                megabytes(c.peak_rss_bytes),
                cell(ratio(costs, &c.method, "block-attnres", step)),
                cell(ratio(costs, &c.method, "block-attnres", memory)),
                cell(ratio(costs, &c.method, "block-attnres", rss)),
                cell(ratio(costs, &c.method, "standard", step)),
                100.0 * c.mfu,
            );
        }
    }
    out.push_str("\nTargets (haares-bench issue; the paper's unfused implementation: 1.21× / 1.18× at d = 512)\n\n");
    for (family, costs) in &summaries {
        let step = |c: &MethodCost| c.steady_step_s;
        // The same routing path on both sides: bare names (the automatic choice), then pinned.
        for path in ["", "/fused", "/reference"] {
            let (haares, block) = (format!("haares{path}"), format!("block-attnres{path}"));
            let checks = [
                (
                    "HAARES / Block AttnRes step time",
                    ratio(costs, &haares, &block, step),
                    1.05,
                    repeat_ratio_range(costs, &haares, &block),
                ),
                (
                    "HAARES / Block AttnRes peak memory",
                    ratio(costs, &haares, &block, memory),
                    1.05,
                    None,
                ),
                (
                    "Block AttnRes / Standard step time",
                    ratio(costs, &block, "standard", step),
                    1.15,
                    repeat_ratio_range(costs, &block, "standard"),
                ),
            ];
            for (what, value, target, spread) in checks {
                if let Some(value) = value.filter(|v| v.is_finite()) {
                    let verdict = if value <= target { "met" } else { "not met" };
                    let spread = spread.map_or(String::new(), |(lowest, highest)| {
                        format!("; per repeat {lowest:.3}–{highest:.3}×")
                    });
                    let _ = writeln!(
                        out,
                        "- {family:?}{path}: {what} {value:.3}× (target ≤ {target:.2}×): \
                         {verdict}{spread}"
                    );
                }
            }
        }
        let memory_kind = costs.first().map_or("", |c| c.memory_kind.as_str());
        if let Some(value) = ratio(costs, "haares", "block-attnres", rss).filter(|v| v.is_finite())
            && memory_kind != "peak RSS"
        {
            let _ = writeln!(
                out,
                "- {family:?}: HAARES / Block AttnRes peak RSS {value:.3}× (for comparison: the \
                 targets use {memory_kind} memory, the paper's measure)"
            );
        }
        if let Some(standard) = costs.iter().find(|c| c.method == "standard") {
            // A GPU's peak is its tensor-core GEMM, harder to approach than a CPU's.
            let target = if matches!(spec.backend.as_str(), "cuda" | "wgpu") {
                0.4
            } else {
                0.6
            };
            let verdict = if standard.mfu >= target {
                "met"
            } else {
                "not met"
            };
            let _ = writeln!(
                out,
                "- {family:?}: Standard Residual MFU {:.1}% (target ≥ {:.0}%): {verdict}",
                100.0 * standard.mfu,
                100.0 * target
            );
        }
        for c in costs {
            if let Some(share) = c.telemetry_share(spec.validation_every, spec.validation_batches) {
                let verdict = if share <= 0.01 { "met" } else { "not met" };
                let _ = writeln!(
                    out,
                    "- {family:?}: {} routing telemetry {:.2}% of training time (target ≤ 1%): {verdict}",
                    method_with_path(&c.method),
                    100.0 * share
                );
            }
        }
    }
    write_telemetry_section(&mut out, spec, &summaries);
    super::peer_report::write_peer_section(&mut out, run, &summaries);
    out
}

/// The routing-telemetry table: a validation batch without and with the statistics the learner
/// logs to `routing.jsonl`, and their share of training time at the spec's validation schedule.
fn write_telemetry_section(
    out: &mut String,
    spec: &super::CostSpec,
    summaries: &[(ModelFamily, Vec<MethodCost>)],
) {
    let timed = summaries
        .iter()
        .flat_map(|(family, costs)| costs.iter().map(move |c| (family, c)))
        .filter(|(_, c)| c.validation_s.is_some());
    let mut rows = String::new();
    for (family, c) in timed {
        let (plain, routing) = c.validation_s.unwrap_or_default();
        let share = c
            .telemetry_share(spec.validation_every, spec.validation_batches)
            .unwrap_or(f64::NAN);
        let _ = writeln!(
            rows,
            "| {family:?} | {} | {plain:.4} | {routing:.4} | {:+.1}% | {:.2}% |",
            method_with_path(&c.method),
            100.0 * (routing / plain - 1.0),
            100.0 * share
        );
    }
    if rows.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "\nRouting telemetry: a validation batch (median) with loss only and with the routing \
         statistics of `routing.jsonl`, and their share of training time for a validation pass of \
         {} batches every {} steps.\n\n\
         | family | method | validation batch (s) | with routing statistics (s) | overhead | share of training time |\n\
         |---|---|---|---|---|---|\n{rows}",
        spec.validation_batches, spec.validation_every
    );
}
