//! The history pane (Enter), drawn over the key table and the spill log while open: for the
//! selected key, which worker served it over time (each run of requests served the same way: its
//! times, the worker, home or off home and why) and its spills in the spill log; for the selected
//! worker, its load over the last minutes as a sparkline and the spills that moved keys off it or
//! onto it. With no key or worker to show, it stays drawn and says why. Every name and key is
//! drawn through the sanitiser, and each line cut to the pane.

use bch_core::telemetry::SpillEvent;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph, Sparkline};

use super::styles::{Styles, Tone};
use super::text::{clock, printable, truncate_left, truncate_middle};
use crate::state::{HistoryOf, Placement, Reason, State, TRAIL_LEN, TRAIL_STEP_MS};

/// Worker names are cut from the left to this, keeping the port.
const NAME_W: usize = 24;
/// Rows the worker's sparkline takes at most.
const SPARK_ROWS: u16 = 6;

/// Draws the pane over `area` for what it is open on; nothing when it is closed.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let Some(of) = state.ui().history_of() else {
        return;
    };
    frame.render_widget(Clear, area);
    match of {
        HistoryOf::Key => draw_key(frame, area, state, styles),
        HistoryOf::Worker => draw_worker(frame, area, state, styles),
    }
}

fn pane(title: String, styles: &Styles) -> Block<'static> {
    Block::bordered()
        .border_type(BorderType::Rounded)
        .title(title)
        .title_bottom(Line::from(" Enter / Esc closes ").right_aligned())
        .border_style(styles.overlay_border())
}

