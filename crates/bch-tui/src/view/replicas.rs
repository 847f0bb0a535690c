//! The replicas panel, shown when the console watches several gateway replicas: one row per
//! replica with its connection, the policy and load source it reports, what it answered to the
//! last threshold change, and DIFFERS when its settings are not the ones most replicas share.

use bch_core::fleet_load::LoadSource;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use tokio::time::Instant;

use super::panel::panel_block;
use super::styles::{Styles, Tone};
use super::text::{shown_width, truncate_left};
use crate::conn::ConnStatus;
use crate::state::{CommandState, Replica, Settings, State};

/// Rows the panel takes for `replicas` replicas: none for one, else one each plus the border.
pub(super) fn height(replicas: usize) -> u16 {
    if replicas > 1 {
        u16::try_from(replicas)
            .unwrap_or(u16::MAX)
            .saturating_add(2)
    } else {
        0
    }
}

/// Draws one row per replica at `area`.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, now: Instant, styles: &Styles) {
    let replicas = state.replicas();
    let differing = state.differing();
    let connected = replicas
        .iter()
        .filter(|r| *r.conn() == ConnStatus::Connected)
        .count();
    let title = Line::from(vec![
        Span::raw(" Replicas "),
        Span::styled(
            format!("{connected}/{} connected ", replicas.len()),
            styles.dim(),
        ),
    ]);
    let block = panel_block(false, title, styles);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let url_w = replicas
        .iter()
        .map(|r| shown_width(r.url()))
        .max()
        .unwrap_or(0)
        .clamp(8, 32);
    // The connection column as wide as its widest label now (`RECONNECTING IN 5s`), so the
    // settings after it stay one column under another.
    let label_w = replicas
        .iter()
        .map(|r| r.conn().label(now).chars().count())
        .max()
        .unwrap_or(0)
        .max(10);
    // The settings and the DIFFERS flag say what a replica reports; the URLs give way to them,
    // cut from the left (the port and path stay), not below 8 columns.
    let settings_w = replicas
        .iter()
        .zip(&differing)
        .filter_map(|(r, differs)| Some(settings_text(&r.settings()?, *differs).chars().count()))
        .max()
        .unwrap_or(0);
    let fixed = 3 + 1 + label_w + 1 + settings_w;
    let url_w = url_w.min(usize::from(inner.width).saturating_sub(fixed).max(8));
    let last = state.last_command();
    let lines: Vec<Line> = replicas
        .iter()
        .enumerate()
        .map(|(i, replica)| {
            let reply = last.and_then(|c| c.replies.get(i).map(|r| (c.id, r)));
            let widths = (url_w, label_w);
            row(replica, differing[i], reply, widths, now, styles)
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `● ws://a:9090/ws CONNECTED  gap 2 skew 1.50 load metrics DIFFERS  #3 ✓` (`metrics` is the
/// `worker_metrics` load source).
fn row(
    replica: &Replica,
    differs: bool,
    reply: Option<(u64, &CommandState)>,
    (url_w, label_w): (usize, usize),
    now: Instant,
    styles: &Styles,
) -> Line<'static> {
    let (dot, tone) = match replica.conn() {
        ConnStatus::Connected => ("●", Tone::Good),
        ConnStatus::Connecting => ("○", Tone::Warning),
        ConnStatus::Reconnecting { .. } => ("○", Tone::Alert),
    };
    let mut spans = vec![
        Span::styled(format!(" {dot} "), styles.status(tone)),
        Span::raw(format!("{:<url_w$} ", truncate_left(replica.url(), url_w))),
        Span::styled(
            format!("{:<label_w$} ", replica.conn().label(now)),
            styles.status(tone),
        ),
    ];
    match replica.settings() {
        Some(s) => {
            let source = short_source(s.load_source);
            spans.push(Span::styled("gap ", styles.dim()));
            spans.push(Span::styled(s.min_load_gap.to_string(), styles.value()));
            spans.push(Span::styled(" skew ", styles.dim()));
            spans.push(Span::styled(
                format!("{:.2}", s.max_load_skew),
                styles.value(),
            ));
            spans.push(Span::styled(" load ", styles.dim()));
            spans.push(Span::styled(format!("{source:<7}"), styles.value()));
        }
        None => spans.push(Span::styled("no policy yet", styles.dim())),
    }
    // Before the command's answer, whose refusal message may be long and get cut.
    if differs {
        spans.push(Span::styled(" DIFFERS", styles.status(Tone::Alert)));
    }
    if let Some((id, state)) = reply {
        let (text, tone) = match state {
            CommandState::Pending => (format!("  #{id} …"), Tone::Warning),
            CommandState::Applied => (format!("  #{id} ✓"), Tone::Good),
            CommandState::Unconfirmed => (format!("  #{id} ? unconfirmed"), Tone::Warning),
            CommandState::Failed(message) => (format!("  #{id} ✗ {message}"), Tone::Alert),
        };
        spans.push(Span::styled(text, styles.status(tone)));
    }
    Line::from(spans)
}

/// The load source in the row's word: short, so a row with a refusal still fits 80 columns.
fn short_source(source: LoadSource) -> &'static str {
    match source {
        LoadSource::Local => "local",
        LoadSource::WorkerMetrics => "metrics",
    }
}

/// The settings part of a row as plain text (`gap 2 skew 1.50 load metrics DIFFERS`), for its
/// width.
fn settings_text(s: &Settings, differs: bool) -> String {
    format!(
        "gap {} skew {:.2} load {:<7}{}",
        s.min_load_gap,
        s.max_load_skew,
        short_source(s.load_source),
        if differs { " DIFFERS" } else { "" }
    )
}
