//! Strings that came over the network never reach the terminal raw: a routing key, a worker name,
//! a discovery error or a spill's workers holding bidi overrides or isolates, line or paragraph
//! separators, zero-width characters or C0/C1 controls draw as one-cell characters in every panel,
//! at every size, and the rows keep their width.

mod common;

use bch_core::telemetry::{
    DiscoveryKind, DiscoverySource, DiscoveryState, KeyKind, KeyRecord, ServerMessage,
};
use bch_tui::{ConnEvent, ConnStatus, ReplicaId, State};
use common::{frame_at, render, snapshot_with};
use tokio::time::Instant;

/// Characters that must never be drawn raw: they reorder, hide or break what follows them.
const HOSTILE: [char; 17] = [
    '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', // embeddings and overrides
    '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', // isolates
    '\u{2028}', '\u{2029}', // line and paragraph separators
    '\u{200b}', '\u{200d}', '\u{feff}', // zero-width
    '\u{1b}', '\u{7}', '\u{9b}', // ESC, BEL and CSI (C1)
];

fn hostile(label: &str) -> String {
    format!("{label}\u{202e}evil\u{2066}\u{2028}x\u{200b}\u{1b}[2J\u{9b}1m\u{feff}")
}

/// A console whose snapshot and spill tick carry hostile text in every kind of network string.
fn console() -> State {
    let key = hostile("key");
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    let snapshot = snapshot_with(|snap| {
        snap.workers[0].name = hostile("w0");
        snap.workers[1].healthy = false;
        snap.workers[1].probe_failure = Some(hostile("refused"));
        snap.keys.push(KeyRecord {
            key: key.clone(),
            kind: KeyKind::Explicit.into(),
            preferred: hostile("w0"),
            current: "w1".into(),
            active: [(hostile("w0"), 3)].into_iter().collect(),
            requests_total: 5,
            spills_total: 1,
            last_seen_ms: snap.ts_ms,
        });
        snap.discovery.push(DiscoverySource {
            name: hostile("_http._tcp.example"),
            source: hostile("dns:_http._tcp.example"),
            kind: DiscoveryKind::Srv.into(),
            state: DiscoveryState::Failing.into(),
            last_error: Some(hostile("timeout")),
            last_error_ms: Some(snap.ts_ms),
            last_good_ms: None,
            last_good_age_ms: None,
            workers: 0,
        });
    });
    s.apply_replica_frame(ReplicaId(0), snapshot);
    let mut tick = frame_at("tick_spill", 1);
    let ServerMessage::Tick(ref mut body) = tick.message else {
        panic!("tick_spill.json holds a {:?}", tick.message);
    };
    for spill in &mut body.spills {
        spill.key = key.clone();
        spill.from = hostile("w0");
    }
    s.apply_replica_frame(ReplicaId(0), tick);
    s
}

#[test]
fn no_panel_draws_network_text_raw() {
    let state = console();
    for (width, height) in [(80, 24), (120, 40), (200, 50)] {
        let screen = render(&state, width, height, Instant::now());
        for c in HOSTILE {
            assert!(
                !screen.contains(c),
                "{width}x{height}: U+{:04X} drawn raw:\n{screen}",
                u32::from(c)
            );
        }
        assert!(
            screen.contains("key\u{fffd}evil"),
            "{width}x{height}: the hostile key is not shown:\n{screen}"
        );
        assert_eq!(screen.lines().count(), usize::from(height), "{screen}");
        for line in screen.lines() {
            assert!(
                line.chars().count() <= usize::from(width),
                "{width}x{height}: row wider than the screen: {line:?}"
            );
        }
    }
}
