//! The study report: the paper's tables from finished runs — endpoints per seed with mean ±
//! sample SD (eq:endpoint), paired reductions ℓ_Block − ℓ_M, perplexities, time to target
//! (tab:timetotarget) and the break-even ratio (eq:breakeven) — plus `paired_results.csv` and
//! the figures of [`figures`] and [`routing_figures`]; the paired tables are in [`tables`], the
//! shared types in [`results`]; [`plot`] and [`heatmap`] draw.

pub mod evidence;
pub mod figures;
pub mod heatmap;
pub mod paper_side;
pub mod paper_tables;
pub mod plot;
pub mod results;
pub mod routing_figures;
pub mod tables;
pub mod verdict;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use haares_core::method::{method_label, method_rank};

use crate::error::{Result, TrainError, write_atomically};
use crate::study::{PlannedRun, Study};
use paper_side::PaperSide;
use results::{BASELINE, Finished, Pair, PaperMarks, collect, mean_sd, pairs};
use tables::{paired_csv, write_pairs_section, write_time_to_target};

/// Writes `report.md`, `paired_results.csv` and `figures/` into `study_dir`; returns the report
/// path.
pub fn write_report(study: &Study, runs: &[PlannedRun], study_dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(study_dir).map_err(|e| TrainError::io(study_dir, e))?;
    let (finished, missing) = collect(runs, study_dir)?;
    if finished.is_empty() {
        return Err(TrainError::Report(format!(
            "no finished runs of study `{}` under `{}`; run `haares-train sweep {}` first (with the same preset and overrides)",
            study.name,
            study_dir.display(),
            study.name
        )));
    }
    let grid = Grid::of(runs, &finished);
    let pairs = pairs(&finished);
    // The paper's tables missing beside a study file of the user's own cost the comparison, not
    // the report.
    let (paper, paper_error) = match PaperSide::new(study, runs, &finished) {
        Ok(side) => (side, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut md = String::new();
    write_header(&mut md, study, runs, &grid, &missing);
    if let Some(paper) = &paper {
        write_paper_section(&mut md, paper, &grid.settings, grid.finished);
    }
    if let Some(error) = &paper_error {
        eprintln!("warning: the report is written without the paper's values: {error}");
        let _ = writeln!(
            md,
            "## Against the paper\n\nNot compared: the paper's values could not be read ({error}). \
             A study names them in `paper_values`, relative to its own file; copy \
             `experiments/paper/` beside it (docs/experiments.md).\n"
        );
    }
    write_means(&mut md, &grid);
    write_per_seed(&mut md, &grid);
    if !pairs.is_empty() {
        write_pairs_section(&mut md, &pairs);
        write_time_to_target(&mut md, &finished);
    }
    let marks = paper
        .as_ref()
        .map_or(Vec::new(), |p| verdict::paper_marks(p, &pairs));
    write_figures(&mut md, study_dir, &grid, &pairs, &marks)?;
    write_runs_section(&mut md, grid.finished);
    write_files_section(&mut md);
    write_atomically(
        &study_dir.join("paired_results.csv"),
        paired_csv(&pairs, paper.as_ref()).as_bytes(),
    )?;
    let path = study_dir.join("report.md");
    write_atomically(&path, md.as_bytes())?;
    Ok(path)
}

/// The finished runs of a study, with the settings, methods and seeds the tables range over.
struct Grid<'a> {
    finished: &'a [Finished],
    /// Setting labels in the study's run order.
    settings: Vec<String>,
    /// Method names in report order.
    methods: Vec<String>,
    /// Seeds that ran, ascending.
    seeds: Vec<u64>,
}

impl<'a> Grid<'a> {
    fn of(runs: &[PlannedRun], finished: &'a [Finished]) -> Self {
        let mut settings: Vec<String> = Vec::new();
        for run in runs {
            if !settings.contains(&run.setting_label()) {
                settings.push(run.setting_label());
            }
        }
        let mut methods: Vec<String> = finished.iter().map(|f| f.method.clone()).collect();
        methods.sort_by_key(|m| (method_rank(m), m.clone()));
        methods.dedup();
        let mut seeds: Vec<u64> = finished.iter().map(|f| f.seed).collect();
        seeds.sort_unstable();
        seeds.dedup();
        Self {
            finished,
            settings,
            methods,
            seeds,
        }
    }

    /// The finished run of one cell.
    fn endpoint(&self, setting: &str, method: &str, seed: u64) -> Option<&'a Finished> {
        self.finished
            .iter()
            .find(|f| f.setting == setting && f.method == method && f.seed == seed)
    }

    /// Mean best loss and mean of the per-seed perplexities of one setting and method (the
    /// paper's aggregate; not exp of the mean loss, a different quantity).
    fn mean(&self, setting: &str, method: &str) -> Option<(f64, f64)> {
        let losses: Vec<f64> = self
            .seeds
            .iter()
            .filter_map(|&s| self.endpoint(setting, method, s))
            .map(|f| f.summary.best_val_loss)
            .collect();
        let perplexities: Vec<f64> = losses.iter().map(|l| l.exp()).collect();
        (!losses.is_empty()).then(|| (mean_sd(&losses).0, mean_sd(&perplexities).0))
    }
}

