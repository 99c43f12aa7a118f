//! The report's comparison with the paper: which scale the runs are at and a verdict computed
//! from our values and the paper's (which [`crate::report::paper_tables`] sets side by side): the direction of each difference here and in the paper, how many paired seeds
//! favour the method, and, from three pairs on, a sign test and a 95% paired t interval with the
//! paper's mean held against it (at the paper's scale only).

use std::fmt::Write as _;

use haares_core::method::method_label;

use crate::report::evidence::{Direction, Evidence};
use crate::report::paper_side::PaperSide;
use crate::report::results::{BASELINE, Finished, Pair, PaperMarks};

/// One paired comparison: a method against a baseline at one setting.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Our setting label.
    pub setting: String,
    /// The compared method.
    pub method: String,
    /// The baseline (Block AttnRes, or an ablation's control).
    pub baseline: String,
    /// Our per-seed reductions.
    pub ours: Evidence,
    /// The paper's per-seed reductions.
    pub paper: Evidence,
    /// The paper's mean reduction.
    pub paper_mean: f64,
}

impl Comparison {
    /// Whether our mean reduction points the paper's way (`None` when either is exactly 0).
    pub fn same_direction(&self) -> Option<bool> {
        let ours = Direction::of(self.ours.mean()?);
        let paper = Direction::of(self.paper_mean);
        (ours != Direction::Tie && paper != Direction::Tie).then_some(ours == paper)
    }
}

