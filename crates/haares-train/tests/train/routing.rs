//! Routing telemetry through training (`routing.jsonl`), the report's routing figures, and
//! `inspect` on a run directory and on a bare model file.

use std::path::Path;

use haares_train::backend::BackendJob;
use haares_train::inspect::{InspectJob, Inspected};
use haares_train::report::write_report;
use haares_train::run::learner::{Outcome, routing_path};
use haares_train::run::metrics::{RoutingLine, read_routing};
use haares_train::study::sweep::SweepJob;
use haares_train::study::{Overrides, parse_study};

use crate::common::{B, paths, run, sotu, tiny_config, train_to_end};
use crate::sweep::STUDY;

fn assert_close(a: &[RoutingLine], b: &[RoutingLine]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (x.step, x.routing.sites.len()),
            (y.step, y.routing.sites.len())
        );
        for (p, q) in x.routing.sites.iter().zip(&y.routing.sites) {
            assert_eq!(p.slots, q.slots);
            for (u, v) in p.weights.iter().zip(&q.weights) {
                assert!((u - v).abs() < 1e-4, "step {}: {u} vs {v}", x.step);
            }
        }
    }
}

#[test]
fn every_validation_pass_logs_routing_and_a_resumed_run_logs_the_same_lines() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let mut config = tiny_config("haares");
    config.steps = 6;
    config.eval_every = 2;
    config.checkpoint_every = 4;
    config.log_every = 2;
    let straight = dir.path().join("straight");
    let summary = train_to_end(&config, &data, &straight);
    let lines = read_routing(&routing_path(&straight)).unwrap();
    // One line per validation pass, with the pass's loss.
    let steps: Vec<(usize, f64)> = lines.iter().map(|l| (l.step, l.val_loss)).collect();
    assert_eq!(steps, summary.val_curve);
    // 2 layers in 2 blocks: 4 events and the final readout; 4 validation chunks of 16 tokens.
    let first = &lines[0].routing;
    assert_eq!(first.sites.len(), 5);
    assert_eq!(first.tokens, 64.0);
    for site in &first.sites {
        let total: f64 = site.weights.iter().sum();
        assert!((total - 1.0).abs() < 1e-5, "{site:?}");
        assert!(site.entropy >= 0.0 && site.entropy <= (site.slots.len() as f64).ln() + 1e-6);
    }
    assert!(first.sites[1].detail_bias.is_some() && first.sites[4].detail_bias.is_none());

    // Killed after step 5 (checkpoint at 4, routing logged at 2 and 4), then resumed.
    let killed = dir.path().join("killed");
    assert_eq!(
        run(&config, &data, &killed, Some(5)).unwrap(),
        Outcome::Stopped { step: 5 }
    );
    assert_eq!(read_routing(&routing_path(&killed)).unwrap().len(), 2);
    train_to_end(&config, &data, &killed);
    assert_close(&read_routing(&routing_path(&killed)).unwrap(), &lines);
}

#[test]
fn unrouted_methods_log_no_routing_and_block_attnres_logs_no_detail() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let standard = dir.path().join("standard");
    train_to_end(&tiny_config("standard"), &data, &standard);
    assert!(!routing_path(&standard).exists());
    let block = dir.path().join("block");
    train_to_end(&tiny_config("block-attnres"), &data, &block);
    let lines = read_routing(&routing_path(&block)).unwrap();
    assert!(!lines.is_empty());
    assert!(lines.iter().all(|l| l.routing.mean_detail_mass().is_none()));
}

