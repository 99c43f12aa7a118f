//! The PyTorch peer's part of the cost report: its steps beside ours, throughput ratios, the two
//! GEMM peaks and the speed targets ([`crate::cost::targets`]), each method against the faster of the
//! PyTorch runs (eager, compiled) at our matrix products' precision whose logits agree with ours.

use std::fmt::Write as _;

use haares_core::ModelFamily;
use serde::{Deserialize, Serialize};

use crate::cost::CostRun;
use crate::cost::summary::{MethodCost, megabytes};
use crate::measure::stats::median;
use crate::method_choice::MethodChoice;
use crate::peer::{PeerMatmul, PeerMode, PeerSample, logits_tolerance};

/// The peer's summary of one method.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerCost {
    /// Method name as in the spec (the peer trains it without the routing path).
    pub method: MethodChoice,
    /// The precision of the peer's matrix products.
    pub matmul: PeerMatmul,
    /// Eager or compiled.
    #[serde(default)]
    pub mode: PeerMode,
    /// Median seconds of the first step over the repeats (a compiled run's compilation).
    #[serde(default)]
    pub first_step_s: f64,
    /// Median step seconds after the warm-up, over every repeat.
    pub steady_step_s: f64,
    /// The same median within each repeat, in run order: the i-th ran right after our i-th
    /// measurement of the method (or of its first routing path), so the two are one paired
    /// comparison, as [`MethodCost::repeat_steps_s`]'s are between our methods.
    #[serde(default)]
    pub repeat_steps_s: Vec<f64>,
    /// Peak resident set size of the peer process.
    pub peak_rss_bytes: Option<u64>,
    /// The largest logits difference from ours over the repeats.
    pub logits_max_abs_diff: f64,
    /// Whether every repeat's logits agreed with ours.
    pub agrees: bool,
}

/// The peer's summaries per family, in the spec's method order, then its modes' and its
/// precisions' order (what it did not measure is left out).
pub fn peer_costs(run: &CostRun) -> Vec<(ModelFamily, Vec<PeerCost>)> {
    let Some(peer) = &run.peer else {
        return Vec::new();
    };
    let warmup = run.spec.warmup;
    let ours = PeerMatmul::ours(run.spec.backend);
    peer.samples
        .iter()
        .map(|(family, samples)| {
            let costs = run
                .spec
                .methods
                .iter()
                .flat_map(|method| {
                    let spec = &run.spec;
                    (spec.peer_modes.iter())
                        .flat_map(move |&mode| spec.peer_matmul.iter().map(move |&m| (m, mode)))
                        .map(move |setting| (method, setting))
                })
                .filter_map(|(method, (matmul, mode))| {
                    let mine: Vec<&PeerSample> = samples
                        .iter()
                        .filter(|s| s.sample.method == method.unpinned())
                        .filter(|s| (s.matmul, s.mode) == (matmul, mode))
                        .collect();
                    let firsts: Vec<f64> = mine
                        .iter()
                        .filter_map(|s| s.sample.step_s.first().copied())
                        .collect();
                    let steady: Vec<f64> = (mine.iter())
                        .flat_map(|s| steady_steps(s, warmup))
                        .copied()
                        .collect();
                    let repeat_steps_s = (mine.iter())
                        .map(|s| median(steady_steps(s, warmup)))
                        .collect();
                    (!mine.is_empty()).then(|| PeerCost {
                        method: *method,
                        matmul,
                        mode,
                        first_step_s: median(&firsts),
                        steady_step_s: median(&steady),
                        repeat_steps_s,
                        peak_rss_bytes: mine.iter().filter_map(|s| s.sample.peak_rss_bytes).max(),
                        logits_max_abs_diff: mine
                            .iter()
                            .map(|s| s.logits_max_abs_diff)
                            .fold(0.0, f64::max),
                        agrees: mine.iter().all(|s| s.agrees(ours)),
                    })
                })
                .collect();
            (*family, costs)
        })
        .collect()
}

/// A measurement's step times after the warm-up.
fn steady_steps(sample: &PeerSample, warmup: usize) -> &[f64] {
    &sample.sample.step_s[warmup.min(sample.sample.step_s.len())..]
}

