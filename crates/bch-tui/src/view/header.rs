//! The four header lines above the panels: the model's pool shown (with models), connection and
//! pause status, the policy in force with the fleet's rates, the rate sparklines, and one line
//! for the most pressing message. The header always shows the live fleet, so rates and the
//! policy stay current while the panels are paused.

use bch_core::policy::PolicyKind;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline};
use tokio::time::Instant;

use super::pool_label;
use super::styles::{Styles, Tone};
use super::text::{clock, printable};
use super::timeline;
use bch_core::telemetry::{ChangeSource, Open};

use crate::conn::ConnStatus;
use crate::state::{
    COMMAND_TIMEOUT, Change, CommandEntry, CommandState, FleetPicture, Sample, State,
};

/// The key hints shown when there is nothing more pressing to say; the full list is in the help
/// overlay.
const KEY_HINTS: &str =
    " g/G gap  s/S skew  d/u drain  l order  p pause  Tab  / filter  ? help  q quit";
/// The key hints of a fleet with several models, all of them shown: `m` picks a pool.
const MODELS_KEY_HINTS: &str =
    " g/G gap  s/S skew  d/u drain  m model  p pause  Tab  / filter  ? help  q quit";
/// The key hints while one model's pool is shown: the thresholds are the gateway's one set, for
/// every pool (`docs/models.md`), so the hints say so.
const POOL_KEY_HINTS: &str =
    " g/G s/S gap, skew: all pools  m next model  d/u drain  p pause  ? help  q quit";

/// The key hints for what is shown: a pool, every worker of several pools, or a fleet without.
fn key_hints(state: &State) -> &'static str {
    if state.pool().is_some() {
        POOL_KEY_HINTS
    } else if state.whole().several_pools() {
        MODELS_KEY_HINTS
    } else {
        KEY_HINTS
    }
}

/// Draws the header into its four rows at `area`, with the reconnect countdown taken at `now`.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, now: Instant, styles: &Styles) {
    let [status, policy, rates, message] = Layout::vertical([Constraint::Length(1); 4]).areas(area);
    if let Some(playback) = state.playback() {
        // A replay: its position instead of the connection, its timeline instead of the hints.
        let status_line = timeline::status_line(state, playback, styles);
        frame.render_widget(Paragraph::new(status_line), status);
        if state.notice().is_none() {
            // The pane, while open, says it at length; closed, the count keeps it in sight.
            let warnings = if state.ui().warnings_open() {
                Vec::new()
            } else {
                state.warnings(now)
            };
            let timeline = timeline::timeline_line(playback, &warnings, message.width, styles);
            frame.render_widget(Paragraph::new(timeline), message);
        } else {
            frame.render_widget(
                Paragraph::new(message_line(state, now, message.width, styles)),
                message,
            );
        }
    } else {
        frame.render_widget(Paragraph::new(status_line(state, now, styles)), status);
        frame.render_widget(
            Paragraph::new(message_line(state, now, message.width, styles)),
            message,
        );
    }
    frame.render_widget(
        Paragraph::new(policy_line(state.live(), styles, policy.width)),
        policy,
    );
    sparklines(frame, rates, state.live(), styles);
}

