//! The report beside the paper (`report::verdict`, `report::paper_side`, `report::evidence`):
//! fake sweeps of the built-in `seeds` study at the paper's settings whose losses reproduce the
//! paper's direction or reverse it, the same study at its CPU scale, a few-step CPU sweep of the
//! depth study through the binary, and the statistics the verdict uses.

use std::path::Path;
use std::process::Command;

use haares_train::report::evidence::{Evidence, t_quantile_975};
use haares_train::report::write_report;
use haares_train::study::{Overrides, PlannedRun, Study, load_study};

/// tab:201m's per-seed best losses, and tab:timetotarget's first HAARES crossings.
fn paper_loss(method: &str, seed: u64) -> f64 {
    match (method, seed) {
        ("block-attnres", 42) => 1.7995,
        ("block-attnres", 123) => 1.7963,
        ("block-attnres", 2026) => 1.8213,
        ("haares", 42) => 1.7827,
        ("haares", 123) => 1.7641,
        ("haares", 2026) => 1.7764,
        _ => unreachable!(),
    }
}

fn paper_crossing(seed: u64) -> usize {
    match seed {
        42 => 24_000,
        123 => 20_000,
        _ => 14_000,
    }
}

/// Writes a finished run whose best loss is `best`, reached at the last of 15 grid points; a
/// HAARES run that beats its target first reaches it at `crossing`.
fn finish(run: &PlannedRun, dir: &Path, best: f64, target: Option<(f64, usize)>) {
    let grid = run.config.steps / 15;
    let mut curve: Vec<(usize, f64)> = (1..=15)
        .map(|k| (grid * k, best + 0.5 + 0.01 * (15 - k) as f64))
        .collect();
    if let Some((target, crossing)) = target.filter(|(target, _)| *target > best) {
        for point in curve.iter_mut().filter(|p| p.0 >= crossing) {
            point.1 = target - 1e-4;
        }
    }
    curve.last_mut().unwrap().1 = best;
    crate::common::write_finished_summary(run, dir, curve, Vec::new());
}

/// The `seeds` study under `preset`, every run finished with `loss(method, seed)`; the report,
/// the CSV and the paired-effect SVG.
fn report(preset: &str, loss: impl Fn(&str, u64) -> f64) -> (String, String, String) {
    report_with(preset, &Overrides::default(), loss)
}

/// [`report`] with the runs changed by `overrides`.
fn report_with(
    preset: &str,
    overrides: &Overrides,
    loss: impl Fn(&str, u64) -> f64,
) -> (String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let study: Study = load_study("seeds").unwrap();
    let runs = study.plan(Some(preset), overrides).unwrap();
    for run in &runs {
        let (method, seed) = (run.config.method.as_str(), run.config.model_seed);
        let target = (method == "haares").then(|| {
            let crossing = paper_crossing(seed) * run.config.steps / 30_000;
            (loss("block-attnres", seed), crossing)
        });
        finish(run, dir.path(), loss(method, seed), target);
    }
    let path = write_report(&study, &runs, dir.path()).unwrap();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    (
        read(&path),
        read(&dir.path().join("paired_results.csv")),
        read(&dir.path().join("figures/paired-effect.svg")),
    )
}

