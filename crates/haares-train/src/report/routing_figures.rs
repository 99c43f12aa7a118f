//! Report figures of the routers, each as SVG and PNG ([`crate::report::plot`]), from the runs'
//! `routing.jsonl`:
//! - per setting, a heatmap of the mean routing weight `ᾱ` (read site × source) at the best
//!   checkpoint, one panel per routed method (HAARES beside Block AttnRes), averaged over seeds;
//! - the detail mass `p_D` (eq:groupmixture) over training, and over depth at the best checkpoint,
//!   one line per setting and detail-reading method.

use std::path::Path;

use haares_core::{ReadSite, RoutingStatistics};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Result, TrainError};
use crate::report::heatmap::Heatmap;
use crate::report::plot::{
    DrawResult, FONT, Figure, color, draw_legend, drawing, legend_mark, save_both, slug,
};
use crate::report::results::Finished;
use crate::run::learner::routing_path;
use crate::run::metrics::{RoutingLine, read_routing};
use haares_core::ResidualMethod;
use haares_core::method::{method_label, method_rank};

/// What [`draw`] produced: `(caption, relative SVG path)` per figure, and notes for the report
/// (runs whose routing could not be shown, and why).
#[derive(Debug, Default)]
pub struct RoutingFigures {
    /// The figures written.
    pub written: Vec<(String, String)>,
    /// Why a run is missing from them.
    pub notes: Vec<String>,
}

/// A finished routed run with its routing log.
struct RoutedRun<'a> {
    finished: &'a Finished,
    lines: Vec<RoutingLine>,
}

impl RoutedRun<'_> {
    /// The statistics of the validation pass that gave the best checkpoint.
    fn at_best(&self) -> Option<&RoutingStatistics> {
        let best = self.finished.summary.best_step;
        self.lines
            .iter()
            .find(|line| line.step == best)
            .map(|line| &line.routing)
    }
}

/// Draws the routing figures of `finished` into `study_dir/figures/`.
pub fn draw(
    study_dir: &Path,
    settings: &[String],
    finished: &[Finished],
) -> Result<RoutingFigures> {
    let dir = study_dir.join("figures");
    std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    let mut out = RoutingFigures::default();
    let mut runs = Vec::new();
    for run in finished {
        if !run.method.parse::<ResidualMethod>()?.is_routed() {
            continue;
        }
        let lines = read_routing(&routing_path(&run.run_dir))?;
        let routed = RoutedRun {
            finished: run,
            lines,
        };
        match routed.at_best() {
            Some(_) => runs.push(routed),
            None => out.notes.push(format!(
                "`{}` has no routing statistics at its best step {} (trained before routing \
                 telemetry existed?); it is left out of the routing figures",
                run.run_dir
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy(),
                run.summary.best_step
            )),
        }
    }
    runs.sort_by_key(|run| {
        (
            method_rank(&run.finished.method),
            run.finished.method.clone(),
        )
    });
    for setting in settings {
        let panels = heatmap_panels(runs.iter().filter(|r| &r.finished.setting == setting))?;
        if panels.is_empty() {
            continue;
        }
        let stem = format!("routing-{}", slug(setting));
        let heatmap = Heatmap {
            title: format!("Mean routing weight ᾱ at the best checkpoint, {setting}"),
            panels,
        };
        save_both(&dir, &stem, heatmap.size(), &heatmap)?;
        out.written.push((
            format!(
                "Routing weights ᾱ (read site × source) at the best checkpoint, mean over \
                 validation tokens and seeds, {setting}; the active block's column holds its \
                 written prefix C_n^(r−1), D̂_n^(r−1)"
            ),
            format!("figures/{stem}.svg"),
        ));
    }
    let mass = DetailMass::of(settings, &runs)?;
    if !mass.over_training.is_empty() {
        save_both(&dir, "detail-mass", (1100, 480), &mass)?;
        out.written.push((
            "Detail mass p_D over training (mean over the read sites that see a detail slot) and \
             over depth at the best checkpoint; mean over seeds"
                .into(),
            "figures/detail-mass.svg".into(),
        ));
    }
    Ok(out)
}