/// `bch ● CONNECTED 0.1s ws://… dropped N` (with several replicas: the first one not connected,
/// and their number), then RESYNCING and PAUSED when they apply. A gateway that stopped sending
/// (a frozen process keeps its socket) shows `◌ STALE` with the silence.
fn status_line(state: &State, now: Instant, styles: &Styles) -> Line<'static> {
    let age = state.frame_age(now);
    let replicas = state.replicas().len();
    let connected = state
        .replicas()
        .iter()
        .filter(|r| *r.conn() == ConnStatus::Connected)
        .count();
    let merged = state.replicas().iter().filter(|r| r.merged()).count();
    let partly = replicas > 1 && connected > 0 && connected < replicas;
    let (dot, tone, label) = match state.conn() {
        // Some replicas up, some not: the merge covers only the connected ones.
        _ if partly => (
            "◐",
            Tone::Warning,
            format!("{connected}/{replicas} CONNECTED"),
        ),
        ConnStatus::Connected if state.stale(now) => (
            "◌",
            Tone::Alert,
            format!(
                "STALE: no frame for {:.1}s",
                age.unwrap_or_default().as_secs_f64()
            ),
        ),
        ConnStatus::Connected => ("●", Tone::Good, state.conn().label(now)),
        ConnStatus::Connecting => ("○", Tone::Warning, state.conn().label(now)),
        ConnStatus::Reconnecting { .. } => ("○", Tone::Alert, state.conn().label(now)),
    };
    let mut spans = vec![Span::styled(" bch ", styles.brand()), Span::raw(" ")];
    spans.extend(pool_label::spans(state, styles));
    spans.push(Span::styled(format!("{dot} {label}"), styles.status(tone)));
    if let (ConnStatus::Connected, Some(age), false) = (state.conn(), age, state.stale(now)) {
        spans.push(Span::styled(
            format!(" {:.1}s ago", age.as_secs_f64()),
            styles.dim(),
        ));
    }
    spans.extend([
        Span::raw("  "),
        Span::raw(match replicas {
            1 => state.url().to_owned(),
            n if merged == n => format!("{n} replicas, merged"),
            n if merged == 0 => format!("{n} replicas, last data"),
            n => format!("{n} replicas, {merged} merged"),
        }),
        Span::raw(format!("  dropped {}", state.live().dropped_events)),
    ]);
    if state.resyncing() {
        spans.push(Span::styled("  RESYNCING", styles.status(Tone::Warning)));
    }
    if state.read_only().is_some() {
        spans.push(Span::styled("  READ-ONLY", styles.dim()));
    }
    if state.paused() {
        spans.push(Span::styled(
            format!("  PAUSED at {}", clock(state.visible().ts_ms)),
            styles.paused(),
        ));
    }
    Line::from(spans)
}

/// The policy kind, both thresholds and the spill order, the fleet's rates, and who last changed
/// the policy. On a terminal too narrow for the line, the bounded kind is shortened to `bounded`
/// first, so the rates stay visible; then who changed it is said shorter (without the client's
/// address, then `(ws, lost on reload)`) and, when even that does not fit, not at all: a cut
/// `(changed` would say nothing.
fn policy_line(fleet: &FleetPicture, styles: &Styles, width: u16) -> Line<'static> {
    let dim = styles.dim();
    let Some(p) = &fleet.policy else {
        return Line::from(Span::styled(" waiting for the gateway's snapshot…", dim));
    };
    // Names a newer gateway sent that this console does not know are shown as sent, marked.
    let unknown =
        |name: &dyn std::fmt::Display| format!("{} (unknown)", printable(&name.to_string()));
    let (kind_name, order_name) = match &fleet.policy_unknown {
        Some(record) => (
            match &record.kind {
                Open::Unknown(name) => unknown(name),
                Open::Known(kind) => kind.as_str().to_owned(),
            },
            match &record.spill_order {
                Open::Unknown(name) => unknown(name),
                Open::Known(order) => order.as_str().to_owned(),
            },
        ),
        None => (
            p.kind.as_str().to_owned(),
            p.spill_order.as_str().to_owned(),
        ),
    };
    let line = |kind: &str, changed: Changed| {
        let mut spans = vec![
            Span::styled(" policy ", dim),
            Span::styled(kind.to_owned(), styles.value()),
            Span::styled("  gap ", dim),
            Span::styled(p.min_load_gap.to_string(), styles.value()),
            Span::styled("  skew ", dim),
            Span::styled(format!("{:.2}", p.max_load_skew), styles.value()),
            Span::styled("  order ", dim),
            Span::styled(order_name.clone(), styles.value()),
            Span::styled("  req/s ", dim),
            Span::raw(format!("{:.1}", fleet.totals.requests_per_s)),
            Span::styled("  spill/s ", dim),
            Span::raw(format!("{:.1}", fleet.totals.spills_per_s)),
        ];
        if let (Some(by), false) = (&fleet.policy_changed_by, changed == Changed::Unsaid) {
            let from = match (&fleet.policy_changed_from, changed) {
                (Some(client), Changed::Whole) => format!(" {}", printable(client)),
                _ => String::new(),
            };
            let words = if changed == Changed::Short {
                ""
            } else {
                "changed by "
            };
            spans.push(Span::styled(
                format!("  ({words}{}{from}", printable(&by.to_string())),
                dim,
            ));
            // A reload put the file's values back; anything else is lost on the next one.
            if *by != ChangeSource::Reload {
                spans.push(Span::styled(", lost on reload", styles.tone(Tone::Warning)));
            }
            spans.push(Span::styled(")", dim));
        }
        Line::from(spans)
    };
    let short_kind =
        if p.kind == PolicyKind::BoundedConsistentHashing && fleet.policy_unknown.is_none() {
            "bounded"
        } else {
            kind_name.as_str()
        };
    let candidates = [
        (kind_name.as_str(), Changed::Whole),
        (short_kind, Changed::Whole),
        (short_kind, Changed::NoClient),
        (short_kind, Changed::Short),
    ];
    candidates
        .into_iter()
        .map(|(kind, changed)| line(kind, changed))
        .find(|l| l.width() <= usize::from(width))
        .unwrap_or_else(|| line(short_kind, Changed::Unsaid))
}

