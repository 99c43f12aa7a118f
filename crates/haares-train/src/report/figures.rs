//! Report figures of the losses, each as SVG and PNG ([`crate::report::plot`]): validation curves
//! per setting, and the paired-effect figure (fig:pairedevidence). The routing figures are in
//! [`crate::report::routing_figures`].

use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::error::{Result, TrainError};
use crate::report::plot::{
    DrawResult, FONT, Figure, color, draw_legend, drawing, legend_mark, save_both, slug,
};
use crate::report::results::{Finished, Pair, PaperMarks, mean_sd};
use haares_core::method::method_label;

/// Draws every figure into `study_dir/figures/`; returns `(caption, relative path of the SVG)`.
pub fn draw(
    study_dir: &Path,
    settings: &[String],
    finished: &[Finished],
    pairs: &[Pair],
    paper: &[PaperMarks],
) -> Result<Vec<(String, String)>> {
    let dir = study_dir.join("figures");
    std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    let mut methods: Vec<&str> = finished.iter().map(|f| f.method.as_str()).collect();
    methods.sort_by_key(|m| (haares_core::method::method_rank(m), m.to_string()));
    methods.dedup();
    let mut written = Vec::new();
    for setting in settings {
        let runs: Vec<&Finished> = finished.iter().filter(|f| &f.setting == setting).collect();
        if runs.is_empty() {
            continue;
        }
        let stem = format!("val-curves-{}", slug(setting));
        save_both(
            &dir,
            &stem,
            (900, 560),
            &Plot::Curves {
                setting,
                runs: &runs,
                methods: &methods,
            },
        )?;
        written.push((
            format!("Validation curves, {setting}"),
            format!("figures/{stem}.svg"),
        ));
    }
    if !pairs.is_empty() {
        save_both(
            &dir,
            "paired-effect",
            (900, 140 + 60 * groups(pairs).len() as u32),
            &Plot::Paired(pairs, paper),
        )?;
        let caption = match paper.is_empty() {
            true => "Paired reductions ℓ_Block − ℓ_M",
            false => {
                "Paired reductions ℓ_Block − ℓ_M: this sweep filled, the paper's hollow grey below"
            }
        };
        written.push((caption.into(), "figures/paired-effect.svg".into()));
    }
    Ok(written)
}

/// A figure, drawable on any plotters backend.
enum Plot<'a> {
    Curves {
        setting: &'a str,
        runs: &'a [&'a Finished],
        methods: &'a [&'a str],
    },
    Paired(&'a [Pair], &'a [PaperMarks]),
}

impl Figure for Plot<'_> {
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult {
        match self {
            Self::Curves {
                setting,
                runs,
                methods,
            } => curves(area, setting, runs, methods),
            Self::Paired(pairs, paper) => paired_effect(area, pairs, paper),
        }
    }
}

fn curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    setting: &str,
    runs: &[&Finished],
    methods: &[&str],
) -> DrawResult {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| drawing(e);
    area.fill(&WHITE).map_err(e)?;
    let points = runs.iter().flat_map(|r| r.summary.val_curve.iter());
    let (mut lo, mut hi, mut last) = (f64::INFINITY, f64::NEG_INFINITY, 1usize);
    for (step, loss) in points {
        (lo, hi, last) = (lo.min(*loss), hi.max(*loss), last.max(*step));
    }
    let pad = ((hi - lo) * 0.05).max(1e-3);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("Validation loss, {setting}"), (FONT, 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..last as f64, (lo - pad)..(hi + pad))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("validation loss (nats/token)")
        .label_style((FONT, 14))
        .draw()
        .map_err(e)?;
    for (m, method) in methods.iter().enumerate() {
        let style = color(m);
        for (k, run) in runs.iter().filter(|r| r.method == *method).enumerate() {
            let line: Vec<(f64, f64)> = run
                .summary
                .val_curve
                .iter()
                .map(|(s, l)| (*s as f64, *l))
                .collect();
            let series = chart
                .draw_series(LineSeries::new(line.clone(), style.stroke_width(2)))
                .map_err(e)?;
            if k == 0 {
                series
                    .label(method_label(method))
                    .legend(legend_mark(style));
            }
            chart
                .draw_series(line.iter().map(|p| Circle::new(*p, 3, style.filled())))
                .map_err(e)?;
        }
    }
    draw_legend(&mut chart, 14)
}

