//! The workers panel: one load bar per worker, drawn against the bounded policy's two bounds
//! (`│` at `min + min_load_gap`, `┊` at `mean × max_load_skew`), with OVER on a worker whose keys
//! would spill, DOWN on one that failed its health checks and DRAIN on one being drained. A bar
//! shows the load the rule reads (the fleet-wide load in `worker_metrics` mode); a worker the rule
//! routes on local load because its scrape is stale is drawn with `▒` instead of `█`. The title
//! counts the OVER workers, so one scrolled out of view is not missed; the numbers come before the
//! bar: the counters are added (errors first) only while the bar keeps its room. When some workers
//! were found by DNS discovery, the title counts workers by source and rows with room left after
//! every counter end with each worker's source.
//!
//! A DOWN worker whose health probes fail shows why in place of its bar (`tls: certificate not
//! trusted (UnknownIssuer)`, `refused`, `status 503`): the rule routes nothing new to it, so its bar
//! says less than the reason does; its load still shows in the number beside it.
//!
//! A worker with a capacity (`max_in_flight`) has a `┃` in its bar at the cap, and the bar's scale
//! reaches it; FULL marks a worker at its cap (or whose engine reported saturation): it takes no
//! new request, and an explicit key preferring it moves on at once. The title counts the FULL
//! workers and names the fleet's default cap.
//!
//! The panel costs about the same at 16 workers as at 10,000: one [`Census`] pass gives the title,
//! the legend and the columns what they need from the whole fleet, and only the rows on screen are
//! built ([`State::worker_window`]). When not every worker has a row, a fleet summary row follows
//! the legend (`fleet_summary`). While the `f` search is typed, its prompt takes the legend's row.

use bch_core::fleet_load::LoadSource;
use bch_core::telemetry::{Open, PolicyRecord, WorkerRecord, WorkerState};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::fleet_summary::{Census, summary_line};
use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{printable, truncate_left, truncate_middle, truncate_right};
use crate::state::{FleetBound, FleetPicture, Panel, State, WorkerOrder};

/// Marker drawn in a load bar at `min + min_load_gap`.
pub(super) const GAP_MARKER: char = '│';
/// Marker drawn in a load bar at `mean × max_load_skew`.
pub(super) const SKEW_MARKER: char = '┊';
/// Marker drawn in a worker's load bar at its capacity.
pub(super) const CAP_MARKER: char = '┃';
/// Marker when both bounds fall in the same cell.
const BOTH_MARKER: char = '╫';
/// The bar keeps at least this many cells before a counter is added to the rows.
const MIN_BAR: usize = 12;
/// Below this many bar cells, worker names give way (down to [`MIN_NAME_W`]).
const LEAST_BAR: usize = 4;
/// Widest worker name shown; longer ones are cut from the left.
const MAX_NAME_W: usize = 24;
/// Names are cut no shorter than this: `…1.17:8000` keeps the port.
const MIN_NAME_W: usize = 10;
/// Bar cell of a worker whose scrape is stale (the rule reads local load for it).
const STALE_CELL: char = '▒';
/// Widest source label a row shows (`dns:_http._tcp.llm…cluster.local`).
const SOURCE_W: usize = 24;
/// Worker rows the fleet summary must leave: on a shorter panel the workers themselves matter more.
const SUMMARY_MIN_ROWS: usize = 3;
/// Narrowest cut of a source label worth showing (`dns:_htt…l.local`).
const MIN_SOURCE: usize = 16;

/// Worker rows a workers panel `height` rows tall (borders included) shows for a fleet of
/// `workers`: all but the borders and the legend, and one fewer when they cannot all be shown and
/// the fleet summary takes a row.
pub(super) fn content_rows(workers: usize, height: u16) -> usize {
    let rows = usize::from(height.saturating_sub(3));
    if summary_shown(workers, rows) {
        rows - 1
    } else {
        rows
    }
}

/// Whether the fleet summary row is drawn: when `workers` do not all fit in `rows`, and the panel
/// is tall enough that giving a row up still leaves [`SUMMARY_MIN_ROWS`] worker rows.
fn summary_shown(workers: usize, rows: usize) -> bool {
    workers > rows && rows > SUMMARY_MIN_ROWS
}

