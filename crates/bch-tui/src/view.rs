//! Drawing. Everything here reads `&State` and the time passed in, and writes only to the frame:
//! rendering cannot change state, and the same state at the same `now` draws the same screen (the
//! snapshot tests rely on it).
//!
//! Distinctions that matter to an operator (healthy or not, over the bound or not, spilled or not,
//! focused panel) are carried by glyphs and words as well as colour, so they survive a monochrome
//! terminal, a screen reader and a text snapshot.

use bch_core::policy::Branch;
use bch_core::telemetry::{KeyRecord, SpillEvent, WorkerRecord};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Cell, Clear, Paragraph, Row, Sparkline, Table};
use tokio::time::Instant;

use crate::conn::ConnStatus;
use crate::input::BINDINGS;
use crate::state::{Change, CommandEntry, CommandState, Fleet, FleetBound, Panel, Sample, State};

/// Marker drawn in a load bar at `min + min_load_gap`.
pub const GAP_MARKER: char = '│';
/// Marker drawn in a load bar at `mean × max_load_skew`.
pub const SKEW_MARKER: char = '┊';
/// Marker when both bounds fall in the same cell.
pub const BOTH_MARKER: char = '╫';
/// Widths at or above this get the two-column layout with the key table beside the spill log.
pub const WIDE: u16 = 120;

const PALETTE: [Color; 12] = [
    Color::Cyan,
    Color::Green,
    Color::Yellow,
    Color::Blue,
    Color::Magenta,
    Color::Red,
    Color::LightCyan,
    Color::LightGreen,
    Color::LightYellow,
    Color::LightBlue,
    Color::LightMagenta,
    Color::LightRed,
];

/// The one-character tag of the `i`-th worker in the ring panel: A–Z, a–z, 0–9, then `*`.
pub fn worker_glyph(i: usize) -> char {
    const GLYPHS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    GLYPHS.get(i).map_or('*', |&b| b as char)
}

fn worker_color(i: usize) -> Color {
    PALETTE[i % PALETTE.len()]
}

/// Where each part of the screen goes.
#[derive(Debug, Clone, Copy)]
struct Areas {
    header: Rect,
    workers: Rect,
    ring: Rect,
    keys: Rect,
    spills: Rect,
}

fn layout(area: Rect, workers: usize) -> Areas {
    let [header, body] = Layout::vertical([Constraint::Length(4), Constraint::Min(0)]).areas(area);
    if area.width >= WIDE {
        let worker_rows = (workers as u16).saturating_add(3);
        let top_h = worker_rows.clamp(7, (body.height * 9 / 20).max(7));
        let [top, bottom] =
            Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(body);
        let [workers, ring] =
            Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(top);
        // Even split: a spill line with all its numbers needs about 80 columns.
        let [keys, spills] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .areas(bottom);
        Areas {
            header,
            workers,
            ring,
            keys,
            spills,
        }
    } else {
        let [top, keys, spills] = Layout::vertical([
            Constraint::Percentage(36),
            Constraint::Percentage(36),
            Constraint::Min(0),
        ])
        .areas(body);
        let [workers, ring] =
            Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(top);
        Areas {
            header,
            workers,
            ring,
            keys,
            spills,
        }
    }
}

/// Content rows each panel shows on a terminal of `area`, indexed like [`Panel::ALL`]: the app
/// hands them to the state so scrolling stops where the view does (no dead key presses past the
/// end).
pub fn viewports(area: Rect, state: &State) -> [usize; 4] {
    let a = layout(area, state.visible().workers.len());
    // Borders take two rows; workers, ring and keys also spend one on a legend, strip or header.
    let rows = |r: Rect, extra: u16| r.height.saturating_sub(2 + extra) as usize;
    [
        rows(a.workers, 1),
        rows(a.ring, 1),
        rows(a.keys, 1),
        rows(a.spills, 0),
    ]
}

