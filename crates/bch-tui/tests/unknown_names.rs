//! A newer gateway names things this console does not know: a spill branch, a spill cause, a key
//! kind, a policy kind, a spill order, a worker state, a worker source, a load signal, a discovery
//! source's kind and state, who changed the policy. The console reads every such frame (no
//! resync, the ring and keys are there), shows the names as text, and knows the bound of a policy
//! it does not know is not its to draw. Frames of an unknown type are skipped without a resync.

mod common;

use std::time::Duration;

use bch_core::telemetry::ServerFrame;
use bch_tui::{Action, ConnConfig, ConnEvent, ConnHandle, Effect, ReplicaId, State};
use common::render;
use futures_util::SinkExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(10);
const TS: u64 = 1_767_268_800_000;

fn worker(name: &str, state: &str, source: &str) -> Value {
    json!({
        "name": name, "url": format!("http://{name}:8000"), "healthy": true, "state": state,
        "active": 2, "requests_total": 10, "spilled_in_total": 0, "spilled_out_total": 0,
        "errors_total": 0, "source": source,
    })
}

fn frames() -> Vec<Value> {
    let policy = json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2,
                        "max_load_skew": 1.5, "virtual_nodes": 20,
                        "spill_order": "nearest_gpu", "load_source": "local"});
    let spill = json!({
        "ts_ms": TS, "key": "chat-1", "branch": "explicit_routing_key_teleport", "from": "w0",
        "to": "w1", "preferred_load": 9, "min_load": 1, "mean_load": 2.0, "min_load_gap": 2,
        "max_load_skew": 1.5, "load_signal": "psychic", "cause": "cosmic_ray",
    });
    vec![
        json!({
            "v": 2, "seq": 0, "type": "snapshot", "ts_ms": TS, "policy": policy,
            "workers": [worker("w0", "active", "static"), worker("w1", "cordoned", "consul:gpu"),
                        worker("w2", "active", "static")],
            "keys": [{"key": "chat-1", "kind": "semantic", "preferred": "w0", "current": "w1",
                      "active": {"w1": 1}, "requests_total": 3, "spills_total": 1,
                      "last_seen_ms": TS}],
            "spills": [spill],
            "totals": {"requests_per_s": 1.0, "spills_per_s": 0.5, "requests_total": 3,
                       "spills_total": 1},
            "discovery": [{"name": "gpu", "source": "consul:gpu", "kind": "consul",
                           "state": "throttled", "workers": 1}],
        }),
        json!({"v": 2, "seq": 1, "type": "weather", "forecast": "sunny"}),
        json!({
            "v": 2, "seq": 2, "type": "tick", "ts_ms": TS + 100,
            "workers": [worker("w2", "hibernating", "static")], "keys": [], "spills": [spill],
            "totals": {"requests_per_s": 1.0, "spills_per_s": 0.5, "requests_total": 4,
                       "spills_total": 2},
            "dropped_events": 0,
        }),
        json!({
            "v": 2, "seq": 3, "type": "policy", "ts_ms": TS + 200, "changed_by": "autopilot",
            "policy": {"kind": "prefix_aware", "min_load_gap": 3, "max_load_skew": 1.5,
                       "virtual_nodes": 20},
        }),
    ]
}

#[tokio::test]
async fn unknown_names_are_read_and_shown_without_a_resync() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        for frame in frames() {
            ws.send(Message::text(frame.to_string())).await.unwrap();
        }
        while let Some(Ok(_)) = futures_util::StreamExt::next(&mut ws).await {}
    });

    let mut handle = ConnHandle::spawn(ConnConfig::new(url.clone()));
    let mut state = State::for_replicas(vec![url]);
    let deadline = tokio::time::Instant::now() + WAIT;
    while state.last_seq() != Some(3) {
        let event = tokio::time::timeout_at(deadline, handle.events.recv())
            .await
            .unwrap_or_else(|_| panic!("stuck at seq {:?}", state.last_seq()))
            .expect("network task ended");
        if let ConnEvent::BadFrame(e) = &event {
            panic!("frame refused: {e}");
        }
        assert_eq!(
            state.apply_replica_event(ReplicaId(0), event),
            None,
            "a resync was asked"
        );
    }
    assert!(!state.resyncing());
    let fleet = state.live();
    assert_eq!(fleet.workers.len(), 3);
    assert_eq!(fleet.keys.len(), 1);
    assert_eq!(fleet.ring.as_ref().map(|r| r.workers.len()), Some(3));
    assert_eq!(fleet.spills.len(), 2);
    assert_eq!(fleet.discovery.len(), 1);
    // A worker in a state the console does not know is not counted as taking requests.
    assert!(
        fleet.bound().is_none(),
        "no bound for a policy it does not know"
    );

    let screen = render(&state, 200, 50, Instant::now());
    for name in [
        "prefix_aware (unknown)",
        "autopilot",
        "?explicit_routing_key_teleport",
        "?cosmic_ray",
        "?psychic",
        "cord…",
        "hibe…",
        "consul:gpu",
        "throttled",
    ] {
        assert!(screen.contains(name), "{name} not shown:\n{screen}");
    }
    // The threshold keys say why they do nothing rather than send a change.
    assert_eq!(state.apply_action(Action::GapUp), Effect::None);
    assert!(
        state
            .notice()
            .is_some_and(|n| n.contains("kind prefix_aware")),
        "{:?}",
        state.notice()
    );

    drop(handle.commands);
    drop(handle.events);
    handle.task.await.unwrap();
    server.await.unwrap();
}

/// What the console decodes it writes back the same: a recording or a relay of a newer
/// gateway's frames loses none of its names.
#[test]
fn unknown_names_survive_a_round_trip() {
    for frame in frames() {
        let decoded: ServerFrame = serde_json::from_value(frame.clone()).unwrap();
        if frame["type"] == "weather" {
            continue; // an unknown type is skipped, not kept
        }
        let text = serde_json::to_string(&decoded).unwrap();
        let again: ServerFrame = serde_json::from_str(&text).unwrap();
        assert_eq!(again, decoded);
        for name in [
            "nearest_gpu",
            "semantic",
            "cordoned",
            "consul:gpu",
            "explicit_routing_key_teleport",
            "psychic",
            "cosmic_ray",
            "throttled",
            "hibernating",
            "autopilot",
            "prefix_aware",
        ] {
            assert_eq!(
                text.contains(name),
                frame.to_string().contains(name),
                "{name} lost: {text}"
            );
        }
    }
}
