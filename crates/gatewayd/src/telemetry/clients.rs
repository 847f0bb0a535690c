//! The websocket clients as the aggregator sees them: a bounded frame queue each, filled with
//! `try_send` only. A client whose queue is full loses frames (counted in its `dropped_events`)
//! and gets a fresh snapshot as soon as its queue has room again; the aggregator never waits.

use std::collections::HashMap;
use std::sync::Arc;

use bch_core::telemetry::{FIRST_PROTOCOL_VERSION, ServerMessage, Tick};
use tokio::sync::mpsc;

use super::wire::encode_message;

struct Client {
    frames: mpsc::Sender<Arc<str>>,
    /// The protocol version the client speaks (docs/protocol.md, "Versioning").
    version: u32,
    dropped: u64,
    needs_snapshot: bool,
}

/// A message encoded at most once per protocol version, on first use: a frame only version 1
/// clients need (the ring's arcs) is never built while none is connected.
struct PerVersion<F> {
    encode: F,
    encoded: HashMap<u32, Arc<str>>,
}

impl<F: FnMut(u32) -> Arc<str>> PerVersion<F> {
    fn new(encode: F) -> Self {
        Self {
            encode,
            encoded: HashMap::new(),
        }
    }

    fn get(&mut self, version: u32) -> Arc<str> {
        let encode = &mut self.encode;
        Arc::clone(
            self.encoded
                .entry(version)
                .or_insert_with(|| encode(version)),
        )
    }
}

/// Every registered client.
#[derive(Default)]
pub(super) struct Clients {
    clients: HashMap<u64, Client>,
}

impl Clients {
    /// Whether nobody is listening.
    pub(super) fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Adds a client speaking protocol `version`; it needs a snapshot first.
    pub(super) fn add(&mut self, id: u64, frames: mpsc::Sender<Arc<str>>, version: u32) {
        self.clients.insert(
            id,
            Client {
                frames,
                version,
                dropped: 0,
                needs_snapshot: true,
            },
        );
    }

    /// Removes a client.
    pub(super) fn remove(&mut self, id: u64) {
        self.clients.remove(&id);
    }

    /// Marks a client for a fresh snapshot.
    pub(super) fn resync(&mut self, id: u64) {
        if let Some(client) = self.clients.get_mut(&id) {
            client.needs_snapshot = true;
        }
    }

    /// Whether some client waits for a snapshot.
    pub(super) fn snapshot_needed(&self) -> bool {
        self.clients.values().any(|c| c.needs_snapshot)
    }

    /// Sends a snapshot to every client that needs one and has room for it; `snapshot` encodes
    /// it for a protocol version, once per version in use.
    pub(super) fn deliver_snapshots(&mut self, snapshot: impl FnMut(u32) -> Arc<str>) {
        let mut snapshot = PerVersion::new(snapshot);
        for client in self.clients.values_mut() {
            if client.needs_snapshot
                && !client.frames.is_closed()
                && client.frames.capacity() > 0
                && client.frames.try_send(snapshot.get(client.version)).is_ok()
            {
                client.needs_snapshot = false;
            }
        }
        self.forget_closed();
    }

    /// Like [`Clients::broadcast`], with the message encoded for each client's protocol version
    /// (once per version in use).
    pub(super) fn broadcast_by_version(&mut self, message: impl FnMut(u32) -> Arc<str>) {
        let mut message = PerVersion::new(message);
        for client in self.clients.values_mut() {
            if client.needs_snapshot {
                client.dropped += 1;
                continue;
            }
            let message = message.get(client.version);
            client.offer(&message);
        }
        self.forget_closed();
    }

    /// Sends a frame to every client in sync; a client whose queue is full loses it and is marked
    /// for a fresh snapshot.
    pub(super) fn broadcast(&mut self, message: &Arc<str>) {
        for client in self.clients.values_mut() {
            if client.needs_snapshot {
                client.dropped += 1;
                continue;
            }
            client.offer(message);
        }
        self.forget_closed();
    }

    /// Sends `tick` to every client in sync, with that client's own `dropped_events`; version 2
    /// clients get it without the workers at `aged_only` (indices into `tick.workers`: records
    /// that changed only in their scrape age). Bodies are encoded once per version and distinct
    /// dropped count (almost always one or two: 0).
    pub(super) fn send_ticks(&mut self, aged_only: &[usize], tick: Tick) {
        let mut encoded: HashMap<(u32, u64), Arc<str>> = HashMap::new();
        for client in self.clients.values_mut() {
            if client.needs_snapshot {
                client.dropped += 1;
                continue;
            }
            let message = encoded
                .entry((client.version, client.dropped))
                .or_insert_with(|| {
                    let workers = if client.version == FIRST_PROTOCOL_VERSION {
                        tick.workers.clone()
                    } else {
                        tick.workers
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| aged_only.binary_search(i).is_err())
                            .map(|(_, w)| w.clone())
                            .collect()
                    };
                    encode_message(&ServerMessage::Tick(Tick {
                        dropped_events: client.dropped,
                        workers,
                        ..tick.clone()
                    }))
                });
            client.offer(message);
        }
        self.forget_closed();
    }

    fn forget_closed(&mut self) {
        self.clients.retain(|_, c| !c.frames.is_closed());
    }
}

impl Client {
    fn offer(&mut self, message: &Arc<str>) {
        if self.frames.try_send(Arc::clone(message)).is_err() {
            self.dropped += 1;
            self.needs_snapshot = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use bch_core::telemetry::{PROTOCOL_VERSION, WorkerRecord};

    use super::*;

    fn record(name: &str) -> WorkerRecord {
        serde_json::from_value(serde_json::json!({
            "name": name, "url": format!("http://{name}:1"), "healthy": true, "active": 0,
            "requests_total": 0, "spilled_in_total": 0, "spilled_out_total": 0,
            "errors_total": 0, "scrape_age_ms": 40
        }))
        .unwrap()
    }

    /// A record whose only change is its scrape age goes to version 1 clients (whose ticks always
    /// carried it) and not to version 2 ones; every other record goes to both.
    #[test]
    fn version_2_ticks_leave_out_records_that_only_aged() {
        let mut clients = Clients::default();
        let (v1_tx, mut v1) = mpsc::channel(4);
        let (v2_tx, mut v2) = mpsc::channel(4);
        clients.add(1, v1_tx, FIRST_PROTOCOL_VERSION);
        clients.add(2, v2_tx, PROTOCOL_VERSION);
        clients.deliver_snapshots(|version| format!("{{\"snapshot\":{version}}}").into());
        assert_eq!(&*v1.try_recv().unwrap(), "{\"snapshot\":1}");
        assert_eq!(&*v2.try_recv().unwrap(), "{\"snapshot\":2}");
        let tick = Tick {
            ts_ms: 1,
            workers: vec![record("aged"), record("moved")],
            keys: Vec::new(),
            removed_keys: Vec::new(),
            spills: Vec::new(),
            totals: Default::default(),
            dropped_events: 0,
            discovery: None,
            admission: None,
        };
        clients.send_ticks(&[0], tick);
        let names = |body: Arc<str>| -> Vec<String> {
            let ServerMessage::Tick(tick) = serde_json::from_str(&body).unwrap() else {
                panic!("a tick");
            };
            tick.workers.into_iter().map(|w| w.name).collect()
        };
        assert_eq!(names(v1.try_recv().unwrap()), ["aged", "moved"]);
        assert_eq!(names(v2.try_recv().unwrap()), ["moved"]);
    }
}