/// Draws the whole console.
pub fn draw(frame: &mut Frame, state: &State, now: Instant) {
    let area = frame.area();
    let a = layout(area, state.visible().workers.len());
    draw_header(frame, a.header, state, now);
    draw_workers(frame, a.workers, state);
    draw_ring(frame, a.ring, state);
    draw_keys(frame, a.keys, state);
    draw_spills(frame, a.spills, state);
    if state.ui().help_open() {
        draw_help(frame, area);
    }
}

fn panel_block<'a>(state: &State, panel: Panel, title: Line<'a>) -> Block<'a> {
    let focused = state.ui().focus() == panel;
    let block = Block::bordered().title(title);
    if focused {
        block
            .border_type(BorderType::Double)
            .border_style(Style::new().fg(Color::Cyan))
    } else {
        block.border_style(Style::new().fg(Color::DarkGray))
    }
}

/// First row to show so that `scroll` is honoured without leaving empty space below the content.
fn clamp_scroll(scroll: usize, len: usize, visible: usize) -> usize {
    scroll.min(len.saturating_sub(visible))
}

/// `" 17–32 of 64 "` when a panel holds more rows than it shows, so hidden rows are never a
/// surprise.
fn position_hint(start: usize, visible: usize, len: usize) -> Option<Line<'static>> {
    (len > visible).then(|| {
        let end = (start + visible).min(len);
        Line::from(Span::styled(
            format!(" {}–{end} of {len} ", start + 1),
            Style::new().fg(Color::DarkGray),
        ))
        .right_aligned()
    })
}

/// Draws `hint` on the bottom border of the panel at `area`, right-aligned.
fn render_hint(frame: &mut Frame, area: Rect, hint: Option<Line<'static>>) {
    let Some(hint) = hint else { return };
    if area.height < 2 || area.width < 4 {
        return;
    }
    let row = Rect::new(area.x + 1, area.bottom() - 1, area.width - 2, 1);
    frame.render_widget(Paragraph::new(hint), row);
}