/// One panel per method: the seed mean of its runs' statistics at their best checkpoints.
fn heatmap_panels<'a>(
    runs: impl Iterator<Item = &'a RoutedRun<'a>>,
) -> Result<Vec<(String, RoutingStatistics)>> {
    let mut panels: Vec<(String, Vec<RoutingStatistics>)> = Vec::new();
    for run in runs {
        let stats = run.at_best().cloned().unwrap_or_default();
        match panels.iter_mut().find(|(m, _)| m == &run.finished.method) {
            Some((_, all)) => all.push(stats),
            None => panels.push((run.finished.method.clone(), vec![stats])),
        }
    }
    panels
        .into_iter()
        .map(|(method, all)| {
            let mean = RoutingStatistics::mean_of(&all)?.unwrap_or_default();
            Ok((method_label(&method), mean))
        })
        .collect()
}

/// The detail-mass figure's lines: `(label, points)` over training steps, and over depth (the
/// site's event ℓ / 2L) at the best checkpoint.
struct DetailMass {
    over_training: Vec<(String, Vec<(f64, f64)>)>,
    over_depth: Vec<(String, Vec<(f64, f64)>)>,
}

impl DetailMass {
    fn of(settings: &[String], runs: &[RoutedRun<'_>]) -> Result<Self> {
        let mut mass = Self {
            over_training: Vec::new(),
            over_depth: Vec::new(),
        };
        for setting in settings {
            let mut methods: Vec<&str> = runs
                .iter()
                .filter(|r| &r.finished.setting == setting)
                .map(|r| r.finished.method.as_str())
                .collect();
            methods.dedup();
            for method in methods {
                let group: Vec<&RoutedRun> = runs
                    .iter()
                    .filter(|r| &r.finished.setting == setting && r.finished.method == method)
                    .collect();
                let label = format!("{setting} · {}", method_label(method));
                let curve = seed_mean_curve(&group);
                if curve.is_empty() {
                    continue;
                }
                mass.over_training.push((label.clone(), curve));
                let best: Vec<RoutingStatistics> =
                    group.iter().filter_map(|r| r.at_best().cloned()).collect();
                if let Some(mean) = RoutingStatistics::mean_of(&best)? {
                    let events = mean.sites.len().saturating_sub(1).max(1) as f64;
                    let depth = mean
                        .sites
                        .iter()
                        .filter(|site| site.has_detail())
                        .filter_map(|site| match site.site {
                            ReadSite::Event { event } => {
                                Some(((event + 1) as f64 / events, site.detail_mass))
                            }
                            ReadSite::Final => None,
                        })
                        .collect();
                    mass.over_depth.push((label, depth));
                }
            }
        }
        Ok(mass)
    }
}

/// The mean detail mass at each validation step, averaged over the runs (seeds) logging it.
fn seed_mean_curve(runs: &[&RoutedRun<'_>]) -> Vec<(f64, f64)> {
    let mut steps: Vec<usize> = runs
        .iter()
        .flat_map(|r| r.lines.iter().map(|l| l.step))
        .collect();
    steps.sort_unstable();
    steps.dedup();
    steps
        .into_iter()
        .filter_map(|step| {
            let values: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.lines.iter().find(|l| l.step == step))
                .filter_map(|l| l.routing.mean_detail_mass())
                .collect();
            (!values.is_empty()).then(|| {
                (
                    step as f64,
                    values.iter().sum::<f64>() / values.len() as f64,
                )
            })
        })
        .collect()
}

impl Figure for DetailMass {
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult {
        area.fill(&WHITE).map_err(drawing)?;
        let (left, right) = area.split_horizontally(area.dim_in_pixel().0 / 2);
        line_panel(&left, "p_D over training", ("step", 0), &self.over_training)?;
        let depth = ("read site ℓ / 2L", 2);
        line_panel(
            &right,
            "p_D over depth, best checkpoint",
            depth,
            &self.over_depth,
        )
    }
}

fn line_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    (x_desc, x_decimals): (&str, usize),
    lines: &[(String, Vec<(f64, f64)>)],
) -> DrawResult {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| drawing(e);
    let points = lines.iter().flat_map(|(_, p)| p.iter());
    let (x_max, y_max) = points.fold((1e-9f64, 1e-3f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max * 1.1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .x_label_formatter(&|x| format!("{x:.x_decimals$}"))
        .y_desc("detail mass p_D")
        .label_style((FONT, 13))
        .draw()
        .map_err(e)?;
    for (i, (label, line)) in lines.iter().enumerate() {
        let style = color(i);
        chart
            .draw_series(LineSeries::new(line.clone(), style.stroke_width(2)))
            .map_err(e)?
            .label(label)
            .legend(legend_mark(style));
        chart
            .draw_series(line.iter().map(|p| Circle::new(*p, 3, style.filled())))
            .map_err(e)?;
    }
    draw_legend(&mut chart, 12)
}