/// Draws the workers panel at `area`: the bound legend (or the search prompt), the fleet summary
/// when not every worker fits, then one row per worker from the scroll offset on.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let fleet = state.visible();
    let focused = state.ui().focus() == Panel::Workers;
    let bound = fleet.bound();
    let rule = fleet.over_rule();
    let census = Census::of(fleet, &rule, MAX_NAME_W.max(SOURCE_W));
    let block = panel_block(
        focused,
        title(fleet, &census, state.ui().worker_order(), styles),
        styles,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height == 0 || inner.width < 12 {
        return;
    }
    let geometry = Geometry::new(&census, bound, inner.width);
    let summary = summary_shown(fleet.workers.len(), usize::from(inner.height - 1));
    let rows_h = usize::from(inner.height - 1) - usize::from(summary);
    let scroll = state.scroll(Panel::Workers);
    let start = scroll_window(frame, area, scroll, fleet.workers.len(), rows_h, styles);
    let rows = state.worker_window(start, rows_h);
    // The selection shows only while the panel has focus, where the drain keys are meant for it.
    let selected = focused.then(|| selected_name(state)).flatten();
    let first = match state.ui().search() {
        Some(needle) => search_prompt(state, needle, styles),
        None => match state.pool() {
            Some(model) if fleet.workers.is_empty() => no_worker_serves(model, state, styles),
            _ => legend(fleet, &census, bound, inner.width, styles),
        },
    };
    let mut lines = vec![first];
    if summary {
        lines.push(summary_line(
            fleet,
            &census,
            usize::from(inner.width),
            styles,
        ));
    }
    lines.extend(rows.iter().map(|w| {
        let picked = selected == Some(w.name.as_str());
        worker_line(w, rule.over(w), bound, &geometry, picked, styles)
    }));
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `no worker serves MODEL; models: a, b` for a picked pool without workers (a mistyped
/// `--model`), naming the models the whole fleet serves once it is known.
fn no_worker_serves(model: &str, state: &State, styles: &Styles) -> Line<'static> {
    let whole = state.whole();
    let model = printable(model);
    let text = if whole.workers.is_empty() {
        format!("no worker serves {model} (yet)")
    } else if whole.models().is_empty() {
        format!("no worker serves {model}: no worker declares a model; m shows all")
    } else {
        let models: Vec<String> = (whole.models().into_iter())
            .map(|m| printable(m).into_owned())
            .collect();
        format!("no worker serves {model}; models: {}", models.join(", "))
    };
    Line::from(Span::styled(text, styles.tone(Tone::Warning)))
}

/// The name of the worker the drain keys act on ([`State::selected_worker`]), without ordering
/// the fleet: the picked one while it exists, else the first row.
fn selected_name(state: &State) -> Option<&str> {
    match state.ui().selected_worker() {
        Some(name) if state.visible().workers.iter().any(|w| w.name == name) => Some(name),
        _ => state.worker_window(0, 1).first().map(|w| w.name.as_str()),
    }
}

/// `find gpu-066▏  12 match · Enter keeps · Esc back`: the open search and what it finds.
fn search_prompt(state: &State, needle: &str, styles: &Styles) -> Line<'static> {
    let matches = match state.worker_matches(needle) {
        _ if needle.is_empty() => "type part of a name".to_owned(),
        0 => "no match".to_owned(),
        n => format!("{n} match"),
    };
    Line::from(vec![
        Span::styled(format!("find {needle}▏ "), styles.prompt()),
        Span::styled(format!(" {matches} · Enter keeps · Esc back"), styles.dim()),
    ])
}

