//! The `--plot` chart of an A/B report, as SVG or PNG: a title with the storm's shape, repetitions
//! and date over three panels, one bar group per cell:
//!
//! - throughput (mean bar, one dot per repetition, the ratio to the baseline above);
//! - TTFT (p99 light, mean dark);
//! - spill and cached-token fraction (percent).
//!
//! Whiskers are the paired 95% intervals against the baseline, drawn around the baseline's mean
//! (`baseline × ratio` bounds for throughput and TTFT, `baseline + difference` for the cached
//! fraction), so a whisker that does not reach the baseline's bar top is a significant change.

use std::path::Path;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::{AbReport, CellSummary};
use crate::stats::{PairedDifference, PairedRatio};

/// Chart size in pixels.
const SIZE: (u32, u32) = (1500, 560);
/// Height of the title and subtitle above the panels, pixels.
const TITLE: u32 = 64;

type Panel<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Writes the chart: SVG for a `.svg` path, PNG otherwise.
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

/// The subtitle: storm shape, repetitions, seed and date.
pub(super) fn subtitle(report: &AbReport) -> String {
    let m = &report.meta;
    format!(
        "{}; {} repetitions, interleaved; seed {}; {}",
        m.storm, report.reps, m.seed, m.started_at
    )
}

fn draw<DB: DrawingBackend>(report: &AbReport, root: DrawingArea<DB, Shift>) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(plot_error)?;
    let (top, body) = root.split_vertically(TITLE);
    let centre = |size| {
        TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Top))
    };
    let labels: Vec<&str> = report.cells.iter().map(|c| c.label.as_str()).collect();
    let x = (SIZE.0 / 2) as i32;
    top.draw_text(
        &format!("bch-drill ab: {}", labels.join(" vs ")),
        &centre(22),
        (x, 8),
    )
    .map_err(plot_error)?;
    top.draw_text(&subtitle(report), &centre(14), (x, 38))
        .map_err(plot_error)?;
    let panels = body.split_evenly((1, 3));
    draw_throughput(report, &panels[0])?;
    draw_ttft(report, &panels[1])?;
    draw_spill_cached(report, &panels[2])?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// A panel titled `caption`: the cells at x = 0, 1, … (labelled), `0..top` on the y axis.
fn panel<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    report: &AbReport,
    top: f64,
    y_desc: &str,
) -> anyhow::Result<Panel<'a, DB>> {
    let labels: Vec<String> = report.cells.iter().map(|c| c.label.clone()).collect();
    let n = labels.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..top)
        .map_err(plot_error)?;
    let label_of = move |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(labels_count(report))
        .x_label_formatter(&label_of)
        .y_desc(y_desc)
        .draw()
        .map_err(plot_error)?;
    Ok(chart)
}

/// Enough x labels that plotters puts one on every integer position.
fn labels_count(report: &AbReport) -> usize {
    report.cells.len().max(2)
}

/// A bar from `x - width/2` to `x + width/2`, 0 to `value`.
fn bar(x: f64, width: f64, value: f64, color: RGBColor) -> Rectangle<(f64, f64)> {
    Rectangle::new(
        [(x - width / 2.0, 0.0), (x + width / 2.0, value)],
        color.filled(),
    )
}

/// A vertical whisker from `low` to `high` at `x`, with caps.
fn whisker(x: f64, low: f64, high: f64) -> Vec<PathElement<(f64, f64)>> {
    let cap = 0.06;
    let style = BLACK.stroke_width(2);
    vec![
        PathElement::new(vec![(x, low), (x, high)], style),
        PathElement::new(vec![(x - cap, low), (x + cap, low)], style),
        PathElement::new(vec![(x - cap, high), (x + cap, high)], style),
    ]
}

/// The whisker of a ratio's interval around `base`.
fn ratio_whisker(x: f64, base: f64, r: Option<&PairedRatio>) -> Vec<PathElement<(f64, f64)>> {
    match r.and_then(|r| r.ci_low.zip(r.ci_high)) {
        Some((low, high)) => whisker(x, base * low, base * high),
        None => Vec::new(),
    }
}

/// The whisker of a fraction difference's interval around `base`, in percent.
fn difference_whisker(
    x: f64,
    base: f64,
    d: Option<&PairedDifference>,
) -> Vec<PathElement<(f64, f64)>> {
    match d.and_then(|d| d.ci_low.zip(d.ci_high)) {
        Some((low, high)) => whisker(x, (base + low) * 100.0, (base + high) * 100.0),
        None => Vec::new(),
    }
}

fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Panel<'a, DB>,
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

fn swatch(color: RGBColor) -> impl Fn((i32, i32)) -> Rectangle<(i32, i32)> {
    move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
}

/// `(cell index, throughput)` of every run, for the repetition dots.
fn repetition_values(report: &AbReport) -> Vec<(f64, f64)> {
    report
        .runs
        .iter()
        .filter_map(|r| {
            report
                .cells
                .iter()
                .position(|c| c.label == r.cell)
                .map(|i| (i as f64, r.report.throughput_rps))
        })
        .collect()
}

