//! The report of `haares-bench versus`: each method's median steps, the round-by-round ratios
//! to each PyTorch peer and to the better of them with their 95% intervals, and the verdict.

use std::fmt::Write as _;

use crate::compare::versus::{VersusMethod, VersusRun};
use crate::measure::stats::{median, median_interval};
use crate::peer::PeerMode;
use crate::report_files::write_atomically_both;

/// The run's report in Markdown.
pub fn versus_table(run: &VersusRun) -> String {
    let cost = &run.spec.cost;
    let (torch, threads, interop) = &run.torch;
    let mut out = format!(
        "# Ours against PyTorch, step by step\n\n\
         Host: {}; {} threads of ours (Rayon's pool). PyTorch {} with {} threads and {} inter-op \
         threads. `{}`, {:?} family, {} layers, N = {}, batch {} × {}, {} rounds per method, the \
         first {} left out. Each round takes one training step of ours and one of each PyTorch \
         peer, one after another, the order turning every round; while one steps, the others \
         wait. The ratios are PyTorch's step over ours (our throughput over its) within each \
         round: their median, and its distribution-free 95% interval over the rounds.\n\n",
        run.host.as_deref().unwrap_or("unknown CPU"),
        run.threads,
        torch.as_deref().unwrap_or("?"),
        threads.map_or("?".into(), |t| t.to_string()),
        interop.map_or("?".into(), |t| t.to_string()),
        cost.backend,
        cost.families[0],
        cost.layers,
        cost.blocks,
        cost.batch,
        cost.seq,
        cost.steps,
        cost.warmup,
    );
    if let Some(reason) = &run.stopped {
        let _ = writeln!(
            out,
            "**The run stopped** after {} of {} methods: {reason}\n",
            run.methods.len(),
            cost.methods.len()
        );
    }
    let Some(first) = run.methods.first() else {
        out.push_str("No method was measured.\n");
        return out;
    };
    out.push_str("| method | ours (s) |");
    for peer in &first.peers {
        let _ = write!(out, " PyTorch {} (s) |", peer.mode.label());
    }
    for peer in &first.peers {
        let _ = write!(out, " ours / {} |", peer.mode.label());
    }
    out.push_str(" ours / best PyTorch |\n|---|---|");
    out.push_str(&"---|".repeat(2 * first.peers.len() + 1));
    out.push('\n');
    let mut verdicts = String::new();
    for method in &run.methods {
        let row = MethodRow::of(method, run);
        out.push_str(&row.line);
        verdicts.push_str(&row.verdict);
    }
    out.push_str("\nA ratio's 95% interval is in brackets. Targets:\n\n");
    out.push_str(&verdicts);
    let compiled = run.methods.iter().flat_map(|m| {
        let compiled = m.peers.iter().filter(|p| p.mode == PeerMode::Compiled);
        compiled.map(move |p| (m, p.step_s.first().copied().unwrap_or(f64::NAN)))
    });
    let compiled: Vec<String> = compiled
        .map(|(m, first)| format!("{} {first:.1} s", m.method.label()))
        .collect();
    if !compiled.is_empty() {
        let _ = writeln!(
            out,
            "\n`torch.compile`'s first steps (its compilation, left out with the warm-up): {}.",
            compiled.join(", ")
        );
    }
    out
}

/// One method's table row and verdict line.
struct MethodRow {
    line: String,
    verdict: String,
}

impl MethodRow {
    fn of(method: &VersusMethod, run: &VersusRun) -> Self {
        let (warmup, target) = (run.spec.cost.warmup, run.spec.target);
        let steady = |steps: &[f64]| median(steps.get(warmup..).unwrap_or(&[]));
        let label = method.method.label();
        let mut line = format!("| {label} | {:.4} |", steady(&method.ours_s));
        for peer in &method.peers {
            let _ = write!(line, " {:.4} |", steady(&peer.step_s));
        }
        let agreeing: Vec<usize> = (0..method.peers.len())
            .filter(|&p| method.peers[p].agrees())
            .collect();
        for p in 0..method.peers.len() {
            let cell = match agreeing.contains(&p) {
                true => interval_cell(&method.ratios(warmup, &[p])),
                false => format!("– (logits {:.1e} from ours)", method.peers[p].agreement.0),
            };
            let _ = write!(line, " {cell} |");
        }
        let (best_cell, verdict) = match agreeing.is_empty() {
            true => (
                "–".to_string(),
                format!("- {label}: not compared: no PyTorch peer's logits agree with ours\n"),
            ),
            false => {
                let best = method.ratios(warmup, &agreeing);
                let cell = interval_cell(&best);
                let verdict = format!(
                    "- {label}: our throughput / the best PyTorch's {cell} over {} rounds; target \
                     ≥ {target:.2}×: {}\n",
                    best.len(),
                    verdict(&best, target)
                );
                (cell, verdict)
            }
        };
        line.push_str(&format!(" {best_cell} |\n"));
        Self { line, verdict }
    }
}