/// ` Workers 3/4 healthy 2 OVER 1 draining by load `, plus `fleet load` when the rule reads the
/// workers' own gauges, and ` 3 discovered, 1 static ` when discovery found some of them.
fn title(
    fleet: &FleetPicture,
    census: &Census,
    order: WorkerOrder,
    styles: &Styles,
) -> Line<'static> {
    let healthy = census.healthy;
    let mut spans = vec![
        Span::raw(" Workers "),
        Span::styled(
            format!("{healthy}/{} healthy ", fleet.workers.len()),
            styles.dim(),
        ),
    ];
    let full = census.full;
    if full > 0 {
        spans.push(Span::styled(
            format!("{full} FULL "),
            styles.status(Tone::Alert),
        ));
    }
    let over = census.over;
    if over > 0 {
        spans.push(Span::styled(
            format!("{over} OVER "),
            styles.status(Tone::Alert),
        ));
    }
    let draining = census.draining;
    if draining > 0 {
        spans.push(Span::styled(
            format!("{draining} draining "),
            styles.status(Tone::Warning),
        ));
    }
    if order == WorkerOrder::Load {
        spans.push(Span::styled("by load ", styles.dim()));
    }
    if let Some(cap) = fleet
        .policy
        .map(|p| p.admission.max_in_flight_per_worker)
        .filter(|&cap| cap > 0)
    {
        spans.push(Span::styled(format!("· cap {cap} "), styles.value()));
    }
    if fleet
        .policy
        .is_some_and(|p| p.load_source == LoadSource::WorkerMetrics)
    {
        spans.push(Span::styled("· fleet load ", styles.value()));
    }
    let discovered = census.discovered;
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
fn legend(
    fleet: &FleetPicture,
    census: &Census,
    bound: Option<FleetBound>,
    width: u16,
    styles: &Styles,
) -> Line<'static> {
    let Some(b) = bound else {
        let line = match fleet.policy {
            Some(_) if fleet.policy_unknown.is_some() => Line::from(Span::styled(
                format!(
                    "no bound shown: this console does not know the gateway's {}",
                    fleet
                        .policy_unknown
                        .iter()
                        .flat_map(PolicyRecord::unknown_names)
                        .map(|name| printable(&name).into_owned())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                styles.tone(Tone::Warning),
            )),
            Some(policy) if !fleet.bound_in_force() => Line::from(Span::styled(
                format!("no bound: {} never spills", policy.kind),
                styles.dim(),
            )),
            _ if fleet.workers.is_empty() => Line::from(Span::styled("no workers", styles.dim())),
            // Each pool has its own bound: OVER is by each worker's pool, the bars carry no marks.
            _ if fleet.several_pools() => Line::from(Span::styled(
                format!("{} pools, a bound each: m shows one", fleet.models().len()),
                styles.dim(),
            )),
            _ => Line::from(Span::styled(
                "no healthy worker: no bound",
                styles.tone(Tone::Alert),
            )),
        };
        return with_cap_legend(census, line.spans, width, styles);
    };
    let mut spans = vec![
        Span::styled(format!("{GAP_MARKER} "), styles.gap_marker()),
        Span::raw(format!("min+gap {}  ", b.gap_bound())),
        Span::styled(format!("{SKEW_MARKER} "), styles.skew_marker()),
        Span::raw(format!("mean×skew {:.2}", b.skew_bound())),
    ];
    let load = b.load();
    let inputs = format!("  min {} mean {:.2}", load.min_load, load.mean_load);
    if census.any_stale {
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
    with_cap_legend(census, spans, width, styles)
}

/// `spans` and, when some worker has a capacity and the row has room, what its marker means.
fn with_cap_legend(
    census: &Census,
    mut spans: Vec<Span<'static>>,
    width: u16,
    styles: &Styles,
) -> Line<'static> {
    let used: usize = spans.iter().map(|s| s.width()).sum();
    // `  ┃ cap`
    let legend_w = 7;
    if census.any_capacity && used + legend_w <= width as usize {
        spans.push(Span::styled(format!("  {CAP_MARKER}"), styles.cap_marker()));
        spans.push(Span::raw(" cap"));
    }
    Line::from(spans)
}

/// A counter a worker row can show, in the order they are added as the panel widens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counter {
    Errors,
    SpilledOut,
    SpilledIn,
    Requests,
}

impl Counter {
    /// Priority order: errors say something is wrong, spills what the policy does, requests are
    /// the least urgent.
    const BY_PRIORITY: [Counter; 4] = [
        Counter::Errors,
        Counter::SpilledOut,
        Counter::SpilledIn,
        Counter::Requests,
    ];