fn draw_header(frame: &mut Frame, area: Rect, state: &State, now: Instant) {
    let fleet = state.live();
    let [l1, l2, l3, l4] = Layout::vertical([Constraint::Length(1); 4]).areas(area);

    let (dot, color) = match state.conn() {
        ConnStatus::Connected => ("●", Color::Green),
        ConnStatus::Connecting => ("○", Color::Yellow),
        ConnStatus::Reconnecting { .. } => ("○", Color::Red),
    };
    let mut line1 = vec![
        Span::styled(" bch ", Style::new().bold().reversed()),
        Span::raw(" "),
        Span::styled(
            format!("{dot} {}", state.conn().label(now)),
            Style::new().fg(color).bold(),
        ),
        Span::raw("  "),
        Span::raw(state.url().to_owned()),
    ];
    line1.push(Span::raw(format!("  dropped {}", fleet.dropped_events)));
    if state.resyncing() {
        line1.push(Span::styled(
            "  RESYNCING",
            Style::new().fg(Color::Yellow).bold(),
        ));
    }
    if state.paused() {
        line1.push(Span::styled(
            format!("  PAUSED at {}", clock(state.visible().ts_ms)),
            Style::new().fg(Color::Black).bg(Color::Yellow).bold(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(line1)), l1);

    let dim = Style::new().fg(Color::DarkGray);
    let line2 = match &fleet.policy {
        Some(p) => {
            let mut spans = vec![
                Span::styled(" policy ", dim),
                Span::styled(p.kind.as_str(), Style::new().bold()),
                Span::styled("  gap ", dim),
                Span::styled(p.min_load_gap.to_string(), Style::new().bold()),
                Span::styled("  skew ", dim),
                Span::styled(format!("{:.2}", p.max_load_skew), Style::new().bold()),
                Span::styled("  req/s ", dim),
                Span::raw(format!("{:.1}", fleet.totals.requests_per_s)),
                Span::styled("  spill/s ", dim),
                Span::raw(format!("{:.1}", fleet.totals.spills_per_s)),
            ];
            if let Some(by) = fleet.policy_changed_by {
                spans.push(Span::styled(format!("  (changed by {})", by.as_str()), dim));
            }
            Line::from(spans)
        }
        None => Line::from(Span::styled(" waiting for the gateway's snapshot…", dim)),
    };
    frame.render_widget(Paragraph::new(line2), l2);

    draw_sparklines(frame, l3, fleet);

    // One line for the most pressing thing to say: a local notice, then why the connection is
    // down, then the fate of the last threshold change, else the key hints.
    let line4 = match (state.notice(), state.conn(), state.last_command()) {
        (Some(notice), _, _) => Line::from(Span::styled(
            format!(" ! {notice}"),
            Style::new().fg(Color::Yellow),
        )),
        (
            None,
            ConnStatus::Reconnecting {
                attempt, reason, ..
            },
            _,
        ) => Line::from(Span::styled(
            format!(" ✗ attempt {attempt}: {reason}"),
            Style::new().fg(Color::Red),
        )),
        (None, _, Some(cmd)) => command_line(cmd),
        (None, _, None) => Line::from(Span::styled(
            " g/G gap  s/S skew  p pause  Tab focus  / filter  o sort  ? help  q quit",
            dim,
        )),
    };
    frame.render_widget(Paragraph::new(line4), l4);
}

fn command_line(cmd: &CommandEntry) -> Line<'static> {
    let what = match cmd.change {
        Change::Gap(from, to) => format!("gap {from} → {to}"),
        Change::Skew(from, to) => format!("skew {from:.2} → {to:.2}"),
    };
    // Short words: the gateway's message already names the field, and it must fit in 80 columns.
    let (status, style) = match &cmd.state {
        CommandState::Pending => ("… pending".to_owned(), Style::new().fg(Color::Yellow)),
        CommandState::Applied => ("✓ applied".to_owned(), Style::new().fg(Color::Green)),
        CommandState::Failed(msg) => (format!("✗ {msg}"), Style::new().fg(Color::Red)),
    };
    Line::from(vec![
        Span::styled(format!(" #{} ", cmd.id), Style::new().fg(Color::DarkGray)),
        Span::raw(what),
        Span::raw(" "),
        Span::styled(status, style.bold()),
    ])
}

fn draw_sparklines(frame: &mut Frame, area: Rect, fleet: &Fleet) {
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    type Get = fn(&Sample) -> f64;
    let series: [(&str, Rect, Color, Get); 2] = [
        (" req/s   ", left, Color::Cyan, |s| s.requests_per_s),
        ("  spill/s ", right, Color::Magenta, |s| s.spills_per_s),
    ];
    for (label, rect, color, get) in series {
        let [label_area, spark_area] = Layout::horizontal([
            Constraint::Length(label.chars().count() as u16),
            Constraint::Min(0),
        ])
        .areas(rect);
        frame.render_widget(
            Span::styled(label, Style::new().fg(Color::DarkGray)),
            label_area,
        );
        let width = spark_area.width as usize;
        let skip = fleet.history.len().saturating_sub(width);
        // Tenths, so a fleet spilling 0.3/s still draws a bar.
        let data: Vec<u64> = fleet
            .history
            .iter()
            .skip(skip)
            .map(|s| (get(s) * 10.0).round().max(0.0) as u64)
            .collect();
        frame.render_widget(
            Sparkline::default()
                .data(data)
                .style(Style::new().fg(color)),
            spark_area,
        );
    }
}

fn draw_workers(frame: &mut Frame, area: Rect, state: &State) {
    let fleet = state.visible();
    let healthy = fleet.workers.iter().filter(|w| w.healthy).count();
    let title = Line::from(vec![
        Span::raw(" Workers "),
        Span::styled(
            format!("{healthy}/{} healthy ", fleet.workers.len()),
            Style::new().fg(Color::DarkGray),
        ),
    ]);
    let block = panel_block(state, Panel::Workers, title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height == 0 || inner.width < 12 {
        return;
    }

    let bound = fleet.bound();
    let legend = match bound {
        Some(b) => {
            let mut spans = vec![
                Span::styled(format!("{GAP_MARKER} "), Style::new().fg(Color::Yellow)),
                Span::raw(format!("min+gap {}  ", b.gap_bound())),
                Span::styled(format!("{SKEW_MARKER} "), Style::new().fg(Color::Magenta)),
                Span::raw(format!("mean×skew {:.2}", b.skew_bound())),
            ];
            let inputs = format!("  min {} mean {:.2}", b.load().min_load, b.load().mean_load);
            let used: usize = spans.iter().map(|s| s.width()).sum();
            // The inputs are derivable from the bars; drop them rather than cut them mid-number.
            if used + inputs.chars().count() <= inner.width as usize {
                spans.push(Span::styled(inputs, Style::new().fg(Color::DarkGray)));
            }
            Line::from(spans)
        }
        None if fleet.workers.is_empty() => {
            Line::from(Span::styled("no workers", Style::new().fg(Color::DarkGray)))
        }
        None => Line::from(Span::styled(
            "no healthy worker: no bound",
            Style::new().fg(Color::Red),
        )),
    };
    let rows_h = inner.height.saturating_sub(1) as usize;
    let mut lines = vec![legend];

    let name_w = fleet
        .workers
        .iter()
        .map(|w| w.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(4, 16);
    let stats = inner.width >= 86;
    let stats_w = if stats { 30 } else { 0 };
    // glyph + space, name, space, bar, active (5), flag (5), stats
    let fixed = 2 + name_w + 1 + 5 + 5 + stats_w;
    let bar_w = (inner.width as usize).saturating_sub(fixed).max(4);
    let max_active = fleet.workers.iter().map(|w| w.active).max().unwrap_or(0);
    let mut scale = max_active as f64;
    if let Some(b) = bound {
        scale = scale.max(b.gap_bound() as f64).max(b.skew_bound());
    }
    // Headroom so the bound markers never sit on the panel's edge.
    let scale = (scale * 1.25).max(4.0);

    let start = clamp_scroll(state.scroll(Panel::Workers), fleet.workers.len(), rows_h);
    render_hint(
        frame,
        area,
        position_hint(start, rows_h, fleet.workers.len()),
    );
    for worker in fleet.workers.iter().skip(start).take(rows_h) {
        lines.push(worker_line(worker, bound, name_w, bar_w, scale, stats));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn worker_line(
    w: &WorkerRecord,
    bound: Option<FleetBound>,
    name_w: usize,
    bar_w: usize,
    scale: f64,
    stats: bool,
) -> Line<'static> {
    let over = w.healthy && bound.is_some_and(|b| b.check(w.active).should_spill());
    let (glyph, glyph_style) = if w.healthy {
        ("●", Style::new().fg(Color::Green))
    } else {
        ("✗", Style::new().fg(Color::Red).bold())
    };
    let bar_style = match (w.healthy, over) {
        (false, _) => Style::new().fg(Color::DarkGray),
        (true, true) => Style::new().fg(Color::Red),
        (true, false) => Style::new().fg(Color::Green),
    };
    let cell_of = |v: f64| ((v / scale * bar_w as f64).round() as usize).min(bar_w - 1);
    let filled = ((w.active as f64 / scale * bar_w as f64).round() as usize).min(bar_w);
    let gap_col = bound.map(|b| cell_of(b.gap_bound() as f64));
    let skew_col = bound.map(|b| cell_of(b.skew_bound()));

    let mut spans = vec![
        Span::styled(format!("{glyph} "), glyph_style),
        Span::styled(
            format!("{:<name_w$} ", truncate_left(&w.name, name_w)),
            if w.healthy {
                Style::new()
            } else {
                Style::new()
                    .fg(Color::DarkGray)
                    .add_modifier(Modifier::CROSSED_OUT)
            },
        ),
    ];
    for i in 0..bar_w {
        let is_gap = gap_col == Some(i);
        let is_skew = skew_col == Some(i);
        let in_bar = i < filled;
        let (ch, style) = match (is_gap, is_skew) {
            (true, true) => (BOTH_MARKER, Style::new().fg(Color::Yellow)),
            (true, false) => (GAP_MARKER, Style::new().fg(Color::Yellow)),
            (false, true) => (SKEW_MARKER, Style::new().fg(Color::Magenta)),
            (false, false) if in_bar => ('█', bar_style),
            (false, false) => ('·', Style::new().fg(Color::DarkGray)),
        };
        // A marker inside the filled part is drawn reversed, so the bar visibly runs through it.
        let style = if in_bar && (is_gap || is_skew) {
            style
                .bg(bar_style.fg.unwrap_or(Color::Reset))
                .fg(Color::Black)
        } else {
            style
        };
        spans.push(Span::styled(ch.to_string(), style));
    }
    spans.push(Span::styled(
        format!("{:>5}", w.active),
        Style::new().bold(),
    ));
    let flag = if !w.healthy {
        Span::styled(" DOWN", Style::new().fg(Color::Red).bold())
    } else if over {
        Span::styled(" OVER", Style::new().fg(Color::Red).bold())
    } else {
        Span::raw("     ")
    };
    spans.push(flag);
    if stats {
        spans.push(Span::styled(
            format!(
                "  req {:>6} in {:>4} out {:>4} err {:>3}",
                w.requests_total, w.spilled_in_total, w.spilled_out_total, w.errors_total
            ),
            Style::new().fg(Color::DarkGray),
        ));
    }
    Line::from(spans)
}

fn draw_ring(frame: &mut Frame, area: Rect, state: &State) {
    let fleet = state.visible();
    let vnodes = fleet
        .ring
        .as_ref()
        .map(|r| format!("{} vnodes ", r.virtual_nodes))
        .unwrap_or_default();
    let title = Line::from(vec![
        Span::raw(" Ring "),
        Span::styled(vnodes, Style::new().fg(Color::DarkGray)),
    ]);
    let block = panel_block(state, Panel::Ring, title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(ring) = &fleet.ring else {
        frame.render_widget(
            Paragraph::new(Span::styled(
                "no ring yet",
                Style::new().fg(Color::DarkGray),
            )),
            inner,
        );
        return;
    };
    if inner.height == 0 || inner.width < 8 {
        return;
    }

    // The strip: each cell shows the owner of the ring position at its middle.
    let width = inner.width as usize;
    let strip: Vec<Span> = (0..width)
        .map(|i| {
            let x = (i as f64 + 0.5) / width as f64;
            match fleet.owner_at(x) {
                Some(owner) => Span::styled(
                    worker_glyph(owner).to_string(),
                    Style::new().fg(Color::Black).bg(worker_color(owner)),
                ),
                None => Span::raw(" "),
            }
        })
        .collect();
    let mut lines = vec![Line::from(strip)];

    let rows_h = inner.height.saturating_sub(1) as usize;
    let healthy = |name: &str| {
        fleet
            .workers
            .iter()
            .find(|w| w.name == name)
            .is_none_or(|w| w.healthy)
    };
    let name_w = ring
        .workers
        .iter()
        .map(|s| s.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(4, 12);
    let even = 1.0 / ring.workers.len().max(1) as f64;
    // glyph, name, share, bar, arcs
    let bar_w = width.saturating_sub(2 + name_w + 1 + 8 + 10);
    let start = clamp_scroll(state.scroll(Panel::Ring), ring.workers.len(), rows_h);
    render_hint(
        frame,
        area,
        position_hint(start, rows_h, ring.workers.len()),
    );
    for (i, share) in ring.workers.iter().enumerate().skip(start).take(rows_h) {
        // Bar length relative to twice the even share, so a balanced ring sits at half width and
        // an over- or under-owning worker stands out.
        let bar_len = ((share.share / (2.0 * even)) * bar_w as f64).round() as usize;
        let mut spans = vec![
            Span::styled(
                format!("{} ", worker_glyph(i)),
                Style::new().fg(Color::Black).bg(worker_color(i)),
            ),
            Span::styled(
                format!("{:<name_w$} ", truncate_left(&share.name, name_w)),
                if healthy(&share.name) {
                    Style::new()
                } else {
                    Style::new()
                        .fg(Color::DarkGray)
                        .add_modifier(Modifier::CROSSED_OUT)
                },
            ),
            Span::raw(format!("{:>6.1}% ", share.share * 100.0)),
        ];
        if bar_w > 0 {
            spans.push(Span::styled(
                format!("{:<bar_w$}", "▆".repeat(bar_len.min(bar_w))),
                Style::new().fg(worker_color(i)),
            ));
        }
        spans.push(Span::styled(
            format!(" {:>4} arcs", share.arcs.len()),
            Style::new().fg(Color::DarkGray),
        ));
        lines.push(Line::from(spans));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn draw_keys(frame: &mut Frame, area: Rect, state: &State) {
    let fleet = state.visible();
    let rows = state.key_rows();
    let mut title = vec![
        Span::raw(" Keys "),
        Span::styled(
            format!("{}/{} ", rows.len(), fleet.keys.len()),
            Style::new().fg(Color::DarkGray),
        ),
        Span::styled(
            format!("sort {} ", state.ui().sort().name()),
            Style::new().fg(Color::DarkGray),
        ),
    ];
    if !state.ui().filter().is_empty() && !state.ui().filter_editing() {
        title.push(Span::styled(
            format!("filter \"{}\" ", state.ui().filter()),
            Style::new().fg(Color::Yellow),
        ));
    }
    let mut block = panel_block(state, Panel::Keys, Line::from(title));
    if state.ui().filter_editing() {
        block = block.title_bottom(Line::from(vec![
            Span::styled(
                format!(" /{}▏", state.ui().filter()),
                Style::new().fg(Color::Yellow).bold(),
            ),
            Span::styled(" Enter keep · Esc clear ", Style::new().fg(Color::DarkGray)),
        ]));
    }
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height < 2 {
        return;
    }

    let visible = inner.height as usize - 1;
    let start = clamp_scroll(state.scroll(Panel::Keys), rows.len(), visible);
    render_hint(frame, area, position_hint(start, visible, rows.len()));
    let name_w = fleet
        .workers
        .iter()
        .map(|w| w.name.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(2, 12) as u16;
    let placement_w = (name_w * 2 + 3).max(19);
    // The key column's share of what the fixed columns and the four gaps leave (Fill 3 of 5), so a
    // long key is cut in the middle here rather than at its end by the table.
    let key_w = usize::from(inner.width.saturating_sub(placement_w + 6 + 6 + 4)) * 3 / 5;
    let table_rows: Vec<Row> = rows
        .iter()
        .skip(start)
        .take(visible)
        .map(|k| key_row(k, name_w as usize, key_w.max(6)))
        .collect();
    let header = Row::new(["key", "preferred → current", "active", "req", "spills"])
        .style(Style::new().fg(Color::DarkGray).bold());
    let widths = [
        Constraint::Fill(3),
        Constraint::Length(placement_w),
        Constraint::Fill(2),
        Constraint::Length(6),
        Constraint::Length(6),
    ];
    let table = Table::new(table_rows, widths)
        .header(header)
        .column_spacing(1);
    frame.render_widget(table, inner);
}

fn key_row(k: &KeyRecord, name_w: usize, key_w: usize) -> Row<'static> {
    let spilled = k.preferred != k.current;
    let placement = format!(
        "{:<name_w$} {} {}",
        truncate_left(&k.preferred, name_w),
        if spilled { "↷" } else { "→" },
        truncate_left(&k.current, name_w)
    );
    let active = k
        .active
        .iter()
        .map(|(w, n)| format!("{w}:{n}"))
        .collect::<Vec<_>>()
        .join(" ");
    let style = if spilled {
        Style::new().fg(Color::Yellow)
    } else {
        Style::new()
    };
    Row::new([
        Cell::from(truncate_middle(&k.key, key_w)),
        Cell::from(placement),
        Cell::from(active),
        Cell::from(format!("{:>6}", k.requests_total)),
        Cell::from(format!("{:>6}", k.spills_total)),
    ])
    .style(style)
}

fn draw_spills(frame: &mut Frame, area: Rect, state: &State) {
    let fleet = state.visible();
    let title = Line::from(vec![
        Span::raw(" Spills "),
        Span::styled(
            format!("{} total, newest first ", fleet.totals.spills_total),
            Style::new().fg(Color::DarkGray),
        ),
    ]);
    let block = panel_block(state, Panel::Spills, title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let visible = inner.height as usize;
    let start = clamp_scroll(state.scroll(Panel::Spills), fleet.spills.len(), visible);
    render_hint(
        frame,
        area,
        position_hint(start, visible, fleet.spills.len()),
    );
    let lines: Vec<Line> = if fleet.spills.is_empty() {
        let text = if fleet.policy.is_some() {
            "no spills: every explicit key stayed on its preferred worker"
        } else {
            "no data yet"
        };
        vec![Line::from(Span::styled(
            text,
            Style::new().fg(Color::DarkGray),
        ))]
    } else {
        fleet
            .spills
            .iter()
            .rev()
            .skip(start)
            .take(visible)
            .map(|s| spill_line(s, usize::from(inner.width)))
            .collect()
    };
    frame.render_widget(Paragraph::new(lines), inner);
}

/// One spill, in full when `width` columns allow it. Otherwise in the compact form that keeps every
/// number of the rule — `12:00:00 key w0→w1 9>2+2 9>3.50×1.50`: the preferred worker's load was
/// above min + gap and above mean × skew — and shortens the key instead.
fn spill_line(s: &SpillEvent, width: usize) -> Line<'static> {
    let full = spill_line_full(s);
    if full.width() <= width {
        return full;
    }
    let dim = Style::new().fg(Color::DarkGray);
    let (target, target_style) = if s.branch == Branch::ExplicitRoutingKeyNoEligibleCandidate {
        (format!("{}✗", s.from), Style::new().fg(Color::Red))
    } else {
        (
            format!("{}→{}", s.from, s.to),
            Style::new().fg(Color::Yellow),
        )
    };
    let time = clock(s.ts_ms);
    let time = time.split('.').next().unwrap_or_default().to_owned();
    let rule = format!(
        "{p}>{min}+{gap} {p}>{mean:.2}×{skew:.2}",
        p = s.preferred_load,
        min = s.min_load,
        gap = s.min_load_gap,
        mean = s.mean_load,
        skew = s.max_load_skew,
    );
    let fixed = time.chars().count() + target.chars().count() + rule.chars().count() + 3;
    let key = truncate_middle(&s.key, width.saturating_sub(fixed).max(6));
    Line::from(vec![
        Span::styled(format!("{time} "), dim),
        Span::raw(format!("{key} ")),
        Span::styled(target, target_style),
        Span::raw(format!(" {rule}")),
    ])
}

fn spill_line_full(s: &SpillEvent) -> Line<'static> {
    let dim = Style::new().fg(Color::DarkGray);
    let target = if s.branch == Branch::ExplicitRoutingKeyNoEligibleCandidate {
        Span::styled(format!("{} ✗ stayed", s.from), Style::new().fg(Color::Red))
    } else {
        Span::styled(
            format!("{} → {}", s.from, s.to),
            Style::new().fg(Color::Yellow),
        )
    };
    Line::from(vec![
        Span::styled(format!("{} ", clock(s.ts_ms)), dim),
        Span::raw(format!("{} ", truncate_middle(&s.key, 18))),
        target,
        Span::styled(" pref ", dim),
        Span::raw(s.preferred_load.to_string()),
        Span::styled(" min ", dim),
        Span::raw(s.min_load.to_string()),
        Span::styled(" mean ", dim),
        Span::raw(format!("{:.2}", s.mean_load)),
        Span::styled(" gap ", dim),
        Span::raw(s.min_load_gap.to_string()),
        Span::styled(" skew ", dim),
        Span::raw(format!("{:.2}", s.max_load_skew)),
    ])
}

fn draw_help(frame: &mut Frame, area: Rect) {
    let mut lines: Vec<Line> = BINDINGS
        .iter()
        .map(|b| {
            Line::from(vec![
                Span::styled(
                    format!(" {:<14}", b.keys),
                    Style::new().fg(Color::Cyan).bold(),
                ),
                Span::raw(b.meaning),
            ])
        })
        .collect();
    lines.push(Line::raw(""));
    lines.push(Line::from(vec![
        Span::styled(format!(" {GAP_MARKER} "), Style::new().fg(Color::Yellow)),
        Span::raw("min + min_load_gap   "),
        Span::styled(format!("{SKEW_MARKER} "), Style::new().fg(Color::Magenta)),
        Span::raw("mean × max_load_skew"),
    ]));
    lines.push(Line::raw(
        " A worker above both marks is OVER: its keys spill.",
    ));
    lines.push(Line::raw(
        " ↷ in the key table: served off its preferred worker.",
    ));
    lines.push(Line::raw(
        " Narrow spill log: 9>2+2 9>3.50×1.50 = load > min+gap,",
    ));
    lines.push(Line::raw("   load > mean×skew."));
    let height = (lines.len() as u16 + 2).min(area.height);
    let width = 60.min(area.width);
    let popup = area.centered(Constraint::Length(width), Constraint::Length(height));
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .border_type(BorderType::Rounded)
                .title(" Help · any key closes ")
                .border_style(Style::new().fg(Color::Cyan)),
        ),
        popup,
    );
}

/// `HH:MM:SS.mmm` (UTC) of a Unix-epoch millisecond timestamp. Gateway time, not local time: the
/// spill log must agree with the gateway's own logs.
pub fn clock(ts_ms: u64) -> String {
    let ms = ts_ms % 1000;
    let secs = ts_ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{ms:03}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

/// Worker names cut from the left: names derived from URLs (`127.0.0.1:8001`) and fleets of
/// numbered nodes (`gpu-node-17`) differ at the end, so the end is what must stay visible.
fn truncate_left(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_owned()
    } else {
        let keep = max.saturating_sub(1);
        let mut t = String::from("…");
        t.extend(s.chars().skip(n - keep));
        t
    }
}

/// Routing keys cut in the middle: keys of one fleet tend to share a prefix (`chat-session-`) and
/// differ at the end, yet the prefix says what kind of key it is, so both ends stay visible.
fn truncate_middle(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_owned();
    }
    let keep = max.saturating_sub(1);
    let head = keep.div_ceil(2);
    let mut t: String = s.chars().take(head).collect();
    t.push('…');
    t.extend(s.chars().skip(n - (keep - head)));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_utc_time_of_day() {
        assert_eq!(clock(1_700_000_000_123), "22:13:20.123");
        assert_eq!(clock(0), "00:00:00.000");
    }

    #[test]
    fn glyphs_are_distinct_for_64_workers() {
        let glyphs: std::collections::HashSet<char> = (0..62).map(worker_glyph).collect();
        assert_eq!(glyphs.len(), 62);
        assert_eq!(worker_glyph(63), '*');
    }

    #[test]
    fn truncate_marks_cut_labels() {
        assert_eq!(truncate_middle("chat-session-0001", 9), "chat…0001");
        assert_eq!(truncate_middle("abcdef", 4), "ab…f");
        assert_eq!(truncate_middle("abc", 4), "abc");
        assert_eq!(truncate_left("127.0.0.1:18101", 8), "…1:18101");
        assert_eq!(truncate_left("w0", 8), "w0");
    }
}
