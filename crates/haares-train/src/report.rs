//! The study report: the paper's tables from finished runs — endpoints per seed with mean ±
//! sample SD (eq:endpoint), paired reductions ℓ_Block − ℓ_M, perplexities, time to target
//! (tab:timetotarget) and the break-even ratio (eq:breakeven) — plus `paired_results.csv` and
//! the figures of [`crate::figures`] and [`crate::routing_figures`]; the paired tables are in
//! [`crate::tables`], the shared types in [`crate::results`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::{method_label, method_rank};
use crate::error::{Result, TrainError, write_atomically};
use crate::results::{BASELINE, Finished, collect, mean_sd, pairs};
use crate::study::{PlannedRun, Study};
use crate::tables::{paired_csv, write_pairs_section, write_time_to_target};

/// `loss / perplexity` of one endpoint.
fn loss_ppl(loss: f64) -> String {
    format!("{loss:.4} / {:.2}", loss.exp())
}

/// Writes `report.md`, `paired_results.csv` and `figures/` into `study_dir`; returns the report path.
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
    let pairs = pairs(&finished);
    let endpoint = |setting: &str, method: &str, seed: u64| {
        finished
            .iter()
            .find(|f| f.setting == setting && f.method == method && f.seed == seed)
    };

    let mut md = String::new();
    let _ = writeln!(md, "# {} — report\n", study.title);
    let _ = writeln!(
        md,
        "Reproduces {} of the paper. {}\n",
        study.paper_table,
        study.description.trim()
    );
    let first = &finished[0].summary;
    let _ = writeln!(
        md,
        "Runs finished: {} of {}; seeds that ran: {}. Dataset `{}`, {} tokeniser, width {}, \
         context {}, batch {}, {} steps, validation every {} steps on {}; backend `{}`.\n",
        finished.len(),
        runs.len(),
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        first.config.dataset,
        serde_json::to_value(first.config.tokenizer)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default(),
        first.config.d_model,
        first.config.seq_len,
        first.config.batch_size,
        first.config.steps,
        first.config.eval_every,
        first
            .config
            .val_chunks
            .map(|n| format!("the first {n} validation chunks"))
            .unwrap_or_else(|| "the whole validation split".into()),
        first.backend
    );
    if !missing.is_empty() {
        let _ = writeln!(
            md,
            "Not finished (left out of every table): {}.\n",
            missing.join(", ")
        );
    }

    let _ = writeln!(md, "## Mean best validation loss / perplexity\n");
    let has_pair = methods.iter().any(|m| m == BASELINE) && methods.iter().any(|m| m == "haares");
    let _ = write!(md, "| Setting |");
    for m in &methods {
        let _ = write!(md, " {} |", method_label(m));
    }
    let _ = writeln!(
        md,
        "{}",
        if has_pair {
            " Δ loss (HAARES − Block) |"
        } else {
            ""
        }
    );
    let _ = writeln!(
        md,
        "|---|{}{}",
        "---|".repeat(methods.len()),
        if has_pair { "---|" } else { "" }
    );
    for setting in &settings {
        // Mean loss, and mean of the per-seed perplexities (the paper's aggregate; not exp of the
        // mean loss, a different quantity).
        let mean_of = |m: &str| {
            let v: Vec<f64> = seeds
                .iter()
                .filter_map(|&s| endpoint(setting, m, s))
                .map(|f| f.summary.best_val_loss)
                .collect();
            let ppl: Vec<f64> = v.iter().map(|l| l.exp()).collect();
            (!v.is_empty()).then(|| (mean_sd(&v).0, mean_sd(&ppl).0))
        };
        let means: Vec<Option<(f64, f64)>> = methods.iter().map(|m| mean_of(m)).collect();
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
            let _ = match (mean_of("haares"), mean_of(BASELINE)) {
                (Some(h), Some(b)) => write!(md, " {:+.4} |", h.0 - b.0),
                _ => write!(md, " – |"),
            };
        }
        let _ = writeln!(md);
    }

    let _ = writeln!(
        md,
        "\n## Best validation loss / perplexity per seed (eq:endpoint)\n"
    );
    for setting in &settings {
        let _ = writeln!(md, "**{setting}**\n");
        let _ = write!(md, "| Method |");
        for s in &seeds {
            let _ = write!(md, " Seed {s} |");
        }
        let _ = writeln!(md, " Mean ± SD | Best step(s) |");
        let _ = writeln!(md, "|---|{}---|---|", "---|".repeat(seeds.len()));
        for m in &methods {
            let cells: Vec<Option<&Finished>> =
                seeds.iter().map(|&s| endpoint(setting, m, s)).collect();
            if cells.iter().all(Option::is_none) {
                continue;
            }
            let _ = write!(md, "| {} |", method_label(m));
            for cell in &cells {
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
        let _ = writeln!(md);
    }

    if !pairs.is_empty() {
        write_pairs_section(&mut md, &pairs);
        write_time_to_target(&mut md, &finished);
    }
    let figures = crate::figures::draw(study_dir, &settings, &finished, &pairs)?;
    let routing = crate::routing_figures::draw(study_dir, &settings, &finished)?;
    let _ = writeln!(md, "## Figures\n");
    for (caption, file) in figures.into_iter().chain(routing.written) {
        let _ = writeln!(md, "![{caption}]({file})\n");
    }
    for note in &routing.notes {
        let _ = writeln!(md, "Note: {note}.\n");
    }
    let _ = writeln!(
        md,
        "## Files\n\n- `paired_results.csv`: every paired reduction.\n- `<run>/metrics.jsonl`: \
         training and validation curves; `<run>/summary.json`: endpoint and throughput.\n- \
         `<run>/routing.jsonl` (routed methods): per validation pass, every read site's mean slot \
         weights, group masses, detail mass p_D, entropy and detail bias.\n"
    );

    write_atomically(
        &study_dir.join("paired_results.csv"),
        paired_csv(&pairs).as_bytes(),
    )?;
    let path = study_dir.join("report.md");
    write_atomically(&path, md.as_bytes())?;
    Ok(path)
}
