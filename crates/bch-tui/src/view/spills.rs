//! The spill log, newest first: each spill with the worker it left and the one it went to (or `✗`
//! when no worker was eligible and it stayed), and the numbers the bounded rule compared. Lines keep
//! every number and shorten the key when the panel is narrow. When the kept log turns over in
//! seconds (full, and spanning less than [`GROUP_BELOW_MS`]), single events scroll past unread:
//! the log is then grouped per key and worker pair, with a count and the newest numbers. A
//! capacity spill (the preferred worker was full) says `full` and the load it left instead of the
//! bound's comparison.

use bch_core::policy::Branch;
use bch_core::telemetry::{SpillCause, SpillEvent};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{
    MAX_WANTED_KEY_W, clock, printable, shown_width, truncate_left, truncate_middle, widest,
};
use crate::state::{FleetPicture, Panel, SPILL_LOG_CAP, State};

/// The compact line never cuts a key shorter than this.
const MIN_KEY: usize = 6;
/// ...nor a worker name: `…7:8000` still shows the port.
const MIN_NAME: usize = 8;
/// A full log spanning less than this (ms) is shown grouped per key and worker pair.
pub(super) const GROUP_BELOW_MS: u64 = 10_000;
/// `9>2+2 9>3.50×1.50`: the rule's width when the log has none to measure.
const TYPICAL_RULE_W: usize = 17;

/// Columns (borders included) the spill log needs for a compact line with the key and both worker
/// names whole: the longest tracked or logged key (up to [`MAX_WANTED_KEY_W`]), the longest worker
/// name twice and the widest rule in the log. Measured on what is tracked rather than on the lines
/// on screen, so the layout does not flip as the log scrolls.
pub(super) fn wanted_width(state: &State) -> u16 {
    let fleet = state.visible();
    let key = fleet
        .keys
        .values()
        .map(|k| k.key.as_str())
        .chain(fleet.spills.iter().map(|s| s.key.as_str()))
        .map(shown_width)
        .max()
        .unwrap_or(0)
        .min(usize::from(MAX_WANTED_KEY_W));
    let name = widest(fleet.workers.iter().map(|w| w.name.as_str()), usize::MAX).unwrap_or(0);
    let rule = fleet
        .spills
        .iter()
        .map(|s| rule_text(s).chars().count())
        .max()
        .unwrap_or(TYPICAL_RULE_W);
    // `HH:MM:SS key from→to rule`, in borders.
    let line = 8 + 1 + key + 1 + name + 1 + name + 1 + rule;
    u16::try_from(line + 2).unwrap_or(u16::MAX)
}

/// Rows the log needs for everything it keeps (grouped when it turns over fast), in borders.
pub(super) fn wanted_height(state: &State) -> u16 {
    let fleet = state.visible();
    let lines = if grouped(fleet) {
        groups(fleet).len()
    } else {
        fleet.spills.len()
    };
    u16::try_from(lines.max(1) + 2).unwrap_or(u16::MAX)
}

/// The spills of one key from one worker to another within the kept log: how many, and the
/// newest (whose numbers are shown).
struct Group<'a> {
    count: usize,
    newest: &'a SpillEvent,
}

/// The kept log grouped per (key, from, to, branch), newest group first.
fn groups(fleet: &FleetPicture) -> Vec<Group<'_>> {
    let mut groups: Vec<Group> = Vec::new();
    for event in fleet.spills.iter().rev() {
        let same = |g: &&mut Group| {
            let n = g.newest;
            n.key == event.key
                && n.from == event.from
                && n.to == event.to
                && n.branch == event.branch
                && n.cause == event.cause
        };
        match groups.iter_mut().find(same) {
            Some(group) => group.count += 1,
            None => groups.push(Group {
                count: 1,
                newest: event,
            }),
        }
    }
    groups
}

/// Whether the kept log turns over too fast to read event by event.
fn grouped(fleet: &FleetPicture) -> bool {
    let (Some(oldest), Some(newest)) = (fleet.spills.front(), fleet.spills.back()) else {
        return false;
    };
    fleet.spills.len() >= SPILL_LOG_CAP
        && newest.ts_ms.saturating_sub(oldest.ts_ms) < GROUP_BELOW_MS
}

