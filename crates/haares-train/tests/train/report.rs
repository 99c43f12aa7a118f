//! The report from a fixture of finished runs holding the paper's own per-seed endpoints
//! (tab:201m, tab:timetotarget): the tables must reproduce the paper's summary numbers.

use std::path::Path;

use haares_train::RunConfig;
use haares_train::report::write_report;
use haares_train::study::{Overrides, PlannedRun, parse_study};

const STUDY: &str = r#"
title = "Paired seeds fixture"
paper_table = "tab:201m"
description = "The paper's 201M endpoints."
default_preset = "paper"

[grid]
method = ["block-attnres", "haares"]
model_seed = [42, 123, 2026]

[presets.paper]
[presets.paper.run]
steps = 30000
"#;

/// The paper's validation endpoints (tab:201m) and HAARES first crossings (tab:timetotarget).
fn curve(method: &str, seed: u64) -> Vec<(usize, f64)> {
    let (best, crossing) = match (method, seed) {
        ("block-attnres", 42) => (1.7995, None),
        ("block-attnres", 123) => (1.7963, None),
        ("block-attnres", 2026) => (1.8213, None),
        ("haares", 42) => (1.7827, Some((24_000, 1.7961))),
        ("haares", 123) => (1.7641, Some((20_000, 1.7835))),
        ("haares", 2026) => (1.7764, Some((14_000, 1.8131))),
        _ => unreachable!(),
    };
    let mut curve: Vec<(usize, f64)> = (1..=15)
        .map(|k| (2_000 * k, best + 0.002 * (15 - k) as f64 + 0.1))
        .collect();
    if let Some((step, loss)) = crossing {
        for point in curve.iter_mut() {
            if point.0 >= step {
                point.1 = loss;
            }
        }
    }
    curve.last_mut().unwrap().1 = best;
    curve
}

fn finish(run: &PlannedRun, dir: &Path) {
    let curve = curve(&run.config.method, run.config.model_seed);
    let device = format!("GPU {}", run.config.model_seed % 2);
    crate::common::write_finished_summary(run, dir, curve, vec![device]);
}

#[test]
fn the_report_reproduces_the_papers_paired_seed_tables() {
    let dir = tempfile::tempdir().unwrap();
    let study = parse_study("seeds", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    assert_eq!(
        runs[0].config,
        RunConfig {
            steps: 30_000,
            method: "block-attnres".into(),
            ..RunConfig::default()
        }
    );
    for run in &runs {
        finish(run, dir.path());
    }
    let report = std::fs::read_to_string(write_report(&study, &runs, dir.path()).unwrap()).unwrap();

    // tab:201m: means, sample SDs and the seed cells with perplexities.
    assert!(
        report.contains(
            "| Block AttnRes | 1.7995 / 6.05 | 1.7963 / 6.03 | 1.8213 / 6.18 | 1.8057 ± 0.0136 |"
        ),
        "{report}"
    );
    assert!(
        report.contains(
            "| HAARES | 1.7827 / 5.95 | 1.7641 / 5.84 | 1.7764 / 5.91 | 1.7744 ± 0.0095 |"
        ),
        "{report}"
    );
    // Mean of the per-seed perplexities: 6.085 (the paper's 6.09 averages the rounded 6.05, 6.03,
    // 6.18).
    assert!(
        report.contains("| all | 1.8057 / 6.08 | **1.7744 / 5.90** | -0.0313 |"),
        "{report}"
    );
    // Paired reductions 0.0168, 0.0322, 0.0449 (tab:pairdiffs).
    for (seed, g) in [(42, "+0.0168"), (123, "+0.0322"), (2026, "+0.0449")] {
        assert!(
            report.contains(&format!("| all | HAARES | {seed} |")),
            "{report}"
        );
        assert!(report.contains(g), "reduction {g} of seed {seed}: {report}");
    }
    assert!(
        report.contains("| all | HAARES | 3 | +0.0313 | +0.0168 | +0.0449 | 3 of 3 |"),
        "{report}"
    );
    // tab:timetotarget: 4.02 h → 3.90 / 3.25 / 2.28 h; saved 2.9% / 19.0% / 43.3%; eq:breakeven
    // 14/17.
    for (step, loss, time, saved) in [
        (24_000, "1.7961", "4.02 h → 3.90 h", "2.9%"),
        (20_000, "1.7835", "4.02 h → 3.25 h", "19.0%"),
        (14_000, "1.8131", "4.02 h → 2.28 h", "43.3%"),
    ] {
        let row =
            format!("| {step} | {loss} | {time} | {saved} | 0.824 (≤ 24706 of 30000 steps) |");
        assert!(report.contains(&row), "missing `{row}` in {report}");
    }

    // Each run's device, from its summary (model seeds 42, 123, 2026 → GPU 0, 1, 0).
    for (run, device) in [("s42-haares", "GPU 0"), ("s123-haares", "GPU 1")] {
        let row = format!("| {run} | fixture | {device} | ");
        assert!(report.contains(&row), "missing `{row}` in {report}");
    }

    let csv = std::fs::read_to_string(dir.path().join("paired_results.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    // This fixture names no table of the paper's values: its columns are empty.
    assert_eq!(
        rows[0],
        "setting,seed,method,block_attnres_loss,method_loss,reduction,\
         paper_block_attnres_loss,paper_method_loss,paper_reduction"
    );
    assert_eq!(rows[1], "all,42,haares,1.799500,1.782700,0.016800,,,");
    assert_eq!(rows.len(), 4);

    for figure in ["figures/val-curves-all", "figures/paired-effect"] {
        let svg = std::fs::read_to_string(dir.path().join(format!("{figure}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<text"),
            "{figure}.svg has drawn text"
        );
        let png = std::fs::read(dir.path().join(format!("{figure}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{figure}.png is a PNG");
        assert!(report.contains(&format!("]({figure}.svg)")));
    }
}

#[test]
fn unfinished_runs_are_left_out_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let study = parse_study("seeds", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    for run in runs.iter().filter(|r| r.config.model_seed != 2026) {
        finish(run, dir.path());
    }
    let report = std::fs::read_to_string(write_report(&study, &runs, dir.path()).unwrap()).unwrap();
    assert!(
        report.contains("Runs finished: 4 of 6; seeds that ran: 42, 123."),
        "{report}"
    );
    assert!(
        report
            .contains("Not finished (left out of every table): s2026-block-attnres, s2026-haares."),
        "{report}"
    );
    assert!(
        report.contains("| Block AttnRes | 1.7995 / 6.05 | 1.7963 / 6.03 | 1.7979 ± 0.0023 |"),
        "{report}"
    );
}

#[test]
fn a_report_without_finished_runs_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let study = parse_study("seeds", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    let error = write_report(&study, &runs, dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no finished runs") && error.contains("sweep seeds"),
        "{error}"
    );
}
