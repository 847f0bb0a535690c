//! The workers panel: one load bar per worker, drawn against the bounded policy's two bounds
//! (`│` at `min + min_load_gap`, `┊` at `mean × max_load_skew`), with OVER on a worker whose keys
//! would spill and DOWN on one that failed its health checks. A bar shows the load the rule reads
//! (the fleet-wide load in `worker_metrics` mode); a worker the rule routes on local load because
//! its scrape is stale is drawn with `▒` instead of `█`. When some workers were found by DNS
//! discovery, the title counts workers by source and wide rows end with each worker's source.

use bch_core::fleet_load::LoadSource;
use bch_core::telemetry::WorkerRecord;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{truncate_left, truncate_middle};
use crate::state::{Fleet, FleetBound, Panel, State};

/// Marker drawn in a load bar at `min + min_load_gap`.
pub(super) const GAP_MARKER: char = '│';
/// Marker drawn in a load bar at `mean × max_load_skew`.
pub(super) const SKEW_MARKER: char = '┊';
/// Marker when both bounds fall in the same cell.
const BOTH_MARKER: char = '╫';
/// Bar cell of a worker whose scrape is stale (the rule reads local load for it).
const STALE_CELL: char = '▒';
/// Inner width from which each row also shows the worker's request, spill and error counters.
const STATS_FROM: u16 = 86;
/// Widest source label a row shows (`dns:_http._tcp.llm…cluster.local`).
const SOURCE_W: usize = 24;

/// Draws the workers panel at `area`: the bound legend, then one row per worker from the scroll
/// offset on.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let fleet = state.visible();
    let focused = state.ui().focus() == Panel::Workers;
    let block = panel_block(focused, title(fleet, styles), styles);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height == 0 || inner.width < 12 {
        return;
    }
    let bound = fleet.bound();
    let geometry = Geometry::new(fleet, bound, inner.width);
    let rows_h = inner.height.saturating_sub(1) as usize;
    let scroll = state.scroll(Panel::Workers);
    let start = scroll_window(frame, area, scroll, fleet.workers.len(), rows_h, styles);
    let mut lines = vec![legend(fleet, bound, inner.width, styles)];
    lines.extend(
        fleet
            .workers
            .iter()
            .skip(start)
            .take(rows_h)
            .map(|w| worker_line(w, bound, &geometry, styles)),
    );
    frame.render_widget(Paragraph::new(lines), inner);
}

/// ` Workers 3/4 healthy `, plus `fleet load` when the rule reads the workers' own gauges, and
/// ` 3 discovered, 1 static ` when discovery found some of them.
fn title(fleet: &Fleet, styles: &Styles) -> Line<'static> {
    let healthy = fleet.workers.iter().filter(|w| w.healthy).count();
    let mut spans = vec![
        Span::raw(" Workers "),
        Span::styled(
            format!("{healthy}/{} healthy ", fleet.workers.len()),
            styles.dim(),
        ),
    ];
    if fleet
        .policy
        .is_some_and(|p| p.load_source == LoadSource::WorkerMetrics)
    {
        spans.push(Span::styled("· fleet load ", styles.value()));
    }
    let discovered = fleet
        .workers
        .iter()
        .filter(|w| w.source.is_discovered())
        .count();
    if discovered > 0 {
        let configured = fleet.workers.len() - discovered;
        spans.push(Span::styled(
            format!("· {discovered} discovered, {configured} static "),
            styles.dim(),
        ));
    }
    Line::from(spans)
}

/// The first row: what the two markers stand for, in requests, and the min and mean they come
/// from when the row has room.
fn legend(fleet: &Fleet, bound: Option<FleetBound>, width: u16, styles: &Styles) -> Line<'static> {
    let Some(b) = bound else {
        return if fleet.workers.is_empty() {
            Line::from(Span::styled("no workers", styles.dim()))
        } else {
            Line::from(Span::styled(
                "no healthy worker: no bound",
                styles.tone(Tone::Alert),
            ))
        };
    };
    let mut spans = vec![
        Span::styled(format!("{GAP_MARKER} "), styles.gap_marker()),
        Span::raw(format!("min+gap {}  ", b.gap_bound())),
        Span::styled(format!("{SKEW_MARKER} "), styles.skew_marker()),
        Span::raw(format!("mean×skew {:.2}", b.skew_bound())),
    ];
    let load = b.load();
    let inputs = format!("  min {} mean {:.2}", load.min_load, load.mean_load);
    let stale = fleet.workers.iter().any(|w| w.load_stale);
    if stale {
        // What the stale cells mean matters more than the inputs, which the bars show.
        spans.push(Span::styled(
            format!("  {STALE_CELL} stale: local load"),
            styles.tone(Tone::Warning),
        ));
    }
    let used: usize = spans.iter().map(|s| s.width()).sum();
    // The inputs are derivable from the bars; drop them rather than cut them mid-number.
    if used + inputs.chars().count() <= width as usize {
        spans.push(Span::styled(inputs, styles.dim()));
    }
    Line::from(spans)
}

/// Column widths shared by every row, and the load that the full bar width stands for.
struct Geometry {
    name_w: usize,
    bar_w: usize,
    /// In-flight requests at the bar's right end.
    scale: f64,
    stats: bool,
    /// Width of the source column that wide rows end with; 0 unless some worker was discovered.
    source_w: usize,
}

