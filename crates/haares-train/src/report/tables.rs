//! The report's paired tables: reductions against Block AttnRes (fig:pairedevidence), time to
//! target and break-even (tab:timetotarget, eq:breakeven), and `paired_results.csv`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::report::paper_side::PaperSide;
use crate::report::results::{BASELINE, Finished, Pair, mean_sd, time_to_target};
use haares_core::method::method_label;

/// Appends the paired-reduction tables.
pub fn write_pairs_section(md: &mut String, pairs: &[Pair]) {
    let _ = writeln!(
        md,
        "## Paired reductions ℓ_Block − ℓ_M (positive favours M; fig:pairedevidence)\n"
    );
    let _ = writeln!(
        md,
        "| Setting | Method | Seed | Block AttnRes | Method | Reduction | Perplexity ratio exp(−g) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for p in pairs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.4} | {:.4} | {:+.4} | {:.4} |",
            p.setting,
            method_label(&p.method),
            p.seed,
            p.baseline_loss,
            p.method_loss,
            p.reduction(),
            (-p.reduction()).exp()
        );
    }
    let mut groups: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for p in pairs {
        groups
            .entry((p.setting.clone(), p.method.clone()))
            .or_default()
            .push(p.reduction());
    }
    let _ = writeln!(
        md,
        "\n| Setting | Method | Pairs | Mean reduction | Min | Max | Pairs favouring M |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for ((setting, method), values) in &groups {
        let (mean, _) = mean_sd(values);
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let positive = values.iter().filter(|v| **v > 0.0).count();
        let _ = writeln!(
            md,
            "| {setting} | {} | {} | {mean:+.4} | {min:+.4} | {max:+.4} | {positive} of {} |",
            method_label(method),
            values.len(),
            values.len()
        );
    }
    let _ = writeln!(md);
}

/// Appends the time-to-target table.
pub fn write_time_to_target(md: &mut String, finished: &[Finished]) {
    let _ = writeln!(
        md,
        "## Time to the baseline's best loss (tab:timetotarget, eq:breakeven)\n"
    );
    let _ = writeln!(
        md,
        "Target: the same-seed Block AttnRes best loss within its budget. HAARES step: first \
         crossing on the validation grid. Times use each run's measured training throughput \
         (validation excluded); when a sweep trains several runs at once they share the CPU, so \
         use `haares-bench` for cost ratios.\n"
    );
    let _ = writeln!(
        md,
        "| Setting | Seed | Target | First HAARES step | HAARES loss | Time Block → HAARES | Time saved | v_H / v_B (break-even K_H / K_B) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for base in finished.iter().filter(|f| f.method == BASELINE) {
        let Some(haares) = finished
            .iter()
            .find(|f| f.method == "haares" && f.setting == base.setting && f.seed == base.seed)
        else {
            continue;
        };
        let t = time_to_target(&base.summary, &haares.summary);
        let (step, loss, times, saved) = match (t.first, t.method_seconds) {
            (Some((step, loss)), Some(seconds)) => (
                step.to_string(),
                format!("{loss:.4}"),
                format!("{} → {}", duration(t.baseline_seconds), duration(seconds)),
                format!("{:.1}%", 100.0 * (1.0 - seconds / t.baseline_seconds)),
            ),
            _ => (
                "not reached".into(),
                "–".into(),
                format!("{} → –", duration(t.baseline_seconds)),
                "–".into(),
            ),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.4} | {step} | {loss} | {times} | {saved} | {:.3} (≤ {:.0} of {} steps) |",
            base.setting,
            base.seed,
            t.target,
            t.break_even_ratio,
            t.break_even_ratio * base.summary.steps as f64,
            base.summary.steps
        );
    }
    let _ = writeln!(md);
}

/// A duration for a table: seconds below two minutes, minutes below two hours, then hours.
pub fn duration(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{seconds:.1} s")
    } else if seconds < 7200.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{:.2} h", seconds / 3600.0)
    }
}

/// `paired_results.csv`: one row per pair, with the paper's losses and reduction of the same
/// setting, method and seed where it prints them (empty fields where not).
pub fn paired_csv(pairs: &[Pair], paper: Option<&PaperSide>) -> String {
    let mut csv = String::from(
        "setting,seed,method,block_attnres_loss,method_loss,reduction,\
         paper_block_attnres_loss,paper_method_loss,paper_reduction\n",
    );
    for p in pairs {
        let loss = |method: &str| {
            paper
                .and_then(|side| side.seed_cell(&p.setting, method, p.seed))
                .and_then(|(_, c)| c.loss)
        };
        let reduction = paper.and_then(|side| {
            side.reductions(&p.setting, &p.method, BASELINE)
                .reductions
                .iter()
                .find(|(seed, _)| *seed == p.seed)
                .map(|(_, g)| *g)
        });
        let field = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
        let _ = writeln!(
            csv,
            "{},{},{},{:.6},{:.6},{:.6},{},{},{}",
            p.setting,
            p.seed,
            p.method,
            p.baseline_loss,
            p.method_loss,
            p.reduction(),
            field(loss(BASELINE)),
            field(loss(&p.method)),
            field(reduction)
        );
    }
    csv
}