/// The title, the study's description and the runs' shared settings.
fn write_header(
    md: &mut String,
    study: &Study,
    runs: &[PlannedRun],
    grid: &Grid<'_>,
    missing: &[String],
) {
    let _ = writeln!(md, "# {} — report\n", study.title);
    let _ = writeln!(
        md,
        "Reproduces {} of the paper. {}\n",
        study.paper_table,
        study.description.trim()
    );
    let first = &grid.finished[0].summary;
    let seeds: Vec<String> = grid.seeds.iter().map(u64::to_string).collect();
    let tokenizer = serde_json::to_value(first.config.tokenizer)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    let validation = first
        .config
        .val_chunks
        .map(|n| format!("the first {n} validation chunks"))
        .unwrap_or_else(|| "the whole validation split".into());
    let _ = writeln!(
        md,
        "Runs finished: {} of {}; seeds that ran: {}. Dataset `{}`, {tokenizer} tokeniser, width \
         {}, context {}, batch {}, {} steps, validation every {} steps on {validation}; backend \
         `{}`.\n",
        grid.finished.len(),
        runs.len(),
        seeds.join(", "),
        first.config.dataset,
        first.config.d_model,
        first.config.seq_len,
        first.config.batch_size,
        first.config.steps,
        first.config.eval_every,
        first.backend
    );
    if !missing.is_empty() {
        let _ = writeln!(
            md,
            "Not finished (left out of every table): {}.\n",
            missing.join(", ")
        );
    }
}

/// One row per setting: every method's mean best loss / perplexity, the best in bold, and
/// HAARES − Block AttnRes where both ran.
fn write_means(md: &mut String, grid: &Grid<'_>) {
    let _ = writeln!(md, "## Mean best validation loss / perplexity\n");
    let methods = &grid.methods;
    let has_pair = methods.iter().any(|m| m == BASELINE) && methods.iter().any(|m| m == "haares");
    let _ = write!(md, "| Setting |");
    for m in methods {
        let _ = write!(md, " {} |", method_label(m));
    }
    let delta = if has_pair {
        " Δ loss (HAARES − Block) |"
    } else {
        ""
    };
    let _ = writeln!(md, "{delta}");
    let _ = writeln!(
        md,
        "|---|{}{}",
        "---|".repeat(methods.len()),
        if has_pair { "---|" } else { "" }
    );
    for setting in &grid.settings {
        let means: Vec<Option<(f64, f64)>> =
            methods.iter().map(|m| grid.mean(setting, m)).collect();
        let best = means
            .iter()
            .flatten()
            .map(|m| m.0)
            .fold(f64::INFINITY, f64::min);
        let _ = write!(md, "| {setting} |");
        for mean in &means {
            let _ = match mean {
                Some((loss, ppl)) if *loss == best => write!(md, " **{loss:.4} / {ppl:.2}** |"),
                Some((loss, ppl)) => write!(md, " {loss:.4} / {ppl:.2} |"),
                None => write!(md, " – |"),
            };
        }
        if has_pair {
            let _ = match (grid.mean(setting, "haares"), grid.mean(setting, BASELINE)) {
                (Some(h), Some(b)) => write!(md, " {:+.4} |", h.0 - b.0),
                _ => write!(md, " – |"),
            };
        }
        let _ = writeln!(md);
    }
}

/// One table per setting: every method's best loss / perplexity per seed, mean ± SD and the
/// steps of the best losses.
fn write_per_seed(md: &mut String, grid: &Grid<'_>) {
    let _ = writeln!(
        md,
        "\n## Best validation loss / perplexity per seed (eq:endpoint)\n"
    );
    for setting in &grid.settings {
        let _ = writeln!(md, "**{setting}**\n");
        let _ = write!(md, "| Method |");
        for s in &grid.seeds {
            let _ = write!(md, " Seed {s} |");
        }
        let _ = writeln!(md, " Mean ± SD | Best step(s) |");
        let _ = writeln!(md, "|---|{}---|---|", "---|".repeat(grid.seeds.len()));
        for m in &grid.methods {
            let cells: Vec<Option<&Finished>> = grid
                .seeds
                .iter()
                .map(|&s| grid.endpoint(setting, m, s))
                .collect();
            if cells.iter().all(Option::is_none) {
                continue;
            }
            write_seed_row(md, m, &cells);
        }
        let _ = writeln!(md);
    }
}