/// `line` cut to `width` columns with `…`. Its network text went through the sanitiser already
/// (every character one column), and the line is not sanitised again: that would fold the
/// columns' padding.
fn fit(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The key's placements, newest first, then its spills in the spill log.
fn draw_key(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let width = usize::from(area.width.saturating_sub(2));
    let Some(key) = state.selected_key() else {
        // The table shows no key (a filter hides them all, or a replay went back to before any
        // was seen): the pane stays, so the screen is not left blank, and says why.
        let why = if state.ui().filter().is_empty() {
            " no key to show: none is known yet at this point".to_owned()
        } else {
            format!(
                " no key to show: the filter \"{}\" hides every key (Esc twice clears it)",
                printable(state.ui().filter())
            )
        };
        let lines = vec![Line::raw(fit(&why, width))];
        let block = pane(" History of key ".to_owned(), styles);
        frame.render_widget(Paragraph::new(lines).block(block), area);
        return;
    };
    let block = pane(
        format!(" History of key {} ", truncate_middle(&key.key, width / 2)),
        styles,
    );
    let mut lines = Vec::new();
    let placements: Vec<&Placement> = state
        .selected_key_history()
        .map(|h| h.placements().rev().collect())
        .unwrap_or_default();
    lines.push(Line::styled(
        fit(
            &format!(
                " where it was served, newest first ({} kept, each a run of requests served the same way)",
                placements.len()
            ),
            width,
        ),
        styles.dim(),
    ));
    // The gateway sends every spill event but, of the other requests, only where each key's
    // last request of a tick went: home runs between spills are not seen.
    lines.push(Line::styled(
        fit(
            " sampled: every spill seen, and the last request of each tick; others unseen",
            width,
        ),
        styles.dim(),
    ));
    if placements.is_empty() {
        lines.push(Line::raw(" no request of this key seen yet"));
    }
    let squeeze = squeeze(&placements, width);
    let pad = padding(&placements, squeeze);
    let spills: Vec<&SpillEvent> = state
        .visible()
        .spills
        .iter()
        .rev()
        .filter(|s| s.key == key.key)
        .collect();
    // The newest placements that leave the spills their rows, or at least half the pane: on a
    // short screen both parts show their newest lines.
    let rows = usize::from(area.height.saturating_sub(2));
    let for_placements = rows
        .saturating_sub(3 + spills.len())
        .max(rows.saturating_sub(3) / 2)
        .max(1);
    for placement in placements.iter().take(for_placements) {
        let tone = if placement.reason.spilled() {
            styles.tone(Tone::Warning)
        } else {
            styles.plain()
        };
        lines.push(Line::styled(
            fit(&placement_line(placement, pad, squeeze), width),
            tone,
        ));
    }
    lines.push(Line::styled(
        format!(" its spills in the spill log: {}", spills.len()),
        styles.dim(),
    ));
    lines.extend(
        spills
            .iter()
            .map(|s| Line::styled(fit(&spill_line(s), width), styles.tone(Tone::Warning))),
    );
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// How much a placement line gives way to fit: the end of its time span, then worker names.
#[derive(Debug, Clone, Copy)]
struct Squeeze {
    /// Show when the run ended as well as when it began.
    span: bool,
    /// Worker names are cut from the left to this.
    name_w: usize,
}

impl Squeeze {
    /// Whole, then without the run's end, then with names cut to `…1.17:8000`.
    const STEPS: [Squeeze; 3] = [
        Squeeze {
            span: true,
            name_w: NAME_W,
        },
        Squeeze {
            span: false,
            name_w: NAME_W,
        },
        Squeeze {
            span: false,
            name_w: 10,
        },
    ];
}

/// The first of [`Squeeze::STEPS`] whose lines all fit `width` (the last when none does), so
/// every line of the pane has the same columns.
fn squeeze(placements: &[&Placement], width: usize) -> Squeeze {
    Squeeze::STEPS
        .into_iter()
        .find(|&squeeze| {
            placements.iter().all(|p| {
                placement_line(p, padding(placements, squeeze), squeeze)
                    .chars()
                    .count()
                    <= width
            })
        })
        .unwrap_or(Squeeze::STEPS[2])
}

/// The widest worker name of `placements` as `squeeze` cuts it.
fn padding(placements: &[&Placement], squeeze: Squeeze) -> usize {
    placements
        .iter()
        .map(|p| truncate_left(&p.worker, squeeze.name_w).chars().count())
        .max()
        .unwrap_or(0)
}

/// ` 12:00:01.250–12:00:03.100  10.244.1.17:8000  ↷ off 10.244.1.12:8000 ×3: bound 9>2+2
/// 9>3.50×1.50`, the worker padded to `pad`, squeezed as `squeeze` says.
fn placement_line(p: &Placement, pad: usize, squeeze: Squeeze) -> String {
    let span = if !squeeze.span {
        clock(p.first_ms)
    } else if p.first_ms == p.last_ms {
        format!("{:<25}", clock(p.first_ms))
    } else {
        format!("{}–{}", clock(p.first_ms), clock(p.last_ms))
    };
    let worker = truncate_left(&p.worker, squeeze.name_w);
    let how = match &p.reason {
        Reason::Home => "home".to_owned(),
        reason => {
            let times = if p.spills > 1 {
                format!(" ×{}", p.spills)
            } else {
                String::new()
            };
            let off = if matches!(reason, Reason::NoEligible { .. }) {
                "✗ stayed on"
            } else {
                "↷ off"
            };
            format!(
                "{off} {}{times}: {}",
                truncate_left(&p.preferred, squeeze.name_w),
                why(reason)
            )
        }
    };
    format!(" {span}  {worker:<pad$}  {how}")
}

/// Why a placement was off home, in the spill log's compact words.
fn why(reason: &Reason) -> String {
    match reason {
        Reason::Home => "home".to_owned(),
        Reason::Bound {
            preferred_load,
            min_load,
            mean_load,
            min_load_gap,
            max_load_skew,
        } => format!(
            "bound {preferred_load}>{min_load}+{min_load_gap} {preferred_load}>{mean_load:.2}×{max_load_skew:.2}"
        ),
        Reason::Capacity { preferred_load } => format!("preferred full at {preferred_load}"),
        Reason::NoEligible { preferred_load } => {
            format!("bound fired at {preferred_load}, no worker eligible")
        }
        Reason::Unknown(names) => format!("?{}", printable(names)),
        Reason::Unseen => "no spill event seen (before this console connected, or lost)".into(),
    }
}

/// ` 12:00:01.250 10.244.1.12:8000 → 10.244.1.17:8000 bound 9>2+2 9>3.50×1.50`.
fn spill_line(s: &SpillEvent) -> String {
    let reason = Reason::of_spill(s);
    let arrow = if matches!(reason, Reason::NoEligible { .. }) {
        "✗"
    } else {
        "→"
    };
    format!(
        " {} {} {arrow} {} {}",
        clock(s.ts_ms),
        truncate_left(&s.from, NAME_W),
        truncate_left(&s.to, NAME_W),
        why(&reason)
    )
}

/// The worker's load trail as a sparkline, with its numbers, then the spills off it and onto it.
fn draw_worker(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let width = usize::from(area.width.saturating_sub(2));
    let Some(worker) = state.selected_worker() else {
        // The panel shows no worker (another pool picked, a replay before the fleet was seen):
        // the pane stays and says so rather than leaving the lower screen blank.
        let line = Line::raw(fit(
            " no worker to show: the workers panel shows none at this point",
            width,
        ));
        let block = pane(" History of worker ".to_owned(), styles);
        frame.render_widget(Paragraph::new(line).block(block), area);
        return;
    };
    let minutes = TRAIL_LEN as u64 * TRAIL_STEP_MS / 60_000;
    let block = pane(
        format!(
            " History of worker {} · load over the last {minutes} min ",
            truncate_left(&worker.name, NAME_W)
        ),
        styles,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let trail = state
        .history()
        .loads
        .trail(&worker.name)
        .unwrap_or_default();
    let highest = trail.iter().flatten().max().copied().unwrap_or(0);
    let capacity = worker
        .capacity
        .map_or_else(|| "no cap".to_owned(), |c| format!("capacity {c}"));
    let summary = format!(
        " now {} · highest {highest} · {capacity} · a bar per {} s (its highest), newest right",
        worker.rule_load(),
        TRAIL_STEP_MS / 1000
    );
    let spills: Vec<&SpillEvent> = state
        .visible()
        .spills
        .iter()
        .rev()
        .filter(|s| s.from == worker.name || s.to == worker.name)
        .collect();
    let spark_rows = SPARK_ROWS.min(inner.height.saturating_sub(2) / 2).max(1);
    let [summary_area, spark_area, spills_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(spark_rows),
        Constraint::Min(0),
    ])
    .areas(inner);
    frame.render_widget(
        Paragraph::new(Line::styled(fit(&summary, width), styles.dim())),
        summary_area,
    );
    // The newest samples that fit, right-aligned so the newest is always at the right edge.
    let shown = trail
        .len()
        .min(usize::from(spark_area.width.saturating_sub(1)));
    let data = &trail[trail.len() - shown..];
    let spark_area = Rect {
        x: spark_area.x + 1 + (spark_area.width.saturating_sub(1) - shown as u16),
        width: shown as u16,
        ..spark_area
    };
    frame.render_widget(
        Sparkline::default()
            .data(data.iter().copied())
            .max(highest.max(1))
            .style(styles.requests_sparkline()),
        spark_area,
    );
    let mut lines = vec![Line::styled(
        format!(
            " spills off it or onto it in the spill log: {}",
            spills.len()
        ),
        styles.dim(),
    )];
    lines.extend(spills.iter().map(|s| {
        Line::from(Span::styled(
            fit(&format!("{} {}", spill_line(s), key_of(s)), width),
            styles.tone(Tone::Warning),
        ))
    }));
    frame.render_widget(Paragraph::new(lines), spills_area);
}

/// `key chat-…-0001` for a spill line of the worker pane.
fn key_of(s: &SpillEvent) -> String {
    format!("key {}", truncate_middle(&s.key, 24))
}
