//! The report's tables beside the paper's ([`crate::report::verdict`] writes the section): best
//! losses and perplexities per seed and mean, per-seed reductions, and HAARES's time to the
//! baseline's best loss beside tab:timetotarget.

use std::fmt::Write as _;

use haares_core::method::method_label;

use crate::report::evidence::Evidence;
use crate::report::loss_ppl;
use crate::report::paper_side::PaperSide;
use crate::report::results::{BASELINE, Finished, mean_sd, time_to_target};
use crate::report::verdict::Comparison;
use crate::study::paper::PaperCell;

/// Our best losses beside the paper's, per seed and for the mean.
pub fn write_losses(md: &mut String, side: &PaperSide, settings: &[String], finished: &[Finished]) {
    let _ = writeln!(
        md,
        "### Best validation loss / perplexity beside the paper's\n\n| Setting | Method | Seed | \
         Here | Paper | Here − paper | Paper's table |\n|---|---|---|---|---|---|---|"
    );
    for setting in settings {
        let mut methods: Vec<&str> = Vec::new();
        for f in finished.iter().filter(|f| &f.setting == setting) {
            if !methods.contains(&f.method.as_str()) {
                methods.push(&f.method);
            }
        }
        for method in methods {
            let runs: Vec<&Finished> = finished
                .iter()
                .filter(|f| &f.setting == setting && f.method == method)
                .collect();
            for run in &runs {
                if let Some(paper) = side.seed_cell(setting, method, run.seed) {
                    let ours = run.summary.best_val_loss;
                    let row = (setting.as_str(), method, run.seed.to_string());
                    write_loss_row(md, row, &loss_ppl(ours), ours, paper);
                }
            }
            if let Some(paper) = side.mean_cell(setting, method) {
                let losses: Vec<f64> = runs.iter().map(|f| f.summary.best_val_loss).collect();
                let (mean, _) = mean_sd(&losses);
                let perplexity = mean_sd(&losses.iter().map(|l| l.exp()).collect::<Vec<_>>()).0;
                let row = (
                    setting.as_str(),
                    method,
                    format!("mean ({} here)", losses.len()),
                );
                write_loss_row(
                    md,
                    row,
                    &format!("{mean:.4} / {perplexity:.2}"),
                    mean,
                    paper,
                );
            }
        }
    }
    let _ = writeln!(md);
}

/// One row: `(setting, method, seed label)`, our loss / perplexity as printed and our loss, and
/// the paper's cell with its table's label.
fn write_loss_row(
    md: &mut String,
    (setting, method, seed): (&str, &str, String),
    here: &str,
    ours: f64,
    (table, cell): (&str, &PaperCell),
) {
    let paper = cell.loss.expect("a loss cell");
    let perplexity = cell.perplexity.map_or(String::new(), |p| {
        format!(" / {p:.2}{}", if cell.corrected { "†" } else { "" })
    });
    // Rounded to the printed digits first, so that a difference of zero is not printed as −0.
    let difference = ((ours - paper) * 1e4).round() / 1e4 + 0.0;
    let _ = writeln!(
        md,
        "| {setting} | {} | {seed} | {here} | {paper:.4}{perplexity} | {difference:+.4} | {table} |",
        method_label(method)
    );
}

/// Per-seed reductions here and in the paper.
pub fn write_reductions(md: &mut String, comparisons: &[Comparison]) {
    if comparisons.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "### Paired reductions ℓ_baseline − ℓ_M beside the paper's (positive favours M)\n\n\
         | Setting | Method vs baseline | Seed | Here | Paper |\n|---|---|---|---|---|"
    );
    for c in comparisons {
        let mut seeds: Vec<u64> = c.ours.reductions.iter().map(|(s, _)| *s).collect();
        seeds.extend(c.paper.reductions.iter().map(|(s, _)| *s));
        seeds.sort_unstable();
        seeds.dedup();
        let value = |e: &Evidence, seed: u64| {
            e.reductions
                .iter()
                .find(|(s, _)| *s == seed)
                .map_or("–".into(), |(_, g)| format!("{g:+.4}"))
        };
        let label = format!(
            "{} vs {}",
            method_label(&c.method),
            method_label(&c.baseline)
        );
        for seed in seeds {
            let _ = writeln!(
                md,
                "| {} | {label} | {seed} | {} | {} |",
                c.setting,
                value(&c.ours, seed),
                value(&c.paper, seed)
            );
        }
        let _ = writeln!(
            md,
            "| {} | {label} | mean | {:+.4} | {:+.4} |",
            c.setting,
            c.ours.mean().unwrap_or(f64::NAN),
            c.paper_mean
        );
    }
    let _ = writeln!(md);
}

/// HAARES's first crossing of the same-seed Block AttnRes best loss beside tab:timetotarget's.
pub fn write_time_to_target(md: &mut String, side: &PaperSide, finished: &[Finished]) {
    let mut rows = String::new();
    for base in finished.iter().filter(|f| f.method == BASELINE) {
        let (Some(paper), Some(haares)) = (
            side.time_to_target(&base.setting, Some(base.seed)),
            finished
                .iter()
                .find(|f| f.method == "haares" && f.setting == base.setting && f.seed == base.seed),
        ) else {
            continue;
        };
        let t = time_to_target(&base.summary, &haares.summary);
        let here = match (t.first, t.method_seconds) {
            (Some((step, _)), Some(seconds)) => format!(
                "step {step} of {}, {:.1}% saved",
                base.summary.steps,
                100.0 * (1.0 - seconds / t.baseline_seconds)
            ),
            _ => format!("not reached in {} steps", base.summary.steps),
        };
        let budget = side.paper_config(&base.setting).map_or(0, |c| c.steps);
        let _ = writeln!(
            rows,
            "| {} | {} | {:.4} | {:.4} | {here} | step {} of {budget}, {:.1}% saved |",
            base.setting,
            base.seed,
            t.target,
            paper.target.unwrap_or(f64::NAN),
            paper.step.unwrap_or(0),
            100.0 * paper.time_saved.unwrap_or(f64::NAN)
        );
    }
    if !rows.is_empty() {
        let _ = writeln!(
            md,
            "### Time to the baseline's best loss beside tab:timetotarget\n\n| Setting | Seed | \
             Target here | Paper's target | HAARES here | HAARES in the paper |\n|---|---|---|---|---|---|\n{rows}"
        );
    }
}
