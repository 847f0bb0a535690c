//! DNS discovery trouble, on the workers panel's bottom border: `⚠ DNS dns:NAME failing: why` when
//! a source the gateway discovers workers from fails or answers empty, so an operator sees why
//! workers are missing (or frozen) without reading the gateway's log. Nothing is drawn while every
//! source answers, or without discovery.
//!
//! Every connected replica reports its own sources; a source in trouble on some replicas only
//! names them.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use super::styles::{Styles, Tone};
use super::text::{printable, truncate_middle, truncate_right};
use crate::state::State;

/// One source in trouble: its label, state, last error and the replicas (1-based) reporting it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Trouble {
    source: String,
    state: String,
    error: Option<String>,
    replicas: Vec<usize>,
}

/// The sources in trouble across `state`'s replicas, in the order the replicas list them.
fn troubles(state: &State) -> Vec<Trouble> {
    let mut found: Vec<Trouble> = Vec::new();
    for (index, replica) in state.replicas().iter().enumerate() {
        // A replica that is down, or not yet described anew since it reconnected, says nothing
        // now: its last frame's sources would be stale.
        if !replica.merged() {
            continue;
        }
        for source in replica
            .fleet()
            .discovery
            .iter()
            .filter(|s| s.state.is_trouble())
        {
            let state = source.state.to_string();
            match found
                .iter_mut()
                .find(|t| t.source == source.source && t.state == state)
            {
                Some(known) => known.replicas.push(index + 1),
                None => found.push(Trouble {
                    source: printable(&source.source).into_owned(),
                    state,
                    error: source
                        .last_error
                        .as_deref()
                        .map(|e| printable(e).into_owned()),
                    replicas: vec![index + 1],
                }),
            }
        }
    }
    found
}

/// The warning's parts for the first source in trouble: what must stay (`⚠ DNS SOURCE STATE`), the
/// error that may give way, and what follows it (the replicas when not all of several report it,
/// how many more sources are in trouble).
struct Warning {
    source: String,
    state: String,
    error: Option<String>,
    tail: String,
}

fn warning(troubles: &[Trouble], replica_count: usize) -> Option<Warning> {
    let first = troubles.first()?;
    let mut tail = String::new();
    if replica_count > 1 && first.replicas.len() < replica_count {
        let listed: Vec<String> = first.replicas.iter().map(ToString::to_string).collect();
        tail.push_str(&format!(" (replica {})", listed.join(",")));
    }
    if troubles.len() > 1 {
        tail.push_str(&format!(" +{} more", troubles.len() - 1));
    }
    Some(Warning {
        source: first.source.clone(),
        state: first.state.clone(),
        error: first.error.clone(),
        tail,
    })
}

impl Warning {
    /// The whole warning, with a blank at each end for the border.
    fn whole(&self) -> String {
        self.within(usize::MAX)
    }

    /// The warning in at most `width` characters: whole when it fits; else the error is cut
    /// (`no answer wi…`), then left out, then the source's name is cut in the middle. The state
    /// word is what says there is trouble, so it stays.
    fn within(&self, width: usize) -> String {
        let build = |source: &str, error: Option<&str>| {
            let error = error.map(|e| format!(": {e}")).unwrap_or_default();
            format!(" ⚠ DNS {source} {}{error}{} ", self.state, self.tail)
        };
        let whole = build(&self.source, self.error.as_deref());
        if whole.chars().count() <= width {
            return whole;
        }
        let bare = build(&self.source, None);
        let room = width.saturating_sub(bare.chars().count());
        // ": " and at least four characters of the error, or none of it.
        if let Some(error) = self.error.as_deref().filter(|_| room >= 6) {
            return build(&self.source, Some(&truncate_right(error, room - 2)));
        }
        if bare.chars().count() <= width {
            return bare;
        }
        let over = bare.chars().count() - width;
        let name = truncate_middle(
            &self.source,
            self.source.chars().count().saturating_sub(over),
        );
        build(&name, None)
    }
}