/// How much of "who changed the policy" the policy line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Changed {
    /// `(changed by ws 127.0.0.1:55426, lost on reload)`.
    Whole,
    /// `(changed by ws, lost on reload)`.
    NoClient,
    /// `(ws, lost on reload)`.
    Short,
    /// Nothing.
    Unsaid,
}

/// Request and spill rates side by side, newest sample at the right edge; with a gateway that
/// reports admission, a third: the queue length and shed rate now, and the shed rate's sparkline.
fn sparklines(frame: &mut Frame, area: Rect, fleet: &FleetPicture, styles: &Styles) {
    type Get = fn(&Sample) -> f64;
    let queue_label;
    // (label, its style, the sparkline's style, the sampled rate)
    let mut series: Vec<(&str, Style, Style, Get)> = vec![
        (
            " req/s   ",
            styles.dim(),
            styles.requests_sparkline(),
            |s| s.requests_per_s,
        ),
        ("  spill/s ", styles.dim(), styles.spills_sparkline(), |s| {
            s.spills_per_s
        }),
    ];
    if let Some(admission) = &fleet.admission {
        queue_label = format!(
            "  queue {} shed/s {:.1} ",
            admission.waiting, admission.shed_per_s
        );
        // Waiting or shedding now is what an operator watching a storm looks for.
        let busy = admission.waiting > 0 || admission.shed_per_s > 0.0;
        let label_style = if busy {
            styles.tone(Tone::Warning)
        } else {
            styles.dim()
        };
        series.push((&queue_label, label_style, styles.sheds_sparkline(), |s| {
            s.shed_per_s
        }));
    }
    let constraints = if series.len() == 2 {
        vec![Constraint::Percentage(50); 2]
    } else {
        vec![Constraint::Ratio(1, series.len() as u32); series.len()]
    };
    let areas = Layout::horizontal(constraints).split(area);
    for ((label, label_style, style, get), rect) in series.into_iter().zip(areas.iter()) {
        let [label_area, spark_area] = Layout::horizontal([
            Constraint::Length(label.chars().count() as u16),
            Constraint::Min(0),
        ])
        .areas(*rect);
        frame.render_widget(Span::styled(label.to_owned(), label_style), label_area);
        let skip = fleet
            .history
            .len()
            .saturating_sub(spark_area.width as usize);
        // Tenths, so a fleet spilling 0.3/s still draws a bar.
        let data: Vec<u64> = fleet
            .history
            .iter()
            .skip(skip)
            .map(|s| (get(s) * 10.0).round().max(0.0) as u64)
            .collect();
        frame.render_widget(Sparkline::default().data(data).style(style), spark_area);
    }
}

/// One line for the most pressing thing to say: a local notice, then why the connection is down,
/// then the fate of the last threshold change, else the key hints.
fn message_line(state: &State, now: Instant, width: u16, styles: &Styles) -> Line<'static> {
    if let (None, Some(line)) = (state.notice(), replica_down_line(state)) {
        return Line::from(Span::styled(line, styles.tone(Tone::Alert)));
    }
    match (state.notice(), state.conn(), state.last_command()) {
        (Some(notice), _, _) => Line::from(Span::styled(
            format!(" ! {}", printable(notice)),
            styles.tone(Tone::Warning),
        )),
        (
            None,
            ConnStatus::Reconnecting {
                attempt, reason, ..
            },
            _,
        ) => Line::from(Span::styled(
            format!(" ✗ attempt {attempt}: {}", printable(reason)),
            styles.tone(Tone::Alert),
        )),
        (None, _, Some(cmd)) => command_line(cmd, state, styles),
        // What is wrong beats the key hints; the open pane says it at length.
        (None, _, None) if !state.ui().warnings_open() => {
            super::warnings::summary_line(&state.warnings(now), width, styles)
                .unwrap_or_else(|| Line::from(Span::styled(key_hints(state), styles.dim())))
        }
        (None, _, None) => Line::from(Span::styled(key_hints(state), styles.dim())),
    }
}