/// `1.234× (1.200–1.300)`: a ratio's median and 95% interval.
fn interval_cell(ratios: &[f64]) -> String {
    match median_interval(ratios) {
        Some(i) => format!("{:.3}× ({:.3}–{:.3})", i.median, i.low, i.high),
        None => format!("{:.3}× (too few rounds)", median(ratios)),
    }
}

impl VersusMethod {
    /// PyTorch's step over ours (our throughput over its) round by round after the warm-up,
    /// for each peer whose logits agree with ours; for several, the smallest of a round (the
    /// best PyTorch's).
    pub fn ratios(&self, warmup: usize, peers: &[usize]) -> Vec<f64> {
        (warmup..self.ours_s.len())
            .map(|round| {
                let best = peers.iter().map(|&p| self.peers[p].step_s[round]);
                best.fold(f64::INFINITY, f64::min) / self.ours_s[round]
            })
            .collect()
    }
}

/// Whether a throughput ratio's interval settles the target (at least `target`).
pub fn verdict(ratios: &[f64], target: f64) -> &'static str {
    match median_interval(ratios) {
        Some(interval) if interval.low >= target => {
            "met (the whole interval is at or above the target)"
        }
        Some(interval) if interval.high < target => {
            "not met (the whole interval is below the target)"
        }
        Some(_) => "not settled by this run (the interval contains the target): run more rounds",
        None => "not settled: too few rounds",
    }
}

/// Writes `run` as `<stem>.json` and its table as `<stem>.md`, atomically; returns the table.
pub fn write_versus_run(run: &VersusRun, stem: &std::path::Path) -> crate::Result<String> {
    let table = versus_table(run);
    write_atomically_both(stem, run, &table)?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::versus::VersusPeer;
    use crate::peer::{PeerMatmul, PeerMode};

    fn peer(mode: PeerMode, step_s: Vec<f64>) -> VersusPeer {
        VersusPeer {
            mode,
            matmul: PeerMatmul::Fp32,
            step_s,
            losses: (0.0, 0.0),
            agreement: (0.0, 1.0),
        }
    }

    /// Round by round, the faster of the peers named over ours, the warm-up left out.
    #[test]
    fn a_rounds_ratio_is_the_faster_peer_over_ours() {
        let method = VersusMethod {
            method: "standard".parse().unwrap(),
            ours_s: vec![9.0, 1.0, 2.0, 1.0],
            ours_losses: (0.0, 0.0),
            peers: vec![
                peer(PeerMode::Eager, vec![9.0, 1.5, 3.0, 4.0]),
                peer(PeerMode::Compiled, vec![0.1, 2.0, 2.5, 1.2]),
            ],
            first: vec![0, 1, 2, 0],
        };
        assert_eq!(method.ratios(1, &[0, 1]), [1.5, 1.25, 1.2]);
        assert_eq!(method.ratios(1, &[0]), [1.5, 1.5, 4.0]);
        assert_eq!(method.ratios(0, &[1]), [0.1 / 9.0, 2.0, 1.25, 1.2]);
    }

    /// The target is met only when the whole interval is at or above it, missed only when the
    /// whole interval is below it.
    #[test]
    fn the_verdict_reads_the_whole_interval() {
        let around =
            |centre: f64| -> Vec<f64> { (0..10).map(|i| centre + 0.01 * i as f64).collect() };
        assert!(verdict(&around(1.30), 1.3).starts_with("met"));
        assert!(verdict(&around(1.20), 1.3).starts_with("not met"));
        assert!(verdict(&around(1.25), 1.3).starts_with("not settled by this run"));
        assert!(verdict(&[2.0; 5], 1.3).contains("too few rounds"));
    }
}
