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
use ratatui::widgets::Paragraph;

use super::styles::{Styles, Tone};
use crate::state::State;

/// Columns left free at the right of the bottom border for the panel's `17–32 of 64` hint.
const HINT_COLUMNS: u16 = 18;

/// One source in trouble: its label, state, last error and the replicas (1-based) reporting it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Trouble {
    source: String,
    state: &'static str,
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
            let state = source.state.as_str();
            match found
                .iter_mut()
                .find(|t| t.source == source.source && t.state == state)
            {
                Some(known) => known.replicas.push(index + 1),
                None => found.push(Trouble {
                    source: source.source.clone(),
                    state,
                    error: source.last_error.clone(),
                    replicas: vec![index + 1],
                }),
            }
        }
    }
    found
}

/// The warning's text: the first source with its error, then how many more; the replicas when
/// not all of several report it.
fn text(troubles: &[Trouble], replica_count: usize) -> Option<String> {
    let first = troubles.first()?;
    let mut text = format!(" ⚠ DNS {} {}", first.source, first.state);
    if let Some(error) = &first.error {
        text.push_str(": ");
        text.push_str(error);
    }
    if replica_count > 1 && first.replicas.len() < replica_count {
        let listed: Vec<String> = first.replicas.iter().map(ToString::to_string).collect();
        text.push_str(&format!(" (replica {})", listed.join(",")));
    }
    if troubles.len() > 1 {
        text.push_str(&format!(" +{} more", troubles.len() - 1));
    }
    text.push(' ');
    Some(text)
}

/// Draws the warning on the bottom border of the workers panel at `area`, if a source is in
/// trouble; cut at the right to leave the scroll hint its room.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let Some(text) = text(&troubles(state), state.replicas().len()) else {
        return;
    };
    if area.height < 2 || area.width < HINT_COLUMNS + 12 {
        return;
    }
    let width = area.width - 2 - HINT_COLUMNS;
    let shown: String = if text.chars().count() > width as usize {
        let mut cut: String = text.chars().take(width as usize - 2).collect();
        cut.push_str("… ");
        cut
    } else {
        text
    };
    let row = Rect::new(area.x + 1, area.bottom() - 1, width, 1);
    let line = Line::from(Span::styled(shown, styles.status(Tone::Alert)));
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
            kind: DiscoveryKind::Address,
            state,
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
                ring: bch_core::telemetry::RingOwnership {
                    virtual_nodes: 150,
                    workers: Vec::new(),
                },
                keys: Vec::new(),
                spills: Vec::new(),
                totals: Default::default(),
                discovery: discovery.clone(),
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
            text(&troubles(&state), 3).as_deref(),
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
        assert_eq!(text(&troubles(&state), 1), None);
    }
}
