//! The websocket clients as the aggregator sees them: a bounded frame queue each, filled with
//! `try_send` only. A client whose queue is full loses frames (counted in its `dropped_events`)
//! and gets a fresh snapshot as soon as its queue has room again; the aggregator never waits.

use std::collections::HashMap;
use std::sync::Arc;

use bch_core::telemetry::{ServerMessage, Tick};
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

    /// Sends `tick` to every client in sync, with that client's own `dropped_events`. Bodies are
    /// encoded once per distinct dropped count (almost always one: 0).
    pub(super) fn send_ticks(&mut self, tick: Tick) {
        let mut by_dropped: HashMap<u64, Arc<str>> = HashMap::new();
        for client in self.clients.values_mut() {
            if client.needs_snapshot {
                client.dropped += 1;
                continue;
            }
            let message = by_dropped.entry(client.dropped).or_insert_with(|| {
                encode_message(&ServerMessage::Tick(Tick {
                    dropped_events: client.dropped,
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