/// With several replicas, which one is down and why: ` ✗ replica 3 (+1 more) not merged: attempt
/// 2: Connection refused`, also while its next attempt is under way; `None` with one replica (the
/// plain ` ✗ attempt …` line says it) or when every replica is up or still connecting for the
/// first time.
fn replica_down_line(state: &State) -> Option<String> {
    if state.replicas().len() < 2 {
        return None;
    }
    let mut down = state
        .replicas()
        .iter()
        .enumerate()
        // Also while it tries again: a host that is gone spends seconds in every attempt.
        .filter(|(_, r)| *r.conn() != ConnStatus::Connected)
        .filter_map(|(i, r)| {
            r.last_failure()
                .map(|(attempt, reason)| (i, attempt, reason))
        });
    let (index, attempt, reason) = down.next()?;
    let more = match down.count() {
        0 => String::new(),
        n => format!(" (+{n} more)"),
    };
    Some(format!(
        " ✗ replica {}{more} not merged: attempt {attempt}: {}",
        index + 1,
        printable(reason)
    ))
}

/// A capacity in requests, `none` for 0 (no cap).
fn cap_text(cap: u64) -> String {
    if cap == 0 {
        "none".to_owned()
    } else {
        cap.to_string()
    }
}

/// What a change asks for, in the status line's words.
fn describe(change: &Change) -> String {
    match change {
        Change::Gap(from, to) => format!("gap {from} → {to}"),
        Change::Skew(from, to) => format!("skew {from:.2} → {to:.2}"),
        Change::Cap(from, to) => format!("cap {} → {}", cap_text(*from), cap_text(*to)),
        Change::Drain(worker) => format!("drain {worker}"),
        Change::Undrain(worker) => format!("undrain {worker}"),
    }
}

/// ` (all pools)` after a threshold change while one model's pool is shown: the gateway has one
/// set of thresholds, so the change applies to every pool, not only to the one on screen.
fn every_pool(change: &Change, state: &State) -> &'static str {
    match change {
        Change::Gap(..) | Change::Skew(..) if state.pool().is_some() => " (all pools)",
        _ => "",
    }
}

/// `#3 gap 2 → 3 ✓ applied`: the newest change and its fate; with several still pending, all of
/// them (`#1–#3 gap 2 → 5 … 3 pending`), so quick presses do not hide the ones before.
fn command_line(cmd: &CommandEntry, state: &State, styles: &Styles) -> Line<'static> {
    let pending: Vec<&CommandEntry> = state.pending().collect();
    if pending.len() > 1 {
        let first = pending[0];
        let last = pending[pending.len() - 1];
        let what = match (&first.change, &last.change) {
            (Change::Gap(from, _), Change::Gap(_, to)) => format!("gap {from} → {to}"),
            (Change::Skew(from, _), Change::Skew(_, to)) => format!("skew {from:.2} → {to:.2}"),
            (Change::Cap(from, _), Change::Cap(_, to)) => {
                format!("cap {} → {}", cap_text(*from), cap_text(*to))
            }
            _ => describe(&last.change),
        };
        return Line::from(vec![
            Span::styled(format!(" #{}–#{} ", first.id, last.id), styles.dim()),
            Span::raw(what),
            Span::styled(every_pool(&last.change, state), styles.dim()),
            Span::raw(" "),
            Span::styled(
                format!("… {} pending", pending.len()),
                styles.status(Tone::Warning),
            ),
        ]);
    }
    // Short words: the gateway's message already names the field, and it must fit in 80 columns.
    let (status, tone) = match &cmd.state {
        CommandState::Pending => ("… pending".to_owned(), Tone::Warning),
        CommandState::Applied if cmd.change.threshold().is_some() => {
            ("✓ applied, until reload".to_owned(), Tone::Good)
        }
        CommandState::Applied => ("✓ applied".to_owned(), Tone::Good),
        CommandState::Unconfirmed => (
            format!(
                "? unconfirmed: no answer within {} s (a late one still counts)",
                COMMAND_TIMEOUT.as_secs()
            ),
            Tone::Warning,
        ),
        CommandState::Failed(msg) => (format!("✗ {msg}"), Tone::Alert),
    };
    Line::from(vec![
        Span::styled(format!(" #{} ", cmd.id), styles.dim()),
        Span::raw(describe(&cmd.change)),
        Span::styled(every_pool(&cmd.change, state), styles.dim()),
        Span::raw(" "),
        Span::styled(status, styles.status(tone)),
    ])
}