impl Geometry {
    fn new(fleet: &Fleet, bound: Option<FleetBound>, width: u16) -> Self {
        let name_w = fleet
            .workers
            .iter()
            .map(|w| w.name.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(4, 16);
        let stats = width >= STATS_FROM;
        let stats_w = if stats { 30 } else { 0 };
        let discovered = fleet.workers.iter().any(|w| w.source.is_discovered());
        let source_w = if stats && discovered {
            fleet
                .workers
                .iter()
                .map(|w| w.source.label().chars().count())
                .max()
                .unwrap_or(0)
                .min(SOURCE_W)
        } else {
            0
        };
        // glyph + space, name, space, bar, active (5), flag (5), stats, two spaces + source. The
        // counters are 38 wide, not 30: rows without a source column let the panel clip them.
        let source_slot = if source_w > 0 {
            38 - stats_w + 2 + source_w
        } else {
            0
        };
        let fixed = 2 + name_w + 1 + 5 + 5 + stats_w + source_slot;
        let bar_w = (width as usize).saturating_sub(fixed).max(4);
        let max_active = fleet
            .workers
            .iter()
            .map(WorkerRecord::rule_load)
            .max()
            .unwrap_or(0);
        let mut scale = max_active as f64;
        if let Some(b) = bound {
            scale = scale.max(b.gap_bound() as f64).max(b.skew_bound());
        }
        Self {
            name_w,
            bar_w,
            // Headroom so the bound markers never sit on the panel's edge.
            scale: (scale * 1.25).max(4.0),
            stats,
            source_w,
        }
    }

    /// The bar cell a bound at `load` requests is drawn in.
    fn cell_of(&self, load: f64) -> usize {
        ((load / self.scale * self.bar_w as f64).round() as usize).min(self.bar_w - 1)
    }

    /// How many cells of the bar `active` requests fill.
    fn filled(&self, active: u64) -> usize {
        ((active as f64 / self.scale * self.bar_w as f64).round() as usize).min(self.bar_w)
    }
}

/// `● w0   ███│██┊█···    9 OVER  req …`: health glyph, name, bar, load, flag, counters.
fn worker_line(
    w: &WorkerRecord,
    bound: Option<FleetBound>,
    geometry: &Geometry,
    styles: &Styles,
) -> Line<'static> {
    // The same test the gateway routes with: OVER means a new request for this worker's keys
    // would spill.
    let over = w.healthy && bound.is_some_and(|b| b.check(w.rule_load()).should_spill());
    let (glyph, glyph_style) = if w.healthy {
        ("●", styles.tone(Tone::Good))
    } else {
        ("✗", styles.status(Tone::Alert))
    };
    let name_w = geometry.name_w;
    let mut spans = vec![
        Span::styled(format!("{glyph} "), glyph_style),
        Span::styled(
            format!("{:<name_w$} ", truncate_left(&w.name, name_w)),
            styles.name(w.healthy),
        ),
    ];
    spans.extend(load_bar(w, over, bound, geometry, styles));
    spans.push(Span::styled(
        format!("{:>5}", w.rule_load()),
        styles.value(),
    ));
    spans.push(flag(w.healthy, over, styles));
    if geometry.stats {
        spans.push(counters(w, styles));
    }
    if geometry.source_w > 0 {
        let source = truncate_middle(&w.source.label(), geometry.source_w);
        spans.push(Span::styled(format!("  {source}"), styles.dim()));
    }
    Line::from(spans)
}

/// The bar's cells: filled up to the load, dotted after it, with the bound markers on top.
fn load_bar(
    w: &WorkerRecord,
    over: bool,
    bound: Option<FleetBound>,
    geometry: &Geometry,
    styles: &Styles,
) -> Vec<Span<'static>> {
    let bar_style = styles.load_bar(w.healthy, over);
    let filled = geometry.filled(w.rule_load());
    let fill = if w.load_stale { STALE_CELL } else { '█' };
    let gap_col = bound.map(|b| geometry.cell_of(b.gap_bound() as f64));
    let skew_col = bound.map(|b| geometry.cell_of(b.skew_bound()));
    (0..geometry.bar_w)
        .map(|i| {
            let marker = (gap_col == Some(i), skew_col == Some(i));
            bar_cell(i < filled, fill, marker, bar_style, styles)
        })
        .collect()
}

/// One cell of a bar: a marker if one of the bounds (`(gap, skew)`) falls here, else `fill` or
/// empty.
fn bar_cell(
    in_bar: bool,
    fill: char,
    (is_gap, is_skew): (bool, bool),
    bar_style: Style,
    styles: &Styles,
) -> Span<'static> {
    let (ch, style) = match (is_gap, is_skew) {
        (true, true) => (BOTH_MARKER, styles.gap_marker()),
        (true, false) => (GAP_MARKER, styles.gap_marker()),
        (false, true) => (SKEW_MARKER, styles.skew_marker()),
        (false, false) if in_bar => (fill, bar_style),
        (false, false) => ('·', styles.dim()),
    };
    let style = if in_bar && (is_gap || is_skew) {
        styles.marker_on_bar(style, bar_style)
    } else {
        style
    };
    Span::styled(ch.to_string(), style)
}

/// ` DOWN`, ` OVER` or blanks of the same width, so the counters stay in one column.
fn flag(healthy: bool, over: bool, styles: &Styles) -> Span<'static> {
    if !healthy {
        Span::styled(" DOWN", styles.status(Tone::Alert))
    } else if over {
        Span::styled(" OVER", styles.status(Tone::Alert))
    } else {
        Span::raw("     ")
    }
}

/// `  req  812 in    1 out    4 err   0`: cumulative counters, shown when the panel is wide.
fn counters(w: &WorkerRecord, styles: &Styles) -> Span<'static> {
    Span::styled(
        format!(
            "  req {:>6} in {:>4} out {:>4} err {:>3}",
            w.requests_total, w.spilled_in_total, w.spilled_out_total, w.errors_total
        ),
        styles.dim(),
    )
}
