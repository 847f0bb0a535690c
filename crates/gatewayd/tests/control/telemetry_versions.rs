//! The telemetry protocol's two versions against the real gateway and the real console state:
//! a client that asks for nothing gets version 1 (every arc, a `ring` frame per membership change),
//! one that asks for `?v=2` gets no arcs and membership deltas, and the console reaches the same
//! picture from either. Also the bytes a console receives up to the first tick at 10,000 workers.

use std::time::Duration;

use bch_core::telemetry::{RingOwnership, ServerFrame, ServerMessage, WorkerRecord};
use bch_tui::{ConnConfig, ConnEvent, ConnHandle, ConnStatus, ReplicaId, State};
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::common::ws::Client;
use crate::common::*;

/// A console state with one replica, connected.
fn console() -> State {
    let mut state = State::for_replicas(vec!["ws://gateway/ws".into()]);
    state.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    state
}

/// Applies `frame` to the console; it must not ask for a resync (the frames are gap-free and
/// the deltas add up).
fn apply(state: &mut State, frame: ServerFrame) {
    let resync = state.apply_replica_frame(ReplicaId(0), frame);
    assert_eq!(
        resync, None,
        "the console followed the frames without a resync"
    );
}

/// The parts of a worker list that membership decides: names, URLs and ring identities, in order.
fn membership(workers: &[WorkerRecord]) -> Vec<(String, String, Option<String>)> {
    workers
        .iter()
        .map(|w| (w.name.clone(), w.url.clone(), w.ring_id.clone()))
        .collect()
}

fn ring_of(state: &State) -> RingOwnership {
    let ring = state
        .visible()
        .ring
        .as_ref()
        .expect("the console has a ring");
    RingOwnership::clone(ring)
}

#[tokio::test]
async fn consoles_of_both_versions_reach_the_gateways_ring_and_membership() {
    let (a, b, c, d) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
        fake_worker("d").await,
    );
    let mut config = test_config(&[&a, &b, &c]);
    config.workers[1].ring_id = Some("b-rack-7".into());
    let gateway = start(config).await;

    // An old console asks for nothing and gets version 1: the snapshot carries every arc.
    let mut old = Client::connect(&gateway).await;
    let first = old.frame().await;
    let ServerMessage::Snapshot(old_snapshot) = &first.message else {
        panic!("a snapshot first, got {first:?}");
    };
    let gateways_ring = old_snapshot.ring.clone().expect("version 1 sends the arcs");
    let mut on_v1 = console();
    apply(&mut on_v1, first);

    // A new console asks for version 2: no arcs; it computes the ring from the workers.
    let mut new = Client::connect_to(&gateway, "/ws?v=2", 2).await;
    let first = new.frame().await;
    let ServerMessage::Snapshot(snapshot) = &first.message else {
        panic!("a snapshot first, got {first:?}");
    };
    assert_eq!(snapshot.ring, None, "version 2 sends no arcs");
    assert_eq!(snapshot.workers[1].ring_id.as_deref(), Some("b-rack-7"));
    let mut on_v2 = console();
    apply(&mut on_v2, first);
    assert_eq!(
        ring_of(&on_v2),
        gateways_ring,
        "the console's ring is the gateway's"
    );
    assert_eq!(ring_of(&on_v1), gateways_ring);

    // One worker arrives, one leaves.
    let http = client();
    let added = http
        .post(format!("http://{}/admin/workers", gateway.control_addr))
        .json(&serde_json::json!({"name": "d", "url": d.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let removed = http
        .delete(format!("http://{}/admin/workers/a", gateway.control_addr))
        .send()
        .await
        .unwrap();
    assert!(removed.status().is_success(), "{}", removed.status());
    let expected = ["b", "c", "d"];
    let names = |state: &State| -> Vec<String> {
        state
            .visible()
            .workers
            .iter()
            .map(|w| w.name.clone())
            .collect()
    };

    // Version 2: deltas only, each naming what changed, never the whole list.
    let mut deltas = 0;
    while names(&on_v2) != expected {
        let frame = new.frame().await;
        match &frame.message {
            ServerMessage::Membership(delta) => {
                deltas += 1;
                assert!(delta.added.len() + delta.changed.len() <= 1, "{delta:?}");
                assert!(delta.removed.len() <= 1, "{delta:?}");
            }
            ServerMessage::Ring(_) => panic!("a version 2 client gets no ring frame"),
            _ => {}
        }
        apply(&mut on_v2, frame);
    }
    assert!(deltas >= 1);
    // Version 1: whole `ring` frames, never a delta.
    while names(&on_v1) != expected {
        let frame = old.frame().await;
        assert!(
            !matches!(frame.message, ServerMessage::Membership(_)),
            "a version 1 client gets no delta"
        );
        apply(&mut on_v1, frame);
    }

    // A console starting now, from a version 2 snapshot, has what the deltas built.
    let mut fresh = Client::connect_to(&gateway, "/ws?v=2", 2).await;
    let mut from_snapshot = console();
    apply(&mut from_snapshot, fresh.frame().await);
    let ServerMessage::Snapshot(now) = Client::connect(&gateway).await.frame().await.message else {
        panic!("a snapshot first");
    };
    let gateways_ring = now.ring.expect("version 1 sends the arcs");
    for state in [&on_v1, &on_v2, &from_snapshot] {
        assert_eq!(
            membership(&state.visible().workers),
            membership(&now.workers)
        );
        assert_eq!(ring_of(state), gateways_ring);
    }
    gateway.shutdown().await;
}

/// The console's own network task asks for version 2 (and an old gateway, which ignores the
/// query, would answer version 1, which the state above reads too).
#[tokio::test]
async fn the_console_asks_for_version_2() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let mut handle =
        ConnHandle::spawn(ConnConfig::new(format!("ws://{}/ws", gateway.control_addr)));
    let frame = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match handle.events.recv().await.expect("the task runs") {
                ConnEvent::Frame(frame) => return frame,
                ConnEvent::BadFrame(error) => panic!("unreadable frame: {error}"),
                _ => {}
            }
        }
    })
    .await
    .expect("a frame within 10 s");
    assert_eq!(frame.v, 2);
    let ServerMessage::Snapshot(snapshot) = frame.message else {
        panic!("a snapshot first");
    };
    assert_eq!(snapshot.ring, None);
    handle.task.abort();
    gateway.shutdown().await;
}