    /// The label and the digits its column keeps.
    fn label(self) -> (&'static str, usize) {
        match self {
            Counter::Errors => ("err", 4),
            Counter::SpilledOut => ("out", 5),
            Counter::SpilledIn => ("in", 5),
            Counter::Requests => ("req", 7),
        }
    }

    /// The counter's value for `w`.
    fn value(self, w: &WorkerRecord) -> u64 {
        match self {
            Counter::Errors => w.errors_total,
            Counter::SpilledOut => w.spilled_out_total,
            Counter::SpilledIn => w.spilled_in_total,
            Counter::Requests => w.requests_total,
        }
    }

    /// Columns this counter takes: `  err 1234`.
    fn width(self) -> usize {
        let (label, digits) = self.label();
        2 + label.len() + 1 + digits
    }
}

/// Column widths shared by every row, and the load that the full bar width stands for.
struct Geometry {
    name_w: usize,
    bar_w: usize,
    /// In-flight requests at the bar's right end.
    scale: f64,
    /// Counters shown, in display order (requests first).
    counters: Vec<Counter>,
    /// Width of the source column that rows end with; 0 unless some worker was discovered and
    /// every counter fits beside it.
    source_w: usize,
}

impl Geometry {
    fn new(census: &Census, bound: Option<FleetBound>, width: u16) -> Self {
        let name_w = census.name_w.clamp(4, MAX_NAME_W);
        // glyph + marker, space, active (5), flag (6): then the name, the bar and the counters.
        // Names stay whole while the bar keeps its least; below that they are cut from the left.
        let name_w = name_w
            .min((width as usize).saturating_sub(2 + 1 + 5 + 6 + LEAST_BAR))
            .max(MIN_NAME_W.min(name_w));
        let fixed = 2 + name_w + 1 + 5 + 6;
        let mut left = (width as usize).saturating_sub(fixed);
        let mut counters = Vec::new();
        for counter in Counter::BY_PRIORITY {
            if left >= MIN_BAR + counter.width() {
                left -= counter.width();
                counters.push(counter);
            }
        }
        // Display order is the reverse of priority: `req … in … out … err`, errors at the edge.
        counters.reverse();
        let source_w = source_width(census, counters.len(), left);
        if source_w > 0 {
            left -= 2 + source_w;
        }
        let bar_w = left.max(4);
        // The bar reaches every worker's cap, so the cap marker is always on it.
        let mut scale = census.max_load.max(census.max_cap) as f64;
        if let Some(b) = bound {
            scale = scale.max(b.gap_bound() as f64).max(b.skew_bound());
        }
        Self {
            name_w,
            bar_w,
            // Headroom so the bound markers never sit on the panel's edge.
            scale: (scale * 1.25).max(4.0),
            counters,
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

/// Columns of the source label that rows end with (two spaces before it): the least urgent
/// column, so only when some worker was discovered, all `shown` counters fit and `left` cells
/// leave the bar its room; cut in the middle to what is left, but never below [`MIN_SOURCE`].
fn source_width(census: &Census, shown: usize, left: usize) -> usize {
    if shown < Counter::BY_PRIORITY.len() || census.discovered == 0 {
        return 0;
    }
    let widest = census.source_w.min(SOURCE_W);
    let room = left.saturating_sub(MIN_BAR + 2).min(widest);
    if room >= MIN_SOURCE.min(widest) {
        room
    } else {
        0
    }
}

/// `●▸w0   ███│██┊█···    9 OVER  req …`: health glyph, the selection mark, name, bar, load,
/// flag, counters.
///
/// `over` is [`crate::state::OverRule::over`]: the same test the gateway routes with, by the worker's pool's
/// bound; OVER means a new request for this worker's keys would spill.
fn worker_line(
    w: &WorkerRecord,
    over: bool,
    bound: Option<FleetBound>,
    geometry: &Geometry,
    selected: bool,
    styles: &Styles,
) -> Line<'static> {
    let (glyph, glyph_style) = if w.healthy {
        ("●", styles.tone(Tone::Good))
    } else {
        ("✗", styles.status(Tone::Alert))
    };
    let name_w = geometry.name_w;
    let mut spans = vec![
        Span::styled(glyph, glyph_style),
        Span::styled(if selected { "▸" } else { " " }, styles.value()),
        Span::styled(
            format!("{:<name_w$} ", truncate_left(&w.name, name_w)),
            styles.name(w.healthy, selected),
        ),
    ];
    match w.probe_failure.as_deref().filter(|_| !w.healthy) {
        Some(reason) => spans.push(probe_failure(reason, geometry.bar_w, styles)),
        None => spans.extend(load_bar(w, over, bound, geometry, styles)),
    }
    spans.push(Span::styled(
        format!("{:>5}", w.rule_load()),
        styles.value(),
    ));
    spans.push(flag(w, over, styles));
    spans.extend(counters(w, &geometry.counters, styles));
    if geometry.source_w > 0 {
        let source = truncate_middle(&w.source.to_string(), geometry.source_w);
        spans.push(Span::styled(format!("  {source}"), styles.dim()));
    }
    Line::from(spans)
}

/// A failing probe's reason in the bar's `bar_w` cells: gateway text, so made printable first, then
/// cut at the right like the discovery errors (the kind, `tls: certificate not trusted`, leads).
fn probe_failure(reason: &str, bar_w: usize, styles: &Styles) -> Span<'static> {
    let reason = truncate_right(&printable(reason), bar_w);
    Span::styled(format!("{reason:<bar_w$}"), styles.tone(Tone::Alert))
}

/// The bar's cells: filled up to the load, dotted after it, with the bound markers on top.
fn load_bar(
    w: &WorkerRecord,
    over: bool,
    bound: Option<FleetBound>,
    geometry: &Geometry,
    styles: &Styles,
) -> Vec<Span<'static>> {
    let bar_style = styles.load_bar(w.healthy, over || w.full);
    let filled = geometry.filled(w.rule_load());
    let fill = if w.load_stale { STALE_CELL } else { '█' };
    let gap_col = bound.map(|b| geometry.cell_of(b.gap_bound() as f64));
    let skew_col = bound.map(|b| geometry.cell_of(b.skew_bound()));
    let cap_col = w.capacity.map(|cap| geometry.cell_of(cap as f64));
    (0..geometry.bar_w)
        .map(|i| {
            if cap_col == Some(i) {
                // The cap is this worker's own limit: it wins the cell over the fleet's bounds.
                let style = if i < filled {
                    styles.marker_on_bar(styles.cap_marker(), bar_style)
                } else {
                    styles.cap_marker()
                };
                return Span::styled(CAP_MARKER.to_string(), style);
            }
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

/// ` DOWN `, ` DRAIN`, ` FULL `, ` OVER ` or blanks of the same width, so the counters stay in one
/// column. FULL before OVER: a full worker takes nothing, whatever the bound says. A state this
/// console does not know (a newer gateway's) is shown by its name, cut to the column: the worker
/// is not counted as taking requests.
fn flag(w: &WorkerRecord, over: bool, styles: &Styles) -> Span<'static> {
    if !w.healthy {
        Span::styled(" DOWN ", styles.status(Tone::Alert))
    } else if let Open::Unknown(state) = &w.state {
        Span::styled(
            format!(" {:<5}", truncate_right(state, 5)),
            styles.status(Tone::Warning),
        )
    } else if w.state == WorkerState::Draining {
        Span::styled(" DRAIN", styles.status(Tone::Warning))
    } else if w.full {
        Span::styled(" FULL ", styles.status(Tone::Alert))
    } else if over {
        Span::styled(" OVER ", styles.status(Tone::Alert))
    } else {
        Span::raw("      ")
    }
}

/// `  req  812  in    1  out    4  err   0`: the cumulative counters the width allows; a value
/// wider than its column pushes the row on rather than being cut.
fn counters(w: &WorkerRecord, shown: &[Counter], styles: &Styles) -> Vec<Span<'static>> {
    shown
        .iter()
        .map(|counter| {
            let (label, digits) = counter.label();
            let value = counter.value(w);
            let style = if *counter == Counter::Errors && value > 0 {
                styles.tone(Tone::Alert)
            } else {
                styles.dim()
            };
            Span::styled(format!("  {label} {value:>digits$}"), style)
        })
        .collect()
}
