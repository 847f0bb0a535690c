//! The `--plot` chart of an A/B report: throughput per cell (mean bar, one dot per repetition, the
//! ratio to the baseline above each bar) beside TTFT per cell (p99 light, mean dark), as SVG or PNG.

use std::path::Path;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::{RangedCoordf64, RangedCoordi32};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::{AbReport, CellSummary};

/// Chart size in pixels: two panels side by side.
const SIZE: (u32, u32) = (1100, 480);
/// Width of the throughput panel, pixels; the TTFT panel takes the rest.
const LEFT_PANEL: u32 = 550;

/// A panel with one x segment per cell and a linear y axis.
type CellChart<'a, DB> =
    ChartContext<'a, DB, Cartesian2d<SegmentedCoord<RangedCoordi32>, RangedCoordf64>>;

/// Writes a two-panel chart: throughput per cell (mean bar, one dot per repetition) and TTFT per cell
/// (p99 as a light bar, mean as a dark bar inside it). SVG for a `.svg` path, PNG otherwise.
///
/// # Errors
///
/// When the file cannot be written or a font for the labels cannot be loaded; the message names the
/// path.
pub fn write_plot(report: &AbReport, path: &Path) -> anyhow::Result<()> {
    let is_svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let result = if is_svg {
        draw(report, SVGBackend::new(path, SIZE).into_drawing_area())
    } else {
        draw(report, BitMapBackend::new(path, SIZE).into_drawing_area())
    };
    result.with_context(|| format!("writing the plot {}", path.display()))
}

/// plotters' errors carry the backend's error type; the chart's caller only needs the message.
fn plot_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

fn draw<DB: DrawingBackend>(report: &AbReport, root: DrawingArea<DB, Shift>) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(LEFT_PANEL);
    draw_throughput(report, &left)?;
    draw_ttft(report, &right)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// One x segment per cell. A segmented `0..n` range has a segment for `n` too, so the range ends at
/// `n - 1`.
fn segments(n: i32) -> SegmentedCoord<RangedCoordi32> {
    (0..(n - 1).max(1)).into_segmented()
}

/// A panel titled `caption` with the cell labels under the x segments and `0..top` on the y axis.
fn cell_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    report: &AbReport,
    top: f64,
    y_desc: &str,
) -> anyhow::Result<CellChart<'a, DB>> {
    let labels: Vec<&str> = report.cells.iter().map(|c| c.label.as_str()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(segments(labels.len() as i32), 0.0..top)
        .map_err(plot_error)?;
    let label_of = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => labels
            .get(*i as usize)
            .map(|l| (*l).to_owned())
            .unwrap_or_default(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(labels.len())
        .x_label_formatter(&label_of)
        .y_desc(y_desc)
        .draw()
        .map_err(plot_error)?;
    Ok(chart)
}

fn draw_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut CellChart<'a, DB>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(plot_error)
}

/// `(cell index, throughput)` of every run, for the repetition dots.
fn repetition_values(report: &AbReport) -> Vec<(i32, f64)> {
    report
        .runs
        .iter()
        .filter_map(|r| {
            report
                .cells
                .iter()
                .position(|c| c.label == r.cell)
                .map(|i| (i as i32, r.report.throughput_rps))
        })
        .collect()
}

fn draw_throughput<DB: DrawingBackend>(
    report: &AbReport,
    area: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let reps = repetition_values(report);
    // Headroom above the highest dot for the ratio labels.
    let top = reps.iter().map(|(_, v)| *v).fold(1.0_f64, f64::max) * 1.2;
    let caption = format!("throughput (ratio vs {})", report.baseline);
    let mut chart = cell_chart(area, &caption, report, top, "requests/s")?;
    let bar = RGBColor(70, 110, 180);
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(bar.mix(0.75).filled())
                .margin(14)
                .data(
                    report
                        .cells
                        .iter()
                        .enumerate()
                        .map(|(i, c)| (i as i32, c.throughput_rps)),
                ),
        )
        .map_err(plot_error)?
        .label("mean")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], bar.filled()));
    draw_ratio_labels(report, &reps, &mut chart)?;
    chart
        .draw_series(
            reps.iter()
                .map(|(i, v)| Circle::new((SegmentValue::CenterOf(*i), *v), 3, BLACK.filled())),
        )
        .map_err(plot_error)?
        .label("one repetition")
        .legend(|(x, y)| Circle::new((x + 6, y), 3, BLACK.filled()));
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Each cell's ratio to the baseline, above its bar and above every one of its repetition dots.
fn draw_ratio_labels<'a, DB: DrawingBackend + 'a>(
    report: &AbReport,
    reps: &[(i32, f64)],
    chart: &mut CellChart<'a, DB>,
) -> anyhow::Result<()> {
    let style =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(report.cells.iter().enumerate().map(|(i, c)| {
            let text = c
                .ratio
                .map_or_else(|| "1.000x".to_owned(), |r| format!("{:.3}x", r.ratio));
            let peak = reps
                .iter()
                .filter(|(cell, _)| *cell == i as i32)
                .fold(c.throughput_rps, |m, (_, v)| m.max(*v));
            let at = (SegmentValue::CenterOf(i as i32), peak * 1.03);
            Text::new(text, at, style.clone())
        }))
        .map_err(plot_error)?;
    Ok(())
}

fn draw_ttft<DB: DrawingBackend>(
    report: &AbReport,
    area: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let top = report
        .cells
        .iter()
        .map(|c| c.ttft_p99_ms.max(c.ttft_mean_ms))
        .fold(1.0_f64, f64::max)
        * 1.15;
    let mut chart = cell_chart(area, "time to first token", report, top, "ms")?;
    // p99 drawn first and wider, the mean inside it: one bar per cell shows both.
    type Series = (&'static str, RGBColor, u32, fn(&CellSummary) -> f64);
    let series: [Series; 2] = [
        ("p99", RGBColor(240, 170, 90), 10, |c| c.ttft_p99_ms),
        ("mean", RGBColor(190, 80, 40), 30, |c| c.ttft_mean_ms),
    ];
    for (label, color, margin, value) in series {
        chart
            .draw_series(
                Histogram::vertical(&chart)
                    .style(color.filled())
                    .margin(margin)
                    .data(
                        report
                            .cells
                            .iter()
                            .enumerate()
                            .map(|(i, c)| (i as i32, value(c))),
                    ),
            )
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}