/// Bytes of every frame up to and including the first tick, on a connection to `path`.
async fn bytes_to_first_tick(gateway: &gatewayd::RunningGateway, path: &str) -> usize {
    // Version 1's snapshot at 10,000 workers is over tungstenite's 16 MiB default limit (which
    // is why the console could not connect to such a fleet before version 2).
    let config = WebSocketConfig::default()
        .max_message_size(Some(256 << 20))
        .max_frame_size(Some(256 << 20));
    let (mut socket, _) = tokio_tungstenite::connect_async_with_config(
        format!("ws://{}{path}", gateway.control_addr),
        Some(config),
        false,
    )
    .await
    .expect("websocket upgrade");
    let mut bytes = 0;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), socket.next())
            .await
            .expect("a frame within 60 s")
            .expect("socket open")
            .expect("valid frame");
        let Message::Text(text) = message else {
            continue;
        };
        bytes += text.len();
        let frame: ServerFrame = serde_json::from_str(&text).expect("frame parses");
        if matches!(frame.message, ServerMessage::Tick(_)) {
            return bytes;
        }
    }
}

/// At 10,000 workers (not live: probes slowed to one an hour, none awaited) a version 2 console
/// gets at most 3 MB up to the first tick; a version 1 console gets every arc.
#[tokio::test]
async fn first_frames_at_10_000_workers_fit_in_3_mb() {
    let mut config = test_config(&[]);
    config.health.interval = Duration::from_secs(3_600);
    config.workers = (0..10_000)
        .map(|i| gatewayd::config::WorkerConfig {
            name: Some(format!("w{i:05}")),
            url: format!(
                "http://10.{}.{}.{}:8000",
                i / 65_536,
                (i / 256) % 256,
                i % 256
            ),
            ring_id: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            server_name: None,
            models: Vec::new(),
        })
        .collect();
    let gateway = start(config).await;
    let v2 = bytes_to_first_tick(&gateway, "/ws?v=2").await;
    let v1 = bytes_to_first_tick(&gateway, "/ws").await;
    eprintln!("first frames at 10,000 workers: version 2 {v2} bytes, version 1 {v1} bytes");
    assert!(
        v2 <= 3_000_000,
        "version 2: {v2} bytes up to the first tick"
    );
    assert!(
        v1 > v2 * 4,
        "version 1 carries every arc: {v1} vs {v2} bytes"
    );
    gateway.shutdown().await;
}