/// Appends the peer's section to the report: what ran (or why not), one row per method, and
/// the targets.
pub fn write_peer_section(
    out: &mut String,
    run: &CostRun,
    summaries: &[(ModelFamily, Vec<MethodCost>)],
) {
    let Some(peer) = &run.peer else { return };
    out.push_str("\n## PyTorch peer\n\n");
    if let Some(reason) = &peer.skipped {
        let _ = writeln!(out, "Not (fully) measured: {reason}\n");
    }
    if peer.samples.is_empty() {
        return;
    }
    let ours_matmul = PeerMatmul::ours(run.spec.backend);
    let target = run.spec.targets.throughput_on(run.spec.backend);
    let _ = write!(
        out,
        "PyTorch {} with {} threads and {} inter-op threads (`{}`): the same model from the same \
         initial weights, sizes, batch and steps, each measurement right after ours; `compiled` \
         is `torch.compile(model)` (TorchInductor; AdamW and the clip eager), whose first step \
         includes the compilation. Its logits on a perturbed copy of the weights are compared \
         with ours first, eagerly and in full fp32 (agreement: within {:.0e} × max(1, max \
         |logit|), TF32's rounding where ours are TF32). Our matrix products are {} on `{}`.\n\n\
         | family | method | steady step (s) | PyTorch | PyTorch first step (s) | PyTorch steady step (s) | throughput / PyTorch | peak RSS (MB) | PyTorch peak RSS (MB) | logits max abs diff |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        peer.torch_version.as_deref().unwrap_or("?"),
        peer.threads.map_or("?".into(), |t| t.to_string()),
        peer.interop_threads.map_or("?".into(), |t| t.to_string()),
        peer.python,
        logits_tolerance(ours_matmul),
        ours_matmul.label(),
        run.spec.backend,
    );
    let mut targets = String::new();
    for (family, costs) in peer_costs(run) {
        let ours = summaries.iter().find(|(f, _)| *f == family);
        for method in &run.spec.methods {
            let Some(mine) = ours.and_then(|(_, c)| c.iter().find(|c| &c.method == method)) else {
                continue;
            };
            let theirs: Vec<&PeerCost> = costs.iter().filter(|c| &c.method == method).collect();
            let label = method.label();
            for cost in &theirs {
                let setting = format!("{} {}", cost.mode.label(), cost.matmul.label());
                let _ = writeln!(
                    out,
                    "| {family:?} | {label} | {:.4} | {setting} | {:.4} | {:.4} | {:.3}× | {} | {} | {:.1e}{} |",
                    mine.steady_step_s,
                    cost.first_step_s,
                    cost.steady_step_s,
                    cost.steady_step_s / mine.steady_step_s,
                    megabytes(mine.peak_rss_bytes),
                    megabytes(cost.peak_rss_bytes),
                    cost.logits_max_abs_diff,
                    if cost.agrees { "" } else { " (differ)" },
                );
            }
            let _ = writeln!(
                targets,
                "- {family:?}: {label} {}",
                verdict(mine, &theirs, ours_matmul, target)
            );
        }
    }
    write_gemm_peaks(out, &mut targets, run, peer, ours_matmul);
    let _ = write!(
        out,
        "\nTargets against PyTorch (`--throughput-target`, `--gemm-target`)\n\n{targets}\nThe throughput ratios compare medians of runs seconds \
         apart; where the host's speed drifts on that scale, `haares-bench versus` alternates our \
         steps with PyTorch's round by round and gives each ratio a 95% interval.\n"
    );
}

/// The two GEMM peaks beside each other, and their ratio against its target into `targets`.
fn write_gemm_peaks(
    out: &mut String,
    targets: &mut String,
    run: &CostRun,
    peer: &crate::peer::PeerRun,
    ours_matmul: PeerMatmul,
) {
    let best = |rates: &[f64]| rates.iter().copied().fold(f64::NAN, f64::max);
    let (mine, theirs) = (best(&run.gemm_flops_per_s), best(&peer.gemm_flops_per_s));
    if theirs.is_finite() {
        let ratio = mine / theirs;
        let _ = write!(
            out,
            "\nGEMM peak ({n}×{n}, both {}): ours {:.1} GFLOP/s, PyTorch {:.1} GFLOP/s.\n",
            ours_matmul.label(),
            mine / 1e9,
            theirs / 1e9,
            n = run.spec.gemm_n
        );
        let gemm_target = run.spec.targets.gemm;
        let verdict = if ratio >= gemm_target {
            "met"
        } else {
            "not met"
        };
        let _ = writeln!(
            targets,
            "- GEMM peak / PyTorch's {ratio:.3}× (target ≥ {gemm_target}×): {verdict}"
        );
    }
}

/// A method's throughput against the fastest PyTorch run at our matrix products' precision whose
/// logits agree with ours, and the target's verdict; or why there is none to compare with.
fn verdict(mine: &MethodCost, theirs: &[&PeerCost], ours: PeerMatmul, target: f64) -> String {
    let comparable = theirs.iter().filter(|c| c.agrees && c.matmul == ours);
    let Some(best) = comparable.min_by(|a, b| a.steady_step_s.total_cmp(&b.steady_step_s)) else {
        return match theirs.iter().any(|c| !c.agrees) {
            true => "throughput / PyTorch not compared: the peer's logits differ from ours".into(),
            false => format!(
                "throughput / PyTorch not compared: no PyTorch run at our precision ({})",
                ours.label()
            ),
        };
    };
    let ratio = best.steady_step_s / mine.steady_step_s;
    let others: Vec<String> = (theirs.iter())
        .filter(|c| !std::ptr::eq(**c, *best))
        .map(|c| {
            let ratio = c.steady_step_s / mine.steady_step_s;
            let differ = if c.agrees { "" } else { " (logits differ)" };
            format!(
                "{} {} {ratio:.3}×{differ}",
                c.mode.label(),
                c.matmul.label()
            )
        })
        .collect();
    let paired: Vec<f64> = (best.repeat_steps_s.iter())
        .zip(&mine.repeat_steps_s)
        .map(|(theirs, ours)| theirs / ours)
        .collect();
    let spread = match paired.len() >= 2 {
        true => format!(
            ", per repeat {:.3}–{:.3}×",
            paired.iter().copied().fold(f64::INFINITY, f64::min),
            paired.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        ),
        false => String::new(),
    };
    format!(
        "throughput / the best PyTorch ({} {}) {ratio:.3}× (target ≥ {target}×){spread}{}: {}",
        best.mode.label(),
        best.matmul.label(),
        match others.is_empty() {
            true => String::new(),
            false => format!("; against the others {}", others.join(", ")),
        },
        if ratio >= target { "met" } else { "not met" }
    )
}