/// Draws the spill log at `area`, from the scroll offset on.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let fleet = state.visible();
    let grouped = grouped(fleet);
    let how = if grouped {
        let span = fleet.spills.back().map_or(0, |n| n.ts_ms)
            - fleet.spills.front().map_or(0, |o| o.ts_ms);
        format!(
            "{} total; the last {} in {:.1}s by key and pair ",
            fleet.totals.spills_total,
            fleet.spills.len(),
            span as f64 / 1000.0
        )
    } else {
        format!("{} total, newest first ", fleet.totals.spills_total)
    };
    // A pool's log keeps its workers' spills; the count is the gateway's, over every pool.
    let whose = if fleet.pool.is_some() { "fleet " } else { "" };
    let title = Line::from(vec![
        Span::raw(" Spills "),
        Span::styled(format!("{whose}{how}"), styles.dim()),
    ]);
    let block = panel_block(state.ui().focus() == Panel::Spills, title, styles);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let visible = inner.height as usize;
    // While the key table has focus, the selected key's spills stand out.
    let selected = (state.ui().focus() == Panel::Keys)
        .then(|| state.selected_key())
        .flatten()
        .map(|k| k.key.as_str());
    if grouped {
        let groups = groups(fleet);
        let start = scroll_window(
            frame,
            area,
            state.scroll(Panel::Spills),
            groups.len(),
            visible,
            styles,
        );
        let shown: Vec<&Group> = groups.iter().skip(start).take(visible).collect();
        let width = usize::from(inner.width);
        let full = shown.iter().all(|g| {
            spill_line_full(g.newest, styles).width() + count_text(g).chars().count() <= width
        });
        let lines: Vec<Line> = shown
            .iter()
            .map(|g| mark(group_line(g, width, full, styles), &g.newest.key, selected))
            .collect();
        frame.render_widget(Paragraph::new(lines), inner);
        return;
    }
    let len = fleet.spills.len();
    let start = scroll_window(
        frame,
        area,
        state.scroll(Panel::Spills),
        len,
        visible,
        styles,
    );
    let lines: Vec<Line> = if fleet.spills.is_empty() {
        let said = empty_log(fleet, usize::from(inner.width));
        vec![Line::from(Span::styled(said, styles.dim()))]
    } else {
        let shown: Vec<&SpillEvent> = fleet
            .spills
            .iter()
            .rev()
            .skip(start)
            .take(visible)
            .collect();
        let width = usize::from(inner.width);
        // One form for every line on screen, so the columns of the log line up.
        let full = shown
            .iter()
            .all(|s| spill_line_full(s, styles).width() <= width);
        shown
            .iter()
            .map(|s| mark(spill_line(s, width, full, styles), &s.key, selected))
            .collect()
    };
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `line` reversed when it is a spill of the `selected` key.
fn mark<'a>(line: Line<'a>, key: &str, selected: Option<&str>) -> Line<'a> {
    if selected == Some(key) {
        line.patch_style(Modifier::REVERSED)
    } else {
        line
    }
}

/// What an empty log means: no spill yet, or no data yet to tell; in the longest words that fit
/// `width` columns, never cut mid-word.
fn empty_log(fleet: &FleetPicture, width: usize) -> &'static str {
    if fleet.policy.is_none() {
        return "no data yet";
    }
    [
        "no spills: every explicit key stayed on its preferred worker",
        "no spills: every key stayed home",
    ]
    .into_iter()
    .find(|said| said.chars().count() <= width)
    .unwrap_or("no spills")
}

/// Whether the spill found no eligible worker and stayed on the preferred one.
fn stayed(s: &SpillEvent) -> bool {
    s.branch == Branch::ExplicitRoutingKeyNoEligibleCandidate
}

/// The branch, cause and load signal a newer gateway named that this console does not know, as
/// ` ?name` each (empty when it knows them all): shown as sent after the rule.
fn unknown_names(s: &SpillEvent) -> String {
    let mut names = String::new();
    let unknown = [
        &s.branch.known().is_none().then(|| s.branch.to_string()),
        &s.cause.known().is_none().then(|| s.cause.to_string()),
        &s.load_signal
            .known()
            .is_none()
            .then(|| s.load_signal.to_string()),
    ];
    for name in unknown.into_iter().flatten() {
        names.push_str(" ?");
        names.push_str(&printable(name));
    }
    names
}

