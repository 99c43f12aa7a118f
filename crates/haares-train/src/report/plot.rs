//! What every report figure shares: the embedded font, the palette, and writing a figure as SVG
//! and PNG atomically. Text uses the embedded DejaVu Sans font, so no system font library is
//! needed.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Result, TrainError};

/// The family name the embedded font is registered under.
pub const FONT: &str = "sans-serif";
static REGISTER_FONT: Once = Once::new();

/// Registers the embedded font (once per process).
pub fn register_font() {
    REGISTER_FONT.call_once(|| {
        // The embedded font is a valid TrueType file; a failure would leave text undrawn, not crash.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

/// What drawing returns: [`TrainError::Report`] on failure, naming what plotters said.
pub type DrawResult = Result<()>;

/// A plotters failure as the report's error.
pub fn drawing(error: impl std::fmt::Display) -> TrainError {
    TrainError::Report(format!("drawing failed: {error}"))
}

/// A figure, drawable on any plotters backend.
pub trait Figure {
    /// Draws the figure on `area`.
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult;
}

/// The legend's mark of a line series drawn in `style`.
pub fn legend_mark(style: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style.stroke_width(2))
}

/// Draws the legend of `chart`'s labelled series in a framed, lightly opaque box.
pub fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    font_size: u32,
) -> DrawResult {
    chart
        .configure_series_labels()
        .label_font((FONT, font_size))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(drawing)
}

/// Renders `figure` to `<stem>.svg` and `<stem>.png` in `dir`, each through a temporary file and a
/// rename.
pub fn save_both(dir: &Path, stem: &str, size: (u32, u32), figure: &impl Figure) -> Result<()> {
    register_font();
    let fail = |e: TrainError| match e {
        TrainError::Report(message) => TrainError::Report(format!("figure `{stem}`: {message}")),
        other => other,
    };
    let pid = std::process::id();
    let (svg, svg_tmp) = (
        dir.join(format!("{stem}.svg")),
        dir.join(format!(".{stem}.tmp-{pid}.svg")),
    );
    {
        let area = SVGBackend::new(&svg_tmp, size).into_drawing_area();
        figure.render(&area).map_err(fail)?;
        area.present().map_err(|e| fail(drawing(e)))?;
    }
    std::fs::rename(&svg_tmp, &svg).map_err(|e| TrainError::io(&svg, e))?;
    let (png, png_tmp) = (
        dir.join(format!("{stem}.png")),
        dir.join(format!(".{stem}.tmp-{pid}.png")),
    );
    {
        let area = BitMapBackend::new(&png_tmp, size).into_drawing_area();
        figure.render(&area).map_err(fail)?;
        area.present().map_err(|e| fail(drawing(e)))?;
    }
    std::fs::rename(&png_tmp, &png).map_err(|e| TrainError::io(&png, e))
}

/// The `index`-th colour of a colour-blind-safe palette (Okabe–Ito), cycling.
pub fn color(index: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(120, 120, 120),
        RGBColor(0, 0, 0),
    ];
    COLORS[index % COLORS.len()]
}

/// A label as a file-name part: ASCII letters and digits, lower-cased; everything else `-`.
pub fn slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// The viridis colour scale (perceptually uniform, colour-blind safe) at `t ∈ [0, 1]`, linearly
/// interpolated between five of its stops; `t` outside is clamped.
pub fn viridis(t: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let position = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let low = (position.floor() as usize).min(STOPS.len() - 2);
    let (a, b, f) = (STOPS[low], STOPS[low + 1], position - low as f64);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}
