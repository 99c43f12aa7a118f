//! Summaries of a cost run: per-method medians, ratios, model FLOP utilisation, the targets.

use std::fmt::Write as _;

use haares_core::ModelFamily;

use crate::cost::CostRun;
use crate::cost::summary::{MethodCost, megabytes, summarise};

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

fn cell(value: Option<f64>) -> String {
    value.map_or("–".into(), |v| format!("{v:.3}×"))
}

/// The markdown report: the protocol, one row per family × method, and the run's targets.
pub fn cost_table(run: &CostRun) -> String {
    let mut out = String::new();
    if run.is_partial() {
        let _ = writeln!(
            out,
            "**Partial:** written after {} of the {} families asked for; the run did not finish \
             (the families still to come are missing, and the GEMM peak was measured once).\n",
            run.samples.len(),
            run.spec.families.len()
        );
    }
    out.push_str(&protocol_paragraph(run));
    let summaries = summarise(run);
    for (family, costs) in &summaries {
        for c in costs {
            write_method_row(&mut out, *family, costs, c);
        }
    }
    out.push_str(
        "\nTargets (`--haares-target`, `--block-target`, `--mfu-target`; the paper's unfused \
         implementation: 1.21× / 1.18× at d = 512)\n\n",
    );
    for (family, costs) in &summaries {
        write_ratio_targets(&mut out, &run.spec.targets, *family, costs);
        write_other_targets(&mut out, &run.spec, *family, costs);
    }
    write_telemetry_section(&mut out, &run.spec, &summaries);
    crate::cost::launches::write_launch_section(&mut out, run);
    crate::cost::peer_report::write_peer_section(&mut out, run, &summaries);
    out
}

/// What was measured, how, and the table's header.
fn protocol_paragraph(run: &CostRun) -> String {
    let spec = &run.spec;
    let peak = run.gemm_flops_per_s.iter().copied().fold(0.0, f64::max);
    let rates: Vec<String> = run
        .gemm_flops_per_s
        .iter()
        .map(|r| format!("{:.1}", r / 1e9))
        .collect();
    let kernels = run
        .samples
        .iter()
        .flat_map(|(_, samples)| samples)
        .map(|sample| sample.product_kernels.as_str())
        .find(|kernels| !kernels.is_empty())
        .unwrap_or("not recorded");
    format!(
        "Cost protocol on `{}`: {} layers, N = {}, batch {} × {}, K = {} steps from step zero \
         (start-up included), steady state after {} warm-up steps, {} interleaved repeat(s), fp32. \
         Matrix products: {kernels}. \
         GEMM peak {:.1} GFLOP/s ({n}×{n}, best of before/after: {}).\n\n\
         Peak memory is allocated memory, as in the paper (device bytes in use on a GPU, cuBLAS's \
         workspaces included, heap bytes on a CPU); peak RSS adds what the allocator keeps.\n\n\
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
        rates.join(" / "),
        n = spec.gemm_n,
    )
}

fn steady_step(c: &MethodCost) -> f64 {
    c.steady_step_s
}

/// One method's row of the table.
fn write_method_row(out: &mut String, family: ModelFamily, costs: &[MethodCost], c: &MethodCost) {
    let name = c.method.to_string();
    let _ = writeln!(
        out,
        "| {family:?} | {} | {} | {:.2} | {:.2} | {:.0} | {:.4} | {} ({}) | {} | {} | {} | {} | {} | {:.1}% |",
        family.widths().0,
        c.method.label(),
        c.startup_s,
        c.first_step_s,
        c.tokens_per_s_from_start,
        c.steady_step_s,
        megabytes(c.peak_memory_bytes),
        c.memory_kind,
        megabytes(c.peak_rss_bytes),
        cell(ratio(costs, &name, "block-attnres", steady_step)),
        cell(ratio(costs, &name, "block-attnres", memory)),
        cell(ratio(costs, &name, "block-attnres", rss)),
        cell(ratio(costs, &name, "standard", steady_step)),
        100.0 * c.mfu,
    );
}

/// The step-time and memory ratios against their targets, for each routing path measured: the
/// same path on both sides, bare names (the automatic choice) first, then pinned.
fn write_ratio_targets(
    out: &mut String,
    targets: &crate::cost::targets::Targets,
    family: ModelFamily,
    costs: &[MethodCost],
) {
    for path in ["", "/fused", "/reference"] {
        let (haares, block) = (format!("haares{path}"), format!("block-attnres{path}"));
        let checks = [
            (
                "HAARES / Block AttnRes step time",
                ratio(costs, &haares, &block, steady_step),
                targets.haares_over_block,
                repeat_ratio_range(costs, &haares, &block),
            ),
            (
                "HAARES / Block AttnRes peak memory",
                ratio(costs, &haares, &block, memory),
                targets.haares_over_block,
                None,
            ),
            (
                "Block AttnRes / Standard step time",
                ratio(costs, &block, "standard", steady_step),
                targets.block_over_standard,
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
}

/// Peak RSS for comparison, Standard Residual's MFU and the routing telemetry's share of
/// training time against their targets.
fn write_other_targets(
    out: &mut String,
    spec: &crate::cost::CostSpec,
    family: ModelFamily,
    costs: &[MethodCost],
) {
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
        let target = spec.targets.mfu_on(spec.backend);
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
                c.method.label(),
                100.0 * share
            );
        }
    }
}

/// The routing-telemetry table: a validation batch without and with the statistics the learner
/// logs to `routing.jsonl`, and their share of training time at the spec's validation schedule.
fn write_telemetry_section(
    out: &mut String,
    spec: &crate::cost::CostSpec,
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
            c.method.label(),
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