/// One spill, in full (with the whole key) when `full` (every line on screen fits in full within
/// `width`). Otherwise in the compact form that keeps every number of the rule — `12:00:00 key w0→w1 9>2+2 9>3.50×1.50`: the preferred worker's load was
/// above min + gap and above mean × skew — and shortens the key instead.
fn spill_line(s: &SpillEvent, width: usize, full: bool, styles: &Styles) -> Line<'static> {
    if full {
        return spill_line_full(s, styles);
    }
    let time = clock(s.ts_ms);
    let time = time.split('.').next().unwrap_or_default().to_owned();
    let rule = rule_text(s);
    // Worker names are cut from the left (the port and the end of the address stay) only when
    // the line would not fit with the key at its shortest.
    let names = shown_width(&s.from) + shown_width(&s.to);
    let without_names = time.chars().count() + rule.chars().count() + 4 + MIN_KEY;
    let name_w = if without_names + names <= width {
        usize::MAX
    } else {
        (width.saturating_sub(without_names) / 2).max(MIN_NAME)
    };
    let cut = |name: &str| truncate_left(name, name_w);
    let (target, target_style) = if stayed(s) {
        (format!("{}✗", cut(&s.from)), styles.tone(Tone::Alert))
    } else {
        (
            format!("{}→{}", cut(&s.from), cut(&s.to)),
            styles.tone(Tone::Warning),
        )
    };
    let fixed = time.chars().count() + target.chars().count() + rule.chars().count() + 3;
    let key = truncate_middle(&s.key, width.saturating_sub(fixed).max(MIN_KEY));
    Line::from(vec![
        Span::styled(format!("{time} "), styles.dim()),
        Span::raw(format!("{key} ")),
        Span::styled(target, target_style),
        Span::raw(format!(" {rule}")),
    ])
}

/// `9>2+2 9>3.50×1.50`: the preferred worker's load was above min + gap and above mean × skew;
/// `full@4` for a capacity spill: the preferred worker was full at load 4.
fn rule_text(s: &SpillEvent) -> String {
    if s.cause == SpillCause::Capacity {
        return format!("full@{}{}", s.preferred_load, unknown_names(s));
    }
    format!(
        "{p}>{min}+{gap} {p}>{mean:.2}×{skew:.2}{unknown}",
        unknown = unknown_names(s),
        p = s.preferred_load,
        min = s.min_load,
        gap = s.min_load_gap,
        mean = s.mean_load,
        skew = s.max_load_skew,
    )
}

/// `×29 `: how many spills a group stands for.
fn count_text(g: &Group<'_>) -> String {
    format!("×{} ", g.count)
}

/// `12:00:00 hot-0 ×29 sim-0→sim-3 3>0+2 3>1.25×1.50`: a group's count and its newest spill in
/// the compact form.
fn group_line(g: &Group<'_>, width: usize, full: bool, styles: &Styles) -> Line<'static> {
    let count = count_text(g);
    let mut line = spill_line(
        g.newest,
        width.saturating_sub(count.chars().count()),
        full,
        styles,
    );
    let at = usize::from(!line.spans.is_empty());
    line.spans
        .insert(at, Span::styled(count, styles.status(Tone::Warning)));
    line
}

/// `12:00:00.085 chat-session-0001 w0 → w1 pref 9 min 2 mean 3.50 gap 2 skew 1.50`.
fn spill_line_full(s: &SpillEvent, styles: &Styles) -> Line<'static> {
    let dim = styles.dim();
    let target = if stayed(s) {
        Span::styled(
            format!("{} ✗ stayed", printable(&s.from)),
            styles.tone(Tone::Alert),
        )
    } else {
        Span::styled(
            format!("{} → {}", printable(&s.from), printable(&s.to)),
            styles.tone(Tone::Warning),
        )
    };
    if s.cause == SpillCause::Capacity {
        return Line::from(vec![
            Span::styled(format!("{} ", clock(s.ts_ms)), dim),
            Span::raw(format!("{} ", printable(&s.key))),
            target,
            Span::styled(" FULL", styles.status(Tone::Alert)),
            Span::styled(" pref ", dim),
            Span::raw(s.preferred_load.to_string()),
            Span::styled(unknown_names(s), styles.tone(Tone::Warning)),
        ]);
    }
    Line::from(vec![
        Span::styled(format!("{} ", clock(s.ts_ms)), dim),
        Span::raw(format!("{} ", printable(&s.key))),
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
        Span::styled(unknown_names(s), styles.tone(Tone::Warning)),
    ])
}
