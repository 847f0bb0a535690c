//! What the data path and the control plane send the aggregator: routing events on a bounded
//! queue (dropped, never awaited, when it is full) and control commands.

use std::sync::Arc;

use bch_core::decide::Decision;
use bch_core::router::RoutingTable;
use bch_core::telemetry::{ChangeSource, DiscoverySource};
use tokio::sync::mpsc;

use super::keys::KeyTag;

/// A data-path event.
// `Routed` carries the key label's bytes inline (up to 128) so that the data path allocates nothing
// per request; the queue's blocks are allocated once and reused.
#[allow(clippy::large_enum_variant)]
pub(super) enum Event {
    /// A routing decision, taken at `ts_ms` (ms since the Unix epoch) on `table`.
    Routed {
        ts_ms: u64,
        table: Arc<RoutingTable>,
        decision: Decision,
        key: Option<KeyTag>,
    },
    /// The end of a tracked key's request on `worker` (an index into `table`).
    Finished {
        table: Arc<RoutingTable>,
        worker: usize,
        key_id: u64,
    },
}

/// A control-plane command.
pub(super) enum Control {
    /// A websocket client joined; its frames go into `frames`, encoded for protocol `version`.
    Register {
        id: u64,
        frames: mpsc::Sender<Arc<str>>,
        version: u32,
    },
    /// A websocket client left.
    Unregister(u64),
    /// A websocket client asked for a fresh snapshot.
    Resync(u64),
    /// The policy changed; announce it, with who changed it and their address.
    PolicyChanged(ChangeSource, Option<String>),
    /// The discovery sources' records changed (published by the admin owner).
    Discovery(Vec<DiscoverySource>),
    /// A draining worker became idle (and was removed, if that was asked).
    Drained { worker: String, removed: bool },
}