/// One method's row of a per-seed table.
fn write_seed_row(md: &mut String, method: &str, cells: &[Option<&Finished>]) {
    let _ = write!(md, "| {} |", method_label(method));
    for cell in cells {
        let _ = match cell {
            Some(f) => write!(md, " {} |", loss_ppl(f.summary.best_val_loss)),
            None => write!(md, " – |"),
        };
    }
    let values: Vec<f64> = cells
        .iter()
        .flatten()
        .map(|f| f.summary.best_val_loss)
        .collect();
    let (mean, sd) = mean_sd(&values);
    let sd = sd
        .map(|s| format!(" ± {s:.4}"))
        .unwrap_or_else(|| " (one seed)".into());
    let steps: Vec<String> = cells
        .iter()
        .flatten()
        .map(|f| f.summary.best_step.to_string())
        .collect();
    let _ = writeln!(md, " {mean:.4}{sd} | {} |", steps.join(", "));
}

/// `loss / perplexity` of one endpoint.
pub(crate) fn loss_ppl(loss: f64) -> String {
    format!("{loss:.4} / {:.2}", loss.exp())
}

/// Draws the loss and routing figures and links them.
fn write_figures(
    md: &mut String,
    study_dir: &Path,
    grid: &Grid<'_>,
    pairs: &[Pair],
    paper: &[PaperMarks],
) -> Result<()> {
    let figures = figures::draw(study_dir, &grid.settings, grid.finished, pairs, paper)?;
    let routing = routing_figures::draw(study_dir, &grid.settings, grid.finished)?;
    let _ = writeln!(md, "## Figures\n");
    for (caption, file) in figures.into_iter().chain(routing.written) {
        let _ = writeln!(md, "![{caption}]({file})\n");
    }
    for note in &routing.notes {
        let _ = writeln!(md, "Note: {note}.\n");
    }
    Ok(())
}

/// Appends the section "Against the paper": the scale, the verdict ([`verdict`]), then our values
/// beside the paper's ([`paper_tables`]: losses, per-seed reductions, time to target).
fn write_paper_section(
    md: &mut String,
    side: &PaperSide,
    settings: &[String],
    finished: &[Finished],
) {
    let labels: Vec<&str> = side.tables.iter().map(|t| t.label.as_str()).collect();
    let _ = writeln!(md, "## Against the paper ({})\n", labels.join(", "));
    verdict::write_scale(md, side);
    let comparisons = verdict::comparisons(side, settings, finished);
    verdict::write_verdict(md, side, &comparisons);
    paper_tables::write_losses(md, side, settings, finished);
    paper_tables::write_reductions(md, &comparisons);
    paper_tables::write_time_to_target(md, side, finished);
}

/// Where and how fast each run trained: its backend, its devices, the kernels of its matrix
/// products, its steps and seconds.
fn write_runs_section(md: &mut String, finished: &[Finished]) {
    let _ = writeln!(
        md,
        "## Runs\n\n| run | backend | devices | products | steps | training s | tokens/s |\n|---|---|---|---|---|---|---|"
    );
    for run in finished {
        let s = &run.summary;
        let name = run
            .run_dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        let devices = match s.devices.is_empty() {
            true => "–".to_string(),
            false => s.devices.join(", "),
        };
        let products = match s.products.is_empty() {
            true => "–",
            false => s.products.as_str(),
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {devices} | {products} | {} | {:.1} | {:.0} |",
            s.backend, s.steps, s.train_seconds, s.tokens_per_s
        );
    }
    let _ = writeln!(md);
}

/// What the study directory holds beside the report.
fn write_files_section(md: &mut String) {
    let _ = writeln!(
        md,
        "## Files\n\n- `paired_results.csv`: every paired reduction.\n- `<run>/metrics.jsonl`: \
         training and validation curves; `<run>/summary.json`: endpoint and throughput.\n- \
         `<run>/routing.jsonl` (routed methods): per validation pass, every read site's mean slot \
         weights, group masses, detail mass p_D, entropy and detail bias.\n"
    );
}