/// 95% paired t interval of three reductions, computed here from its definition.
fn interval(g: [f64; 3]) -> (f64, f64) {
    let mean = g.iter().sum::<f64>() / 3.0;
    let sd = (g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
    let half = 4.303 * sd / 3f64.sqrt();
    (mean - half, mean + half)
}

#[test]
fn a_sweep_that_reproduces_the_paper_says_so_beside_its_values() {
    // HAARES 0.0010 worse than the paper on every seed: reductions 0.0158, 0.0312, 0.0439.
    let (md, csv, svg) = report("paper", |m, s| {
        paper_loss(m, s) + if m == "haares" { 0.0010 } else { 0.0 }
    });
    assert!(
        md.contains("## Against the paper (tab:201m, tab:timetotarget, tab:pairdiffs)"),
        "{md}"
    );
    assert!(md.contains("**At the paper's settings**"), "{md}");
    assert!(
        md.contains("Same direction as the paper in 1 of 1 comparisons.\n"),
        "{md}"
    );
    let (low, high) = interval([0.0158, 0.0312, 0.0439]);
    let line = format!(
        "- **all · HAARES vs Block AttnRes**: paper +0.0313 (HAARES lower, 3 of 3 seeds favour \
         HAARES); here +0.0303 (HAARES lower, 3 of 3 pairs favour HAARES). Same direction. Sign \
         test p = 0.250 (two-sided); 95% paired t interval of the reduction [{low:+.4}, \
         {high:+.4}], the paper's mean inside it."
    );
    assert!(md.contains(&line), "missing\n{line}\nin\n{md}");
    // Our losses beside the paper's, per seed and for the means.
    assert!(
        md.contains("| all | HAARES | 42 | 1.7837 / 5.95 | 1.7827 / 5.95 | +0.0010 | tab:201m |"),
        "{md}"
    );
    assert!(
        md.contains(
            "| all | Block AttnRes | mean (3 here) | 1.8057 / 6.08 | 1.8057 | +0.0000 | tab:201m |"
        ),
        "{md}"
    );
    // Per-seed reductions beside tab:pairdiffs's.
    assert!(
        md.contains("| all | HAARES vs Block AttnRes | 2026 | +0.0439 | +0.0449 |"),
        "{md}"
    );
    assert!(
        md.contains("| all | HAARES vs Block AttnRes | mean | +0.0303 | +0.0313 |"),
        "{md}"
    );
    // Time to target beside tab:timetotarget's.
    assert!(
        md.contains("| all | 123 | 1.7963 | 1.7963 | step 20000 of 30000, 19.0% saved | step 20000 of 30000, 19.0% saved |"),
        "{md}"
    );
    assert!(csv.starts_with(
        "setting,seed,method,block_attnres_loss,method_loss,reduction,paper_block_attnres_loss,paper_method_loss,paper_reduction\n"
    ));
    assert!(
        csv.contains("all,42,haares,1.799500,1.783700,0.015800,1.7995,1.7827,0.0168\n"),
        "{csv}"
    );
    // The paper's reductions drawn hollow and grey beside ours: three seeds' circles.
    assert!(svg.matches(r##"stroke="#787878""##).count() >= 3, "{svg}");
}

#[test]
fn a_sweep_that_reverses_the_paper_says_so() {
    let (md, csv, _) = report("paper", |m, s| {
        let other = if m == "haares" {
            "block-attnres"
        } else {
            "haares"
        };
        paper_loss(other, s)
    });
    assert!(
        md.contains(
            "Same direction as the paper in 0 of 1 comparisons; opposite in all · HAARES vs Block AttnRes.\n"
        ),
        "{md}"
    );
    let (low, high) = interval([-0.0168, -0.0322, -0.0449]);
    assert!(
        md.contains(&format!(
            "here -0.0313 (Block AttnRes lower, 0 of 3 pairs favour HAARES). Opposite direction. \
             Sign test p = 0.250 (two-sided); 95% paired t interval of the reduction [{low:+.4}, \
             {high:+.4}], the paper's mean outside it."
        )),
        "{md}"
    );
    assert!(
        csv.contains("all,42,haares,1.782700,1.799500,-0.016800,1.7995,1.7827,0.0168\n"),
        "{csv}"
    );
}

#[test]
fn a_sweep_at_another_scale_names_what_differs_and_compares_directions_only() {
    let (md, _, _) = report("cpu", |m, s| paper_loss(m, s) + 0.5);
    assert!(
        md.contains("**Not at the paper's scale.** These runs differ from the paper's in: "),
        "{md}"
    );
    for field in [
        "dataset sotu (paper: openwebtext)",
        "d_model 64 (paper: 512)",
        "steps 100 (paper: 30000)",
        "seq_len 64 (paper: 512)",
        "optimizer.lr 0.001 (paper: 0.0003)",
    ] {
        assert!(md.contains(field), "missing `{field}` in\n{md}");
    }
    assert!(
        !md.contains("seeds 42 (paper"),
        "the CPU preset runs the paper's three seeds: {md}"
    );
    assert!(
        md.contains("not held against the paper's mean: the scale differs."),
        "{md}"
    );
    assert!(
        !md.contains("inside it") && !md.contains("outside it"),
        "{md}"
    );
}

/// The depth study through the binary: two runs of a few steps at 12 layers, width 32.
#[test]
fn a_few_step_cpu_sweep_reports_one_pair_against_the_paper() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let output = Command::new(env!("CARGO_BIN_EXE_haares-train"))
        .args([
            "sweep",
            "depth",
            "--layers",
            "12",
            "--methods",
            "block-attnres,haares",
        ])
        .args([
            "--steps",
            "2",
            "--runs-dir",
            runs.to_str().unwrap(),
            "--jobs",
            "1",
        ])
        .args([
            "--set",
            "d_model=32",
            "--set",
            "d_ff=64",
            "--set",
            "seq_len=16",
        ])
        .args([
            "--set",
            "batch_size=2",
            "--set",
            "val_chunks=2",
            "--set",
            "eval_every=2",
        ])
        .args(["--backend", "ndarray", "--offline", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let md = std::fs::read_to_string(runs.join("depth").join("report.md")).unwrap();
    assert!(
        md.contains("## Against the paper (tab:depthsweep, tab:201m, tab:timetotarget)"),
        "{md}"
    );
    for field in [
        "steps 2 (paper: 30000)",
        "d_model 32 (paper: 512)",
        "seeds 42 (paper: 42, 123, 2026)",
    ] {
        assert!(md.contains(field), "missing `{field}` in\n{md}");
    }
    // tab:depthsweep's 12-layer means: Block AttnRes 1.8527, HAARES 1.8449 (Δ −0.0078).
    assert!(
        md.contains("- **12L · HAARES vs Block AttnRes**: paper +0.0078 (HAARES lower); here "),
        "{md}"
    );
    assert!(
        md.contains("One pair: the direction of one seed, no spread."),
        "{md}"
    );
    assert!(
        md.contains("The paper prints means only here, so its seeds cannot be paired."),
        "{md}"
    );
}

/// Student's t density with `df` degrees of freedom.
fn t_density(t: f64, df: usize) -> f64 {
    // Γ(k / 2) for a positive integer k, from Γ(1/2) = √π and Γ(1) = 1.
    fn gamma_half(k: usize) -> f64 {
        let mut x = if k.is_multiple_of(2) {
            1.0
        } else {
            std::f64::consts::PI.sqrt()
        };
        let mut arg = if k.is_multiple_of(2) { 1.0 } else { 0.5 };
        while arg < k as f64 / 2.0 {
            x *= arg;
            arg += 1.0;
        }
        x
    }
    let v = df as f64;
    // Γ((ν+1)/2) / Γ(ν/2) as a ratio of large numbers for ν up to 60 stays within f64.
    gamma_half(df + 1) / (gamma_half(df) * (v * std::f64::consts::PI).sqrt())
        * (1.0 + t * t / v).powf(-(v + 1.0) / 2.0)
}

#[test]
fn the_t_quantiles_leave_two_and_a_half_percent_in_each_tail() {
    for df in (1..=40).chain([60, 120]) {
        let q = t_quantile_975(df);
        // P(T ≤ q) = ½ + ∫₀^q f, by Simpson's rule on 20,000 intervals.
        let n = 20_000;
        let h = q / n as f64;
        let sum: f64 = (0..=n)
            .map(|i| {
                let weight = if i == 0 || i == n {
                    1.0
                } else if i % 2 == 1 {
                    4.0
                } else {
                    2.0
                };
                weight * t_density(i as f64 * h, df)
            })
            .sum();
        let cdf = 0.5 + sum * h / 3.0;
        assert!((cdf - 0.975).abs() < 1e-4, "df {df}: P(T ≤ {q}) = {cdf}");
    }
}

#[test]
fn one_pair_has_no_interval_and_ties_no_direction() {
    let one = Evidence {
        reductions: vec![(42, 0.01)],
    };
    assert_eq!(one.t_interval(), None);
    assert_eq!(one.favouring(), 1);
    let tied = Evidence {
        reductions: vec![(42, 0.0), (123, 0.0), (2026, 0.0)],
    };
    assert_eq!(tied.sign_test_p(), None);
    assert_eq!(tied.favouring(), 0);
}

/// Every built-in study at its `paper` preset, each run finished with the paper's own loss for it
/// (the seed's where the paper prints seeds, else its mean): every report compares at the paper's
/// settings, finds comparisons, and none in the opposite direction.
#[test]
fn every_study_at_the_papers_losses_agrees_with_the_paper() {
    use haares_train::report::paper_side::PaperSide;
    for (name, _) in haares_train::study::BUILTIN_STUDIES {
        let dir = tempfile::tempdir().unwrap();
        let study = load_study(name).unwrap();
        let runs = study.plan(Some("paper"), &Overrides::default()).unwrap();
        let side = PaperSide::new(&study, &runs, &[]).unwrap().unwrap();
        for run in &runs {
            let setting = run.setting_label();
            let (method, seed) = (run.config.method.as_str(), run.config.model_seed);
            let loss = side
                .seed_cell(&setting, method, seed)
                .or_else(|| side.mean_cell(&setting, method))
                .and_then(|(_, cell)| cell.loss)
                .unwrap_or_else(|| panic!("{name}: the paper has no loss for {} ", run.name));
            finish(run, dir.path(), loss, None);
        }
        let md = std::fs::read_to_string(write_report(&study, &runs, dir.path()).unwrap()).unwrap();
        let what = format!("study `{name}`:\n{md}");
        assert!(md.contains("**At the paper's settings**"), "{what}");
        let summary = md
            .lines()
            .find(|l| l.starts_with("Same direction as the paper in "));
        eprintln!(
            "{name}: {}",
            summary.unwrap_or_else(|| panic!("no verdict: {what}"))
        );
        assert!(!md.contains("opposite in"), "{what}");
        assert!(!md.contains("No paired comparison here"), "{what}");
        assert!(!md.contains("The paper has no values at"), "{what}");
    }
}

/// A study file of the user's own whose tables are not beside it: the report is written all the
/// same, and says why it has no comparison.
#[test]
fn a_study_without_its_tables_still_gets_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let (_, text) = haares_train::study::BUILTIN_STUDIES
        .iter()
        .find(|(n, _)| *n == "seeds")
        .unwrap();
    let file = dir.path().join("mine.toml");
    std::fs::write(&file, text).unwrap();
    let study = load_study(file.to_str().unwrap()).unwrap();
    let runs = study.plan(Some("paper"), &Overrides::default()).unwrap();
    let out = dir.path().join("runs");
    for run in &runs {
        finish(
            run,
            &out,
            paper_loss(&run.config.method, run.config.model_seed),
            None,
        );
    }
    let md = std::fs::read_to_string(write_report(&study, &runs, &out).unwrap()).unwrap();
    assert!(
        md.contains("Not compared: the paper's values could not be read (")
            && md.contains("tab-201m.toml"),
        "{md}"
    );
    assert!(
        md.contains("## Paired reductions"),
        "the rest of the report is there: {md}"
    );
}

/// A field the study fixes, changed with `--set`: the paper preset's depth and block count are
/// compared like any other field, so N = 2 is not passed off as the paper's N = 4.
#[test]
fn a_block_count_set_over_the_papers_is_named() {
    let mut overrides = Overrides::default();
    overrides.set("blocks", toml::Value::Integer(2)).unwrap();
    let (md, _, _) = report_with("paper", &overrides, paper_loss);
    assert!(md.contains("**Not at the paper's scale.**"), "{md}");
    assert!(md.contains("blocks 2 (paper: 4)"), "{md}");
    assert!(
        !md.contains("inside it") && !md.contains("outside it"),
        "{md}"
    );
}
