//! The spill log, newest first: each spill with the worker it left and the one it went to (or `✗`
//! when no worker was eligible and it stayed), and the numbers the bounded rule compared. Lines keep
//! every number and shorten the key when the panel is narrow.

use bch_core::policy::Branch;
use bch_core::telemetry::SpillEvent;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{clock, truncate_middle};
use crate::state::{Fleet, Panel, State};

/// Draws the spill log at `area`, from the scroll offset on.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let fleet = state.visible();
    let title = Line::from(vec![
        Span::raw(" Spills "),
        Span::styled(
            format!("{} total, newest first ", fleet.totals.spills_total),
            styles.dim(),
        ),
    ]);
    let block = panel_block(state.ui().focus() == Panel::Spills, title, styles);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let visible = inner.height as usize;
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
        vec![Line::from(Span::styled(empty_log(fleet), styles.dim()))]
    } else {
        fleet
            .spills
            .iter()
            .rev()
            .skip(start)
            .take(visible)
            .map(|s| spill_line(s, usize::from(inner.width), styles))
            .collect()
    };
    frame.render_widget(Paragraph::new(lines), inner);
}

/// What an empty log means: no spill yet, or no data yet to tell.
fn empty_log(fleet: &Fleet) -> &'static str {
    if fleet.policy.is_some() {
        "no spills: every explicit key stayed on its preferred worker"
    } else {
        "no data yet"
    }
}

/// Whether the spill found no eligible worker and stayed on the preferred one.
fn stayed(s: &SpillEvent) -> bool {
    s.branch == Branch::ExplicitRoutingKeyNoEligibleCandidate
}

/// One spill, in full when `width` columns allow it. Otherwise in the compact form that keeps every
/// number of the rule — `12:00:00 key w0→w1 9>2+2 9>3.50×1.50`: the preferred worker's load was
/// above min + gap and above mean × skew — and shortens the key instead.
fn spill_line(s: &SpillEvent, width: usize, styles: &Styles) -> Line<'static> {
    let full = spill_line_full(s, styles);
    if full.width() <= width {
        return full;
    }
    let (target, target_style) = if stayed(s) {
        (format!("{}✗", s.from), styles.tone(Tone::Alert))
    } else {
        (format!("{}→{}", s.from, s.to), styles.tone(Tone::Warning))
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
        Span::styled(format!("{time} "), styles.dim()),
        Span::raw(format!("{key} ")),
        Span::styled(target, target_style),
        Span::raw(format!(" {rule}")),
    ])
}

/// `12:00:00.085 chat-session-0001 w0 → w1 pref 9 min 2 mean 3.50 gap 2 skew 1.50`.
fn spill_line_full(s: &SpillEvent, styles: &Styles) -> Line<'static> {
    let dim = styles.dim();
    let target = if stayed(s) {
        Span::styled(format!("{} ✗ stayed", s.from), styles.tone(Tone::Alert))
    } else {
        Span::styled(format!("{} → {}", s.from, s.to), styles.tone(Tone::Warning))
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
