//! One row of the cost table: a method's medians over its workers' samples, its peak memory and
//! its model FLOP utilisation.

use haares_core::ModelFamily;
use serde::{Deserialize, Serialize};

use crate::cost::CostRun;
use crate::measure::stats::median;
use crate::measure::worker::{TrainSample, ValidationCost};
use crate::method_choice::MethodChoice;

/// One method's summary within a family.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MethodCost {
    /// Method name.
    pub method: MethodChoice,
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
                        method: *method,
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
    let all = |of: fn(&ValidationCost) -> &Vec<f64>| {
        median(
            &timed
                .iter()
                .flat_map(|v| of(v).iter().copied())
                .collect::<Vec<_>>(),
        )
    };
    (!timed.is_empty()).then(|| (all(|v| &v.plain_s), all(|v| &v.with_routing_s)))
}

/// Bytes as whole megabytes, `–` when unknown.
pub(crate) fn megabytes(bytes: Option<u64>) -> String {
    bytes.map_or("–".into(), |b| format!("{:.0}", b as f64 / 1e6))
}