fn draw_throughput<DB: DrawingBackend>(
    report: &AbReport,
    area: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let reps = repetition_values(report);
    let base = report.cells.first().map_or(0.0, |c| c.throughput_rps);
    let top = reps
        .iter()
        .map(|(_, v)| *v)
        .chain(
            report
                .cells
                .iter()
                .filter_map(|c| c.ratio.and_then(|r| r.ci_high).map(|h| h * base)),
        )
        .fold(1.0_f64, f64::max)
        * 1.2;
    let caption = format!("throughput (ratio vs {})", report.baseline);
    let mut chart = panel(area, &caption, report, top, "requests/s")?;
    let light = RGBColor(130, 160, 210);
    chart
        .draw_series(
            report
                .cells
                .iter()
                .enumerate()
                .map(|(i, c)| bar(i as f64, 0.6, c.throughput_rps, light)),
        )
        .map_err(plot_error)?
        .label("mean")
        .legend(swatch(light));
    let whiskers = report
        .cells
        .iter()
        .enumerate()
        .flat_map(|(i, c)| ratio_whisker(i as f64, base, c.ratio.as_ref()));
    chart
        .draw_series(whiskers)
        .map_err(plot_error)?
        .label("95% CI vs baseline")
        .legend(|(x, y)| PathElement::new(vec![(x + 6, y - 6), (x + 6, y + 6)], BLACK));
    chart
        .draw_series(
            reps.iter()
                .map(|(i, v)| Circle::new((*i + 0.18, *v), 3, BLACK.filled())),
        )
        .map_err(plot_error)?
        .label("one repetition")
        .legend(|(x, y)| Circle::new((x + 6, y), 3, BLACK.filled()));
    let style =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(report.cells.iter().enumerate().map(|(i, c)| {
            let text = c
                .ratio
                .map_or_else(|| "1.000x".to_owned(), |r| format!("{:.3}x", r.ratio));
            Text::new(text, (i as f64, top / 1.2 * 1.1), style.clone())
        }))
        .map_err(plot_error)?;
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

fn draw_ttft<DB: DrawingBackend>(
    report: &AbReport,
    area: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let (base_mean, base_p99) = report
        .cells
        .first()
        .map_or((0.0, 0.0), |c| (c.ttft_mean_ms, c.ttft_p99_ms));
    let high = |c: &CellSummary| {
        let p99 = c
            .ttft_p99_ratio
            .and_then(|r| r.ci_high)
            .map_or(0.0, |h| h * base_p99);
        c.ttft_p99_ms.max(c.ttft_mean_ms).max(p99)
    };
    let top = report.cells.iter().map(high).fold(1.0_f64, f64::max) * 1.15;
    let mut chart = panel(area, "time to first token", report, top, "ms")?;
    type Series = (&'static str, RGBColor, f64, fn(&CellSummary) -> f64);
    let series: [Series; 2] = [
        ("p99", RGBColor(240, 170, 90), 0.7, |c| c.ttft_p99_ms),
        ("mean", RGBColor(190, 80, 40), 0.4, |c| c.ttft_mean_ms),
    ];
    for (label, color, width, value) in series {
        chart
            .draw_series(
                report
                    .cells
                    .iter()
                    .enumerate()
                    .map(|(i, c)| bar(i as f64, width, value(c), color)),
            )
            .map_err(plot_error)?
            .label(label)
            .legend(swatch(color));
    }
    let whiskers = report.cells.iter().enumerate().flat_map(|(i, c)| {
        let x = i as f64;
        let mut w = ratio_whisker(x - 0.1, base_mean, c.ttft_mean_ratio.as_ref());
        w.extend(ratio_whisker(x + 0.25, base_p99, c.ttft_p99_ratio.as_ref()));
        w
    });
    chart.draw_series(whiskers).map_err(plot_error)?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn draw_spill_cached<DB: DrawingBackend>(
    report: &AbReport,
    area: &DrawingArea<DB, Shift>,
) -> anyhow::Result<()> {
    let mut chart = panel(area, "spill and cached tokens", report, 110.0, "percent")?;
    let spill = RGBColor(120, 160, 90);
    let cached = RGBColor(110, 90, 170);
    chart
        .draw_series(
            report
                .cells
                .iter()
                .enumerate()
                .map(|(i, c)| bar(i as f64 - 0.17, 0.3, c.spill_fraction * 100.0, spill)),
        )
        .map_err(plot_error)?
        .label("spilled responses")
        .legend(swatch(spill));
    chart
        .draw_series(report.cells.iter().enumerate().map(|(i, c)| {
            let value = if c.cached_reported {
                c.cached_token_fraction * 100.0
            } else {
                0.0
            };
            bar(i as f64 + 0.17, 0.3, value, cached)
        }))
        .map_err(plot_error)?
        .label("cached prompt tokens")
        .legend(swatch(cached));
    let base = report
        .cells
        .first()
        .map_or(0.0, |c| c.cached_token_fraction);
    let whiskers = report
        .cells
        .iter()
        .enumerate()
        .filter(|(_, c)| c.cached_reported)
        .flat_map(|(i, c)| difference_whisker(i as f64 + 0.17, base, c.cached_difference.as_ref()));
    chart.draw_series(whiskers).map_err(plot_error)?;
    let style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(
            report
                .cells
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.cached_reported)
                .map(|(i, _)| Text::new("n/a", (i as f64 + 0.17, 2.0), style.clone())),
        )
        .map_err(plot_error)?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}