fn groups(pairs: &[Pair]) -> Vec<(String, String)> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for p in pairs {
        let key = (p.setting.clone(), p.method.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

/// The half-width of the paired-effect figure's axis: the largest reduction, ours or the
/// paper's, with a margin.
fn reduction_span(pairs: &[Pair], paper: &[PaperMarks]) -> f64 {
    let paper_values = paper
        .iter()
        .flat_map(|m| m.seeds.iter().chain(&m.mean).map(|g| g.abs()));
    pairs
        .iter()
        .map(|p| p.reduction().abs())
        .chain(paper_values)
        .fold(1e-3, f64::max)
        * 1.15
}

/// The label of the paired-effect figure's row at `y` (rows at whole numbers, none between).
fn row_label(keys: &[(String, String)], y: f64) -> String {
    let i = y.round();
    if (y - i).abs() > 1e-6 || i < 0.0 || i as usize >= keys.len() {
        return String::new();
    }
    let (setting, method) = &keys[i as usize];
    format!("{setting} · {}", method_label(method))
}

/// Every setting × method's paired reductions, one row each, the paper's beside ours.
fn paired_effect<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    pairs: &[Pair],
    paper: &[PaperMarks],
) -> DrawResult {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| drawing(e);
    area.fill(&WHITE).map_err(e)?;
    let keys = groups(pairs);
    let marks_of = |setting: &str, method: &str| {
        paper
            .iter()
            .find(|m| m.setting == setting && m.method == method)
    };
    let span = reduction_span(pairs, paper);
    let label = |y: &f64| row_label(&keys, *y);
    let caption = match paper.is_empty() {
        true => "Paired reductions ℓ_Block − ℓ_M (positive favours M)",
        false => "Paired reductions ℓ_Block − ℓ_M (positive favours M); hollow grey: the paper",
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(220)
        .build_cartesian_2d(-span..span, -0.6f64..(keys.len() as f64 - 0.4))
        .map_err(e)?;
    chart
        .configure_mesh()
        .y_labels(keys.len().max(1) * 2 + 1)
        .y_label_formatter(&label)
        .x_desc("reduction in best validation loss")
        .label_style((FONT, 14))
        .disable_y_mesh()
        .draw()
        .map_err(e)?;
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, -0.6), (0.0, keys.len() as f64 - 0.4)],
            BLACK.stroke_width(1),
        ))
        .map_err(e)?;
    for (i, (setting, method)) in keys.iter().enumerate() {
        let values: Vec<f64> = pairs
            .iter()
            .filter(|p| &p.setting == setting && &p.method == method)
            .map(Pair::reduction)
            .collect();
        let y = i as f64;
        let (mean, _) = mean_sd(&values);
        let style = color(i);
        seed_marks(
            &mut chart,
            &values,
            Some(mean),
            y,
            span,
            style.filled(),
            BLACK.filled(),
        )
        .map_err(e)?;
        if let Some(marks) = marks_of(setting, method) {
            // The paper's below ours, hollow and grey, so that the two never hide each other.
            let grey = RGBColor(120, 120, 120);
            seed_marks(
                &mut chart,
                &marks.seeds,
                marks.mean,
                y - 0.3,
                span,
                grey.stroke_width(2),
                grey.stroke_width(2),
            )
            .map_err(e)?;
        }
    }
    Ok(())
}

/// One row of the paired-effect figure: the seeds' reductions as circles joined by their range,
/// and a diamond at `mean`.
fn seed_marks<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    values: &[f64],
    mean: Option<f64>,
    y: f64,
    span: f64,
    circles: ShapeStyle,
    diamond: ShapeStyle,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if !values.is_empty() {
        let (min, max) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        chart.draw_series(LineSeries::new(
            vec![(min, y), (max, y)],
            circles.stroke_width(2),
        ))?;
        chart.draw_series(values.iter().map(|v| Circle::new((*v, y), 5, circles)))?;
    }
    if let Some(mean) = mean {
        let corners = vec![
            (mean, y + 0.18),
            (mean + span * 0.02, y),
            (mean, y - 0.18),
            (mean - span * 0.02, y),
        ];
        match diamond.filled {
            true => chart.draw_series(std::iter::once(Polygon::new(corners, diamond)))?,
            false => {
                let mut closed = corners.clone();
                closed.push(corners[0]);
                chart.draw_series(std::iter::once(PathElement::new(closed, diamond)))?
            }
        };
    }
    Ok(())
}
