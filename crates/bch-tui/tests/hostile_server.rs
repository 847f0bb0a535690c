//! A hostile telemetry server on 127.0.0.1:0 that never stops sending new keys, new workers,
//! spills and discovery sources with long strings: the console's state stays bounded (every
//! per-item collection at its cap, every kept string cut) and keeps following the frames.

use std::time::Duration;

use bch_tui::{
    ConnConfig, ConnEvent, ConnHandle, MAX_KEYS, MAX_TEXT_BYTES, MAX_WORKERS, ReplicaId,
    SPILL_LOG_CAP, State,
};
use futures_util::SinkExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// Generous: only reached when something is broken.
const WAIT: Duration = Duration::from_secs(60);
/// Ticks the server sends; each brings new keys and new workers, far past the caps in total.
const TICKS: u64 = 60;
const KEYS_PER_TICK: u64 = 100;
const WORKERS_PER_TICK: u64 = 400;

/// A string of `len` bytes that no two calls share.
fn long(tag: &str, n: u64, len: usize) -> String {
    let head = format!("{tag}-{n}-");
    format!("{head}{}", "x".repeat(len.saturating_sub(head.len())))
}

fn worker(n: u64) -> Value {
    json!({
        "name": long("w", n, 1_000), "url": long("http://w", n, 500), "healthy": false,
        "active": 1, "requests_total": 1, "spilled_in_total": 0, "spilled_out_total": 0,
        "errors_total": 0, "probe_failure": long("refused", n, 600),
    })
}

/// Key `n`; every 100th is in flight on more workers than the console lists.
fn key(n: u64, ts_ms: u64) -> Value {
    let on = if n.is_multiple_of(100) { 100 } else { 1 };
    let active: serde_json::Map<String, Value> = (0..on)
        .map(|w| (long("w", n * 1_000 + w, 300), json!(1)))
        .collect();
    json!({
        "key": long("key", n, 1_500), "kind": "explicit", "preferred": long("w", n, 900),
        "current": long("w", n, 900), "active": active, "requests_total": 1, "spills_total": 0,
        "last_seen_ms": ts_ms,
    })
}

fn tick(seq: u64) -> Value {
    let ts_ms = 1_767_268_800_000 + seq * 100;
    let keys: Vec<Value> = (0..KEYS_PER_TICK)
        .map(|i| key(seq * KEYS_PER_TICK + i, ts_ms))
        .collect();
    let workers: Vec<Value> = (0..WORKERS_PER_TICK)
        .map(|i| worker(seq * WORKERS_PER_TICK + i))
        .collect();
    // Spills and discovery sources past their caps, in the first tick only: the sizes of one
    // frame are what they bound.
    let many = if seq == 1 { 1 } else { 0 };
    let spills: Vec<Value> = (0..300 * many)
        .map(|i| {
            json!({
                "ts_ms": ts_ms, "key": long("key", seq * 300 + i, 1_000), "branch":
                "explicit_routing_key_spillover", "from": long("w", i, 600), "to": "w1",
                "preferred_load": 9, "min_load": 1, "mean_load": 2.0, "min_load_gap": 2,
                "max_load_skew": 1.5,
            })
        })
        .collect();
    let discovery: Vec<Value> = (0..1_100 * many)
        .map(|i| {
            json!({
                "name": long("_x._tcp", i, 600), "source": long("dns:_x._tcp", i, 600),
                "kind": "srv", "state": "failing", "last_error": long("timeout", i, 1_000),
                "workers": 0,
            })
        })
        .collect();
    json!({
        "v": 1, "seq": seq, "type": "tick", "ts_ms": ts_ms, "workers": workers, "keys": keys,
        "spills": spills, "discovery": discovery, "dropped_events": 0,
        "totals": {"requests_per_s": 1.0, "spills_per_s": 1.0, "requests_total": seq,
                   "spills_total": seq},
    })
}

fn snapshot() -> Value {
    json!({
        "v": 1, "seq": 0, "type": "snapshot", "ts_ms": 1_767_268_800_000_u64,
        "policy": {"kind": "bounded_consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.5,
                   "virtual_nodes": 150},
        "workers": [], "ring": {"virtual_nodes": 150, "workers": []}, "keys": [], "spills": [],
        "totals": {"requests_per_s": 0.0, "spills_per_s": 0.0, "requests_total": 0,
                   "spills_total": 0},
    })
}

#[tokio::test]
async fn endless_new_items_leave_the_state_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        ws.send(Message::text(snapshot().to_string()))
            .await
            .unwrap();
        for seq in 1..=TICKS {
            ws.send(Message::text(tick(seq).to_string())).await.unwrap();
        }
        // Held open until the console has read everything and hung up.
        while let Some(Ok(_)) = futures_util::StreamExt::next(&mut ws).await {}
    });

    let mut handle = ConnHandle::spawn(ConnConfig::new(url.clone()));
    let mut state = State::for_replicas(vec![url]);
    let deadline = tokio::time::Instant::now() + WAIT;
    while state.last_seq() != Some(TICKS) {
        let event = tokio::time::timeout_at(deadline, handle.events.recv())
            .await
            .unwrap_or_else(|_| panic!("stuck at seq {:?}", state.last_seq()))
            .expect("network task ended");
        if let ConnEvent::BadFrame(e) = &event {
            panic!("frame not read: {e}");
        }
        assert_eq!(state.apply_replica_event(ReplicaId(0), event), None);
        let fleet = state.live();
        assert!(fleet.keys.len() <= MAX_KEYS, "{} keys", fleet.keys.len());
        assert!(
            fleet.workers.len() <= MAX_WORKERS,
            "{} workers",
            fleet.workers.len()
        );
    }
    assert!(!state.resyncing());

    let fleet = state.live();
    assert_eq!(fleet.keys.len(), MAX_KEYS);
    assert_eq!(fleet.workers.len(), MAX_WORKERS);
    assert_eq!(fleet.spills.len(), SPILL_LOG_CAP);
    assert!(fleet.discovery.len() <= bch_tui::MAX_DISCOVERY_SOURCES);
    // The newest keys are the ones kept, as the gateway keeps the most recently active.
    let newest = long("key", TICKS * KEYS_PER_TICK - 1, 1_500);
    assert!(
        fleet.keys.keys().any(|k| newest.starts_with(k.as_str())),
        "the newest key was evicted"
    );
    let mut texts: Vec<&str> = Vec::new();
    for w in &fleet.workers {
        texts.extend([w.name.as_str(), w.url.as_str()]);
        texts.extend(w.probe_failure.as_deref());
    }
    for k in fleet.keys.values() {
        texts.extend([k.key.as_str(), k.preferred.as_str(), k.current.as_str()]);
        assert!(
            k.active.len() <= bch_tui::MAX_KEY_WORKERS,
            "{}",
            k.active.len()
        );
        texts.extend(k.active.keys().map(String::as_str));
    }
    for s in &fleet.spills {
        texts.extend([s.key.as_str(), s.from.as_str(), s.to.as_str()]);
    }
    for d in &fleet.discovery {
        texts.extend([d.name.as_str(), d.source.as_str()]);
        texts.extend(d.last_error.as_deref());
    }
    let longest = texts.iter().map(|t| t.len()).max().unwrap();
    assert!(
        longest <= MAX_TEXT_BYTES,
        "a kept string has {longest} bytes"
    );

    drop(handle.commands);
    drop(handle.events);
    handle.task.await.unwrap();
    server.await.unwrap();
}
