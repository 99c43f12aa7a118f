//! The routing heatmap: the mean routing weight `ᾱ` of every read site (rows, in execution order,
//! `F` the final readout) over every source (columns `e, C₁, D̂₁, …`; the active block's written
//! prefix `C_n^(r−1)`, `D̂_n^(r−1)` sits in its block's column), one panel per statistics on one
//! viridis scale. Drawn by the report ([`crate::report::routing_figures`]) and by `inspect`.

use std::path::Path;

use haares_core::{ReadSite, RoutingStatistics, SiteStatistics, SlotId, SlotKind};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::Result;
use crate::report::plot::{DrawResult, FONT, Figure, drawing, save_both, viridis};

/// A heatmap of `ᾱ`: rows are read sites in execution order, columns the sources `e, C_1, D̂_1, …`;
/// one panel per titled statistics, sharing the colour scale.
pub struct Heatmap {
    /// The figure's title.
    pub title: String,
    /// `(panel title, statistics)`.
    pub panels: Vec<(String, RoutingStatistics)>,
}

impl Heatmap {
    /// A size that gives every row a few pixels.
    pub fn size(&self) -> (u32, u32) {
        let rows = self
            .panels
            .iter()
            .map(|(_, s)| s.sites.len())
            .max()
            .unwrap_or(1) as u32;
        let columns = columns(&self.panels).len() as u32;
        let panel_width = (40 + 34 * columns).clamp(320, 900);
        (
            130 + panel_width * self.panels.len() as u32,
            (160 + 9 * rows).clamp(420, 1400),
        )
    }

    /// Writes the heatmap as `<stem>.svg` and `<stem>.png` in `dir`.
    pub fn save(&self, dir: &Path, stem: &str) -> Result<()> {
        save_both(dir, stem, self.size(), self)
    }
}

/// A heatmap column: a block and a slot kind (0 embedding, 1 cumulative, 2 detail).
type Column = (usize, u8);

/// The column of a slot: its source, with the active prefix in its block's column.
fn column_of(slot: SlotId) -> Column {
    let kind = match slot.kind {
        SlotKind::Embedding => 0,
        SlotKind::Cumulative => 1,
        SlotKind::Detail => 2,
    };
    (slot.block, kind)
}

/// Every column any panel uses, in block order.
fn columns(panels: &[(String, RoutingStatistics)]) -> Vec<Column> {
    let mut columns: Vec<Column> = panels
        .iter()
        .flat_map(|(_, stats)| {
            stats
                .sites
                .iter()
                .flat_map(|s| s.slots.iter().copied().map(column_of))
        })
        .collect();
    columns.sort_unstable();
    columns.dedup();
    columns
}

fn column_label((block, kind): Column) -> String {
    const SUBSCRIPTS: [char; 10] = ['₀', '₁', '₂', '₃', '₄', '₅', '₆', '₇', '₈', '₉'];
    let sub: String = block
        .to_string()
        .chars()
        .map(|d| SUBSCRIPTS[d.to_digit(10).unwrap_or(0) as usize])
        .collect();
    match kind {
        0 => "e".into(),
        1 => format!("C{sub}"),
        _ => format!("D̂{sub}"),
    }
}

/// A read site's row label: its event ℓ (1-based), or F for the final readout.
fn row_label(site: &SiteStatistics) -> String {
    match site.site {
        ReadSite::Event { event } => (event + 1).to_string(),
        ReadSite::Final => "F".into(),
    }
}

impl Figure for Heatmap {
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| drawing(e);
        area.fill(&WHITE).map_err(e)?;
        let area = area.titled(&self.title, (FONT, 20)).map_err(e)?;
        let (width, _) = area.dim_in_pixel();
        let (panels_area, bar_area) = area.split_horizontally(width.saturating_sub(110));
        let columns = columns(&self.panels);
        let top = self
            .panels
            .iter()
            .flat_map(|(_, s)| s.sites.iter().flat_map(|site| site.weights.iter().copied()))
            .fold(1e-6, f64::max);
        let panels = panels_area.split_evenly((1, self.panels.len().max(1)));
        for ((title, stats), panel) in self.panels.iter().zip(panels) {
            draw_panel(&panel, title, stats, &columns, top)?;
        }
        draw_color_bar(&bar_area, top)
    }
}

/// One panel: a cell per read site and source, coloured by its mean weight over `top`.
fn draw_panel<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    title: &str,
    stats: &RoutingStatistics,
    columns: &[Column],
    top: f64,
) -> DrawResult {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| drawing(e);
    let rows = stats.sites.len();
    let step = rows.div_ceil(24).max(1);
    let mut chart = ChartBuilder::on(panel)
        .caption(title, (FONT, 16))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(44)
        .build_cartesian_2d(
            (0..columns.len()).into_segmented(),
            (0..rows.max(1)).into_segmented(),
        )
        .map_err(e)?;
    let label_of_row = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(row) if *row < rows && (rows - 1 - row).is_multiple_of(step) => {
            row_label(&stats.sites[rows - 1 - row])
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(columns.len())
        .y_labels(rows)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(c) if *c < columns.len() => column_label(columns[*c]),
            _ => String::new(),
        })
        .y_label_formatter(&label_of_row)
        .x_desc("source s")
        .y_desc("read site ℓ (F: final readout)")
        .label_style((FONT, 12))
        .draw()
        .map_err(e)?;
    let cells = stats.sites.iter().enumerate().flat_map(|(i, site)| {
        let row = rows - 1 - i;
        site.slots
            .iter()
            .zip(&site.weights)
            .filter_map(move |(slot, weight)| {
                let col = columns.iter().position(|c| *c == column_of(*slot))?;
                let fill = viridis(*weight / top);
                Some(Rectangle::new(
                    [
                        (SegmentValue::Exact(col), SegmentValue::Exact(row)),
                        (SegmentValue::Exact(col + 1), SegmentValue::Exact(row + 1)),
                    ],
                    fill.filled(),
                ))
            })
    });
    chart.draw_series(cells).map_err(e)?;
    Ok(())
}

/// The colour scale from 0 to `top`.
fn draw_color_bar<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, top: f64) -> DrawResult {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| drawing(e);
    let mut bar = ChartBuilder::on(area)
        .margin_top(40)
        .margin_bottom(44)
        .margin_right(8)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..1f64, 0f64..top)
        .map_err(e)?;
    bar.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_desc("ᾱ")
        .label_style((FONT, 12))
        .draw()
        .map_err(e)?;
    let steps = 100;
    bar.draw_series((0..steps).map(|i| {
        let (lo, hi) = (
            top * i as f64 / steps as f64,
            top * (i + 1) as f64 / steps as f64,
        );
        let fill = viridis(lo / top);
        Rectangle::new([(0.0, lo), (1.0, hi)], fill.filled())
    }))
    .map_err(e)?;
    Ok(())
}