#[test]
fn a_finished_sweep_reports_its_routing_figures() {
    let dir = tempfile::tempdir().unwrap();
    let study = parse_study("fixture", STUDY).unwrap();
    let runs = study.plan(None, &Overrides::default()).unwrap();
    let study_dir = dir.path().join("fixture");
    SweepJob {
        runs: runs.clone(),
        study_dir: study_dir.clone(),
        paths: paths(dir.path()),
        progress: false,
        stop_after: None,
        jobs: 2,
        devices: Vec::new(),
        runs_per_device: None,
    }
    .run::<B>(Default::default(), "ndarray".parse().unwrap())
    .unwrap();
    let report = std::fs::read_to_string(write_report(&study, &runs, &study_dir).unwrap()).unwrap();
    for figure in ["routing-2l", "routing-4l", "detail-mass"] {
        let svg = std::fs::read_to_string(study_dir.join(format!("figures/{figure}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<rect"), "{figure}");
        let png = std::fs::read(study_dir.join(format!("figures/{figure}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{figure}.png is a PNG");
        assert!(
            report.contains(&format!("](figures/{figure}.svg)")),
            "{report}"
        );
    }
    // Both panels and the paper's notation on the heatmap's axes.
    let heatmap = std::fs::read_to_string(study_dir.join("figures/routing-4l.svg")).unwrap();
    for text in [
        "Block AttnRes",
        "HAARES",
        "C₁",
        "D̂₁",
        "source s",
        "read site ℓ",
    ] {
        assert!(heatmap.contains(text), "`{text}` missing from the heatmap");
    }
    assert!(!report.contains("no routing statistics"), "{report}");

    // A run trained before telemetry (its log removed) is named, not silently dropped.
    std::fs::remove_file(routing_path(&study_dir.join("s1-L2-haares"))).unwrap();
    let report = std::fs::read_to_string(write_report(&study, &runs, &study_dir).unwrap()).unwrap();
    assert!(
        report.contains("`s1-L2-haares` has no routing statistics"),
        "{report}"
    );
}

fn inspect(
    dir: &Path,
    model: &Path,
    prompt: Option<&str>,
    tokenizer: Option<&Path>,
) -> haares_train::Result<haares_train::inspect::Inspection> {
    let inspected = Inspected::resolve(model)?;
    InspectJob {
        out: inspected.default_out(),
        inspected,
        load: Default::default(),
        prompt: prompt.map(String::from),
        tokenizer: tokenizer.map(Path::to_path_buf),
        chunks: 4,
        paths: paths(dir),
    }
    .run::<B>(Default::default(), "ndarray".parse().unwrap())
}

#[test]
fn inspect_reads_a_run_directory_and_a_bare_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let run_dir = dir.path().join("run");
    let summary = train_to_end(&tiny_config("haares"), &data, &run_dir);

    // On the run: its validation chunks, at the best model — the statistics logged at the best
    // step.
    let inspection = inspect(dir.path(), &run_dir, None, None).unwrap();
    let logged = read_routing(&routing_path(&run_dir)).unwrap();
    let at_best = &logged
        .iter()
        .find(|l| l.step == summary.best_step)
        .unwrap()
        .routing;
    assert_eq!(inspection.statistics.tokens, at_best.tokens);
    for (a, b) in inspection.statistics.sites.iter().zip(&at_best.sites) {
        assert!((a.detail_mass - b.detail_mass).abs() < 1e-5);
    }
    assert!(
        inspection.table.contains("| ℓ2 | 1 | 2 | 3 |"),
        "{}",
        inspection.table
    );
    for file in ["routing.json", "routing.svg", "routing.png"] {
        assert!(run_dir.join("inspect").join(file).is_file(), "{file}");
    }

    // A bare copy of the model: a prompt and the tokenizer give per-token weights.
    let bare = dir.path().join("bare.safetensors");
    std::fs::copy(run_dir.join("best-model.safetensors"), &bare).unwrap();
    let error = inspect(dir.path(), &bare, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("--prompt TEXT with --tokenizer FILE"),
        "{error}"
    );
    let error = inspect(dir.path(), &bare, Some("We"), None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("pass --tokenizer"), "{error}");
    let tokenizer = run_dir.join("tokenizer.json");
    let inspection = inspect(dir.path(), &bare, Some("We the"), Some(&tokenizer)).unwrap();
    assert_eq!(inspection.statistics.tokens, 6.0);
    let per_token = inspection.per_token.unwrap();
    assert_eq!(
        per_token.lines().filter(|l| l.starts_with("| 5 |")).count(),
        1,
        "{per_token}"
    );
    let csv = std::fs::read_to_string(dir.path().join("bare-inspect/tokens.csv")).unwrap();
    // 6 tokens × (1 + 3 + 3 + 5 + 3) slots over the 5 sites, and a header.
    assert_eq!(csv.lines().count(), 1 + 6 * 15, "{csv}");
    assert!(csv.contains("0,\"W\",ℓ2,D_1^(1),"), "{csv}");
}

#[test]
fn inspect_refuses_a_model_without_routers() {
    let dir = tempfile::tempdir().unwrap();
    let data = sotu(dir.path());
    let run_dir = dir.path().join("standard");
    train_to_end(&tiny_config("standard"), &data, &run_dir);
    let error = inspect(dir.path(), &run_dir, None, None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("no depth router"), "{error}");
    let error = inspect(dir.path(), &dir.path().join("missing"), None, None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("does not exist"), "{error}");
}