/// Every comparison the runs and the paper both have, in setting order: each method against
/// Block AttnRes, then the paper's other controls.
pub fn comparisons(
    side: &PaperSide,
    settings: &[String],
    finished: &[Finished],
) -> Vec<Comparison> {
    let mut out = Vec::new();
    for setting in settings {
        let mut keys: Vec<(String, String)> = Vec::new();
        for f in finished
            .iter()
            .filter(|f| &f.setting == setting && f.method != BASELINE)
        {
            let key = (f.method.clone(), BASELINE.to_string());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys.extend(side.other_baselines(setting));
        for (method, baseline) in keys {
            let ours = our_reductions(finished, setting, &method, &baseline);
            let Some(paper_mean) = side.mean_reduction(setting, &method, &baseline) else {
                continue;
            };
            if ours.reductions.is_empty() {
                continue;
            }
            out.push(Comparison {
                paper: side.reductions(setting, &method, &baseline),
                setting: setting.clone(),
                method,
                baseline,
                ours,
                paper_mean,
            });
        }
    }
    out
}

/// ℓ_baseline − ℓ_method of every seed at which both finished.
fn our_reductions(finished: &[Finished], setting: &str, method: &str, baseline: &str) -> Evidence {
    let loss = |m: &str, seed: u64| {
        finished
            .iter()
            .find(|f| f.setting == setting && f.method == m && f.seed == seed)
            .map(|f| f.summary.best_val_loss)
    };
    let mut seeds: Vec<u64> = finished.iter().map(|f| f.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    Evidence {
        reductions: seeds
            .into_iter()
            .filter_map(|s| Some((s, loss(baseline, s)? - loss(method, s)?)))
            .collect(),
    }
}

/// Whether the runs are at the paper's settings, and if not, where they differ.
pub fn write_scale(md: &mut String, side: &PaperSide) {
    if side.at_paper_scale() {
        let _ = writeln!(
            md,
            "**At the paper's settings**: every field that changes a result is the study's \
             `paper` preset's, so magnitudes as well as directions are compared.\n"
        );
    } else {
        let fields: Vec<String> = side
            .scale
            .iter()
            .map(|d| {
                let name = match d.field.as_str() {
                    "model_seed" => "seeds",
                    other => other,
                };
                format!(
                    "{name} {} (paper: {})",
                    d.ours.join(", "),
                    d.paper.join(", ")
                )
            })
            .collect();
        let _ = writeln!(
            md,
            "**Not at the paper's scale.** These runs differ from the paper's in: {}. Only the \
             direction of each difference is compared: runs this far from the paper's cannot show \
             whether its magnitudes reproduce, and an opposite direction here is not a failed \
             reproduction.\n",
            fields.join("; ")
        );
    }
    if !side.unmatched.is_empty() {
        let _ = writeln!(
            md,
            "The paper has no values at: {} (the study's `paper` preset has no such setting).\n",
            side.unmatched.join(", ")
        );
    }
}

/// The verdict, one line per comparison after a summary line.
pub fn write_verdict(md: &mut String, side: &PaperSide, comparisons: &[Comparison]) {
    let _ = writeln!(md, "### Verdict\n");
    if comparisons.is_empty() {
        let _ = writeln!(
            md,
            "No paired comparison here has a value in the paper to hold it against.\n"
        );
        return;
    }
    let decided: Vec<&Comparison> = comparisons
        .iter()
        .filter(|c| c.same_direction().is_some())
        .collect();
    let opposite: Vec<String> = decided
        .iter()
        .filter(|c| c.same_direction() == Some(false))
        .map(|c| name(c))
        .collect();
    let _ = write!(
        md,
        "Same direction as the paper in {} of {} comparisons",
        decided.len() - opposite.len(),
        comparisons.len()
    );
    let _ = match opposite.is_empty() {
        true => writeln!(md, ".\n"),
        false => writeln!(md, "; opposite in {}.\n", opposite.join(", ")),
    };
    for c in comparisons {
        let _ = writeln!(md, "- {}", verdict_line(c, side.at_paper_scale()));
    }
    let _ = writeln!(md);
}

/// `24L · HAARES vs Block AttnRes`.
fn name(c: &Comparison) -> String {
    format!(
        "{} · {} vs {}",
        c.setting,
        method_label(&c.method),
        method_label(&c.baseline)
    )
}

/// One comparison in words.
pub fn verdict_line(c: &Comparison, at_scale: bool) -> String {
    let method = method_label(&c.method);
    let favours = |g: f64| match Direction::of(g) {
        Direction::Favours => format!("{method} lower"),
        Direction::Against => format!("{} lower", method_label(&c.baseline)),
        Direction::Tie => "equal".into(),
    };
    let count = |e: &Evidence, what: &str| match e.reductions.len() {
        0 => String::new(),
        n => format!(", {} of {n} {what} favour {method}", e.favouring()),
    };
    let ours = c.ours.mean().unwrap_or(f64::NAN);
    let mut line = format!(
        "**{}**: paper {:+.4} ({}{}); here {:+.4} ({}{}). ",
        name(c),
        c.paper_mean,
        favours(c.paper_mean),
        count(&c.paper, "seeds"),
        ours,
        favours(ours),
        count(&c.ours, "pairs")
    );
    line.push_str(match c.same_direction() {
        Some(true) => "Same direction.",
        Some(false) => "Opposite direction.",
        None => "No direction to compare (a difference of exactly 0).",
    });
    let n = c.ours.reductions.len();
    if n >= 3 {
        let p = c
            .ours
            .sign_test_p()
            .map_or("–".into(), |p| format!("{p:.3}"));
        let (low, high) = c.ours.t_interval().expect("three pairs or more");
        let _ = write!(
            line,
            " Sign test p = {p} (two-sided); 95% paired t interval of the reduction \
             [{low:+.4}, {high:+.4}]"
        );
        if at_scale {
            let inside = (low..=high).contains(&c.paper_mean);
            let _ = write!(
                line,
                ", the paper's mean {} it.",
                if inside { "inside" } else { "outside" }
            );
        } else {
            line.push_str(", not held against the paper's mean: the scale differs.");
        }
    } else if n == 1 {
        line.push_str(" One pair: the direction of one seed, no spread.");
    } else {
        line.push_str(" Two pairs: directions only, too few for an interval.");
    }
    if c.paper.reductions.is_empty() {
        line.push_str(" The paper prints means only here, so its seeds cannot be paired.");
    }
    line
}

/// The paper's reductions of each (setting, method) against Block AttnRes, for the figure.
pub fn paper_marks(side: &PaperSide, pairs: &[Pair]) -> Vec<PaperMarks> {
    let mut out: Vec<PaperMarks> = Vec::new();
    for p in pairs {
        if out
            .iter()
            .any(|m| m.setting == p.setting && m.method == p.method)
        {
            continue;
        }
        let paper = side.reductions(&p.setting, &p.method, BASELINE);
        let mean = side.mean_reduction(&p.setting, &p.method, BASELINE);
        if mean.is_some() {
            out.push(PaperMarks {
                setting: p.setting.clone(),
                method: p.method.clone(),
                seeds: paper.reductions.iter().map(|(_, g)| *g).collect(),
                mean,
            });
        }
    }
    out
}