/// Draws the warning in the workers panel at `area`, if a source is in trouble: whole, wrapped,
/// in the panel's free rows below the workers when it fits there (a gateway whose resolver is
/// dead has found no worker, and the empty panel is where an operator looks); else on the bottom
/// border, where the error gives way first and the scroll hint keeps its room when it is drawn.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let Some(warning) = warning(&troubles(state), state.replicas().len()) else {
        return;
    };
    if area.height < 3 || area.width < 14 {
        return;
    }
    let style = styles.status(Tone::Alert);
    let inner_width = area.width - 2;
    // The legend's row, then one per worker, as the workers panel draws them.
    let rows_visible = area.height.saturating_sub(3) as usize;
    let workers = state.visible().workers.len();
    let free = rows_visible.saturating_sub(workers) as u16;
    let whole = warning.whole();
    let lines_needed = whole
        .trim()
        .chars()
        .count()
        .div_ceil(usize::from(inner_width).saturating_sub(1).max(1)) as u16;
    if free > lines_needed {
        // One blank row between the last worker and the warning.
        let top = area.y + 1 + 1 + workers as u16 + 1;
        let body = Rect::new(area.x + 1, top, inner_width, area.bottom() - 1 - top);
        let text = Paragraph::new(Line::from(Span::styled(whole.trim().to_owned(), style)))
            .wrap(Wrap { trim: true });
        frame.render_widget(text, body);
        return;
    }
    // The scroll hint (` 17–32 of 64 `) at its widest, and a column between.
    let hint = if workers > rows_visible {
        format!(" {workers}–{workers} of {workers} ")
            .chars()
            .count() as u16
            + 1
    } else {
        0
    };
    let width = inner_width.saturating_sub(hint);
    let row = Rect::new(area.x + 1, area.bottom() - 1, width, 1);
    let line = Line::from(Span::styled(warning.within(usize::from(width)), style));
    frame.render_widget(Paragraph::new(line), row);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bch_core::telemetry::{
        DiscoveryKind, DiscoverySource, DiscoveryState, ServerFrame, ServerMessage, Snapshot,
    };
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use crate::conn::{ConnEvent, ConnStatus};
    use crate::state::ReplicaId;

    fn source(name: &str, state: DiscoveryState, error: Option<&str>) -> DiscoverySource {
        DiscoverySource {
            name: name.into(),
            source: format!("dns:{name}"),
            kind: DiscoveryKind::Address.into(),
            state: state.into(),
            last_error: error.map(str::to_owned),
            last_error_ms: None,
            last_good_ms: None,
            last_good_age_ms: None,
            workers: 0,
        }
    }

    fn console(replicas: &[Vec<DiscoverySource>]) -> State {
        let urls = (0..replicas.len())
            .map(|i| format!("ws://127.0.0.1:{}/ws", 9000 + i))
            .collect();
        let mut state = State::for_replicas(urls);
        for (i, discovery) in replicas.iter().enumerate() {
            state.apply_replica_event(ReplicaId(i), ConnEvent::Status(ConnStatus::Connected));
            let snapshot = Snapshot {
                ts_ms: 1_767_268_800_000,
                policy: Default::default(),
                workers: Vec::new(),
                ring: Some(bch_core::telemetry::RingOwnership {
                    virtual_nodes: 150,
                    workers: Vec::new(),
                }),
                keys: Vec::new(),
                spills: Vec::new(),
                totals: Default::default(),
                discovery: discovery.clone(),
                admission: None,
                read_only: false,
            };
            let frame = ServerFrame::new(0, ServerMessage::Snapshot(snapshot));
            state.apply_replica_frame(ReplicaId(i), frame);
        }
        state
    }

    fn screen(state: &State, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        // The workers panel's frame, as the layout gives it: the warning goes on its bottom border.
        terminal
            .draw(|f| draw(f, f.area(), state, &Styles::default()))
            .unwrap();
        let buffer = terminal.backend().buffer();
        let mut out = String::new();
        for y in 0..buffer.area.height {
            for x in 0..buffer.area.width {
                out.push_str(buffer[(x, y)].symbol());
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn a_failing_source_is_named_with_its_error_and_a_good_one_is_not() {
        let state = console(&[vec![
            source("ok.llm.test", DiscoveryState::Ok, None),
            source("llm.test", DiscoveryState::Failing, Some("no answer")),
        ]]);
        let drawn = screen(&state, 120, 40);
        assert!(
            drawn.contains("⚠ DNS dns:llm.test failing: no answer"),
            "{drawn}"
        );
        assert!(!drawn.contains("dns:ok.llm.test"), "{drawn}");
        let quiet = console(&[vec![source("ok.llm.test", DiscoveryState::Ok, None)]]);
        assert!(!screen(&quiet, 120, 40).contains("⚠ DNS"));
    }

    #[test]
    fn trouble_on_some_replicas_names_them_and_more_sources_are_counted() {
        let failing = source("llm.test", DiscoveryState::Empty, Some("NXDOMAIN"));
        let other = source("b.test", DiscoveryState::Failing, None);
        let state = console(&[
            vec![failing.clone()],
            vec![source("llm.test", DiscoveryState::Ok, None)],
            vec![failing, other],
        ]);
        assert_eq!(
            warning(&troubles(&state), 3).map(|w| w.whole()).as_deref(),
            Some(" ⚠ DNS dns:llm.test empty: NXDOMAIN (replica 1,3) +1 more ")
        );
        let drawn = screen(&state, 80, 24);
        assert!(drawn.contains("⚠ DNS dns:llm.test"), "{drawn}");
    }

    #[test]
    fn a_replica_that_is_down_reports_nothing() {
        let mut state = console(&[vec![source(
            "llm.test",
            DiscoveryState::Failing,
            Some("timeout"),
        )]]);
        state.apply_replica_event(
            ReplicaId(0),
            ConnEvent::Status(ConnStatus::Reconnecting {
                retry_at: tokio::time::Instant::now(),
                attempt: 1,
                reason: "connection refused".into(),
            }),
        );
        assert!(warning(&troubles(&state), 1).is_none());
    }
}
