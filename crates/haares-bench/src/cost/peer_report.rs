//! The PyTorch peer's part of the cost report: its steps beside ours, throughput ratios, the two
//! GEMM peaks and the CPU-speed targets (≥ 0.6× PyTorch eager per method, GEMM ≥ 0.7×).

use std::fmt::Write as _;

use haares_core::ModelFamily;
use serde::{Deserialize, Serialize};

use super::CostRun;
use super::peer::{LOGITS_TOLERANCE, PeerSample};
use super::stats::median;
use super::summary::{MethodCost, megabytes, method_with_path};

/// Throughput of ours / PyTorch's at which the CPU-speed issue's target is met.
pub const THROUGHPUT_TARGET: f64 = 0.6;
/// Our GEMM peak / PyTorch's at which that target is met.
pub const GEMM_TARGET: f64 = 0.7;

/// The peer's summary of one method.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerCost {
    /// Method name as in the spec.
    pub method: String,
    /// Median step seconds after the warm-up, over every repeat.
    pub steady_step_s: f64,
    /// Peak resident set size of the peer process.
    pub peak_rss_bytes: Option<u64>,
    /// The largest logits difference from ours over the repeats.
    pub logits_max_abs_diff: f64,
    /// Whether every repeat's logits agreed with ours.
    pub agrees: bool,
}

/// The peer's summaries per family, in the spec's method order (methods it did not measure are
/// left out).
pub fn peer_costs(run: &CostRun) -> Vec<(ModelFamily, Vec<PeerCost>)> {
    let Some(peer) = &run.peer else {
        return Vec::new();
    };
    let warmup = run.spec.warmup;
    peer.samples
        .iter()
        .map(|(family, samples)| {
            let costs = run
                .spec
                .methods
                .iter()
                .filter_map(|method| {
                    let mine: Vec<&PeerSample> = samples
                        .iter()
                        .filter(|s| &s.sample.method == method)
                        .collect();
                    let steady: Vec<f64> = mine
                        .iter()
                        .flat_map(|s| s.sample.step_s[warmup.min(s.sample.step_s.len())..].to_vec())
                        .collect();
                    (!mine.is_empty()).then(|| PeerCost {
                        method: method.clone(),
                        steady_step_s: median(&steady),
                        peak_rss_bytes: mine.iter().filter_map(|s| s.sample.peak_rss_bytes).max(),
                        logits_max_abs_diff: mine
                            .iter()
                            .map(|s| s.logits_max_abs_diff)
                            .fold(0.0, f64::max),
                        agrees: mine.iter().all(|s| s.agrees()),
                    })
                })
                .collect();
            (*family, costs)
        })
        .collect()
}

/// Appends the peer's section to the report: what ran (or why not), one row per method, and
/// the targets.
pub fn write_peer_section(
    out: &mut String,
    run: &CostRun,
    summaries: &[(ModelFamily, Vec<MethodCost>)],
) {
    let Some(peer) = &run.peer else { return };
    out.push_str("\n## PyTorch-eager peer\n\n");
    if let Some(reason) = &peer.skipped {
        let _ = writeln!(out, "Not (fully) measured: {reason}\n");
    }
    if peer.samples.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "PyTorch {} with {} threads (`{}`): the same model from the same initial weights, sizes, \
         batch and steps, each measurement right after ours. Its logits on a perturbed copy of \
         the weights are compared with ours first (agreement: within {LOGITS_TOLERANCE:.0e} × \
         max(1, max |logit|)).\n\n\
         | family | method | steady step (s) | PyTorch steady step (s) | throughput / PyTorch | peak RSS (MB) | PyTorch peak RSS (MB) | logits max abs diff |\n\
         |---|---|---|---|---|---|---|---|\n",
        peer.torch_version.as_deref().unwrap_or("?"),
        peer.threads.map_or("?".into(), |t| t.to_string()),
        peer.python,
    );
    let mut targets = String::new();
    for (family, costs) in peer_costs(run) {
        let ours = summaries.iter().find(|(f, _)| *f == family);
        for theirs in costs {
            let Some(mine) = ours.and_then(|(_, c)| c.iter().find(|c| c.method == theirs.method))
            else {
                continue;
            };
            let ratio = theirs.steady_step_s / mine.steady_step_s;
            let label = method_with_path(&theirs.method);
            let _ = writeln!(
                out,
                "| {family:?} | {label} | {:.4} | {:.4} | {ratio:.3}× | {} | {} | {:.1e}{} |",
                mine.steady_step_s,
                theirs.steady_step_s,
                megabytes(mine.peak_rss_bytes),
                megabytes(theirs.peak_rss_bytes),
                theirs.logits_max_abs_diff,
                if theirs.agrees { "" } else { " (differ)" },
            );
            let verdict = match (theirs.agrees, ratio >= THROUGHPUT_TARGET) {
                (false, _) => "not compared: the peer's logits differ from ours".to_string(),
                (true, met) => format!(
                    "{ratio:.3}× (target ≥ {THROUGHPUT_TARGET}×, goal 1.0×): {}",
                    if met { "met" } else { "not met" }
                ),
            };
            let _ = writeln!(
                targets,
                "- {family:?}: {label} throughput / PyTorch eager {verdict}"
            );
        }
    }
    let best = |rates: &[f64]| rates.iter().copied().fold(f64::NAN, f64::max);
    let (mine, theirs) = (best(&run.gemm_flops_per_s), best(&peer.gemm_flops_per_s));
    if theirs.is_finite() {
        let ratio = mine / theirs;
        let _ = write!(
            out,
            "\nGEMM peak ({n}×{n}): ours {:.1} GFLOP/s, PyTorch {:.1} GFLOP/s.\n",
            mine / 1e9,
            theirs / 1e9,
            n = run.spec.gemm_n
        );
        let verdict = if ratio >= GEMM_TARGET {
            "met"
        } else {
            "not met"
        };
        let _ = writeln!(
            targets,
            "- GEMM peak / PyTorch's {ratio:.3}× (target ≥ {GEMM_TARGET}×): {verdict}"
        );
    }
    let _ = write!(out, "\nTargets (CPU-speed issue)\n\n{targets}");
}
