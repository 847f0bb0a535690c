//! Helpers shared by the integration tests: recorded frames and rendering to text.
#![allow(dead_code)]

use bch_core::telemetry::{
    CommandId, DiscoveryKind, DiscoverySource, DiscoveryState, ServerFrame, ServerMessage, Snapshot,
};
use bch_tui::{ConnEvent, ConnStatus, ReplicaId, State};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use tokio::time::Instant;

/// The connection task's report that its connection failed (`reason`) and attempt `attempt + 1`
/// starts at `retry_at`.
pub fn reconnecting(retry_at: Instant, attempt: u32, reason: &str) -> ConnEvent {
    ConnEvent::Status(ConnStatus::Reconnecting {
        retry_at,
        attempt,
        reason: reason.into(),
    })
}

/// A DNS discovery source whose resolver stopped answering, having found `workers` (kept).
pub fn failing_dns(workers: u64) -> DiscoverySource {
    DiscoverySource {
        name: "llm-workers.test".into(),
        source: "dns:llm-workers.test".into(),
        kind: DiscoveryKind::Address.into(),
        state: DiscoveryState::Failing.into(),
        last_error: Some("no answer within timeout_ms 2000".into()),
        last_error_ms: None,
        last_good_ms: None,
        last_good_age_ms: None,
        workers,
    }
}

/// Loads a recorded frame from `tests/fixtures/<name>.json`.
pub fn frame(name: &str) -> ServerFrame {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The recorded frame `name` renumbered to `seq`.
pub fn frame_at(name: &str, seq: u64) -> ServerFrame {
    let mut f = frame(name);
    f.seq = seq;
    f
}

/// The recorded `error` frame (the gateway refusing a skew below 1.0), answering command `id`, at
/// `seq`.
pub fn refusal(id: u64, seq: u64) -> ServerFrame {
    let mut f = frame_at("error_skew", seq);
    let ServerMessage::Error(ref mut e) = f.message else {
        panic!("error_skew.json holds a {:?}", f.message);
    };
    e.id = Some(CommandId::Number(id));
    f
}

/// The message inside a recorded frame.
pub fn message(name: &str) -> ServerMessage {
    frame(name).message
}

/// The recorded snapshot with `edit` applied to it: the way to start from other thresholds or
/// loads through the front door, as the gateway would send them.
pub fn snapshot_with(edit: impl FnOnce(&mut Snapshot)) -> ServerFrame {
    let mut f = frame("snapshot");
    let ServerMessage::Snapshot(ref mut snap) = f.message else {
        panic!("snapshot.json holds a {:?}", f.message);
    };
    edit(snap);
    f
}

/// A connected console that has applied `snapshot_with(edit)`.
pub fn connected_with(edit: impl FnOnce(&mut Snapshot)) -> State {
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), snapshot_with(edit)),
        None
    );
    s
}

/// Draws the whole console into a `width × height` test terminal at `now`.
pub fn render(state: &State, width: u16, height: u16, now: Instant) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| bch_tui::draw(f, state, now)).unwrap();
    buffer_text(terminal.backend().buffer())
}

/// A buffer's symbols, one line per row, trailing blanks trimmed (colour is dropped; the view
/// carries every distinction in glyphs too).
pub fn buffer_text(buffer: &Buffer) -> String {
    let area = buffer.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut line = String::new();
        for x in area.left()..area.right() {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The fixtures' short names and what a real fleet calls them: gatewayd names a worker without a
/// configured name after its address (`10.244.1.17:8000`, pods of one Deployment share the port),
/// and multi-tenant clients prefix their keys, so labels share a long prefix and differ at the end.
const REALISTIC: [(&str, &str); 8] = [
    ("\"w0\"", "\"10.244.1.17:8000\""),
    ("\"w1\"", "\"10.244.2.5:8000\""),
    ("\"w2\"", "\"10.244.3.121:8000\""),
    ("\"w3\"", "\"10.244.0.9:8000\""),
    (
        "\"chat-session-0001\"",
        "\"tenant-acme/chat-session-7f3a9c21-0001\"",
    ),
    (
        "\"chat-session-0002\"",
        "\"tenant-acme/chat-session-7f3a9c21-0002\"",
    ),
    ("\"agent-7/plan\"", "\"tenant-globex/agent-7/plan\""),
    ("\"rag-docs-v2\"", "\"tenant-acme/rag-docs-v2\""),
];

/// The recorded frame `name` at `seq`, with the realistic worker names and keys of [`REALISTIC`]
/// in place of the short ones (in every record, map key and spill event).
pub fn realistic_frame(name: &str, seq: u64) -> ServerFrame {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for (short, real) in REALISTIC {
        text = text.replace(short, real);
    }
    let mut f: ServerFrame = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    f.seq = seq;
    f
}
