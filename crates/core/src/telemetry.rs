//! Telemetry wire types shared by gatewayd (publisher) and bch-tui (client).
//!
//! Every frame is one JSON text message `{"v":N,"seq":N,"type":...}`. The full protocol, with an
//! example of each message, versioning rules and gap recovery, is in `docs/protocol.md`.
//!
//! Two versions are spoken: version 1 (a snapshot and a `ring` frame carry every worker's arcs)
//! to clients that do not ask for more, and version 2 to clients that connect with `?v=2`: no
//! arcs (a client rebuilds the ring from the workers' ring identities with [`RingOwnership::of_workers`]),
//! and a [`MembershipUpdate`] delta instead of the whole list on a membership change.
//!
//! Records are *complete*: a `tick` carries whole [`WorkerRecord`]s and [`KeyRecord`]s for the items
//! that changed, never deltas, so applying a frame twice is harmless and a client that missed frames
//! only needs a fresh `snapshot` (sent after `resync`).

use serde::{Deserialize, Serialize};

mod admission;
mod discovery;
mod membership;
mod open;
mod ownership;
mod worker;
pub use admission::{AdmissionSummary, ShedRates};
pub use discovery::{DiscoveryKind, DiscoverySource, DiscoveryState};
pub use membership::{MembershipUpdate, PlacedWorker};
pub use open::{Open, PolicyRecord};
pub use worker::{WorkerRecord, WorkerSource, WorkerState};

use crate::admission::AdmissionPatch;
use crate::fleet_load::{LoadSignal, LoadSource};
use crate::policy::{Branch, PolicyKind, SpillOrder};

/// The newest protocol version, carried in every frame's `v` of a client that asked for it
/// (`GET /ws?v=2`). Bumped only for incompatible changes; new optional fields do not bump it
/// (clients must ignore unknown fields).
pub const PROTOCOL_VERSION: u32 = 2;

/// The version a client gets when it does not ask for one: every consumer written before
/// version 2 existed keeps receiving exactly the frames it was written for.
pub const FIRST_PROTOCOL_VERSION: u32 = 1;

/// The version a server speaks to a client that asked for `asked` (`None`: did not ask): the
/// highest it knows up to the one asked, and never below version 1.
pub fn negotiated_version(asked: Option<u32>) -> u32 {
    asked.map_or(FIRST_PROTOCOL_VERSION, |v| {
        v.clamp(FIRST_PROTOCOL_VERSION, PROTOCOL_VERSION)
    })
}

/// One server → client frame: the envelope (`v`, `seq`) plus the message, flattened so the JSON is
/// `{"v":1,"seq":7,"type":"tick",...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerFrame {
    /// Protocol version, [`PROTOCOL_VERSION`].
    pub v: u32,
    /// Per-connection sequence number: the first frame of a connection is 0 and each next frame is
    /// one more. A client that sees a jump has missed frames and should send `resync`.
    pub seq: u64,
    /// The message itself, tagged by `type`.
    #[serde(flatten)]
    pub message: ServerMessage,
}

/// Server → client messages, tagged by `type` in snake case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// The whole state: first frame of every connection and the answer to `resync` or to a queue
    /// overflow.
    Snapshot(Snapshot),
    /// Periodic update every `[telemetry] interval_ms` (default 100 ms): what changed since the last
    /// tick.
    Tick(Tick),
    /// Membership changed (worker added, removed or replaced): new ring ownership and worker list
    /// (version 1 only).
    Ring(RingUpdate),
    /// Membership changed, as a delta: the workers that left, arrived or changed identity
    /// (version 2 only; the client rebuilds the ring itself).
    Membership(MembershipUpdate),
    /// The policy or its thresholds changed, with who changed it.
    Policy(PolicyUpdate),
    /// A client command was applied.
    Ack(Ack),
    /// A client command was rejected; nothing changed.
    Error(CommandError),
    /// A draining worker has no request in flight any more (and was removed, if that was asked).
    Drained(DrainedUpdate),
    /// A message type this build does not know (a newer gateway's), read so that its `seq` still
    /// counts: a client skips it instead of taking it for a gap. Never sent.
    #[serde(other)]
    Unknown,
}

/// Full state sent on connect and on resync.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Wall-clock time of the snapshot, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// Current policy and thresholds.
    pub policy: PolicyRecord,
    /// Every registered worker, in configuration order.
    pub workers: Vec<WorkerRecord>,
    /// Each worker's share of the hash space and its arcs: always in version 1, never in
    /// version 2 (the client computes it from `workers` and `policy.virtual_nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingOwnership>,
    /// The most recently active routing keys (at most `[telemetry] max_keys`), most recent first.
    pub keys: Vec<KeyRecord>,
    /// The most recent spill events, oldest first.
    pub spills: Vec<SpillEvent>,
    /// Fleet-wide rates and totals.
    pub totals: Totals,
    /// Every DNS discovery source in force, in configuration order; absent without discovery.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discovery: Vec<DiscoverySource>,
    /// The admission queue and shedding now; absent from gateways that predate admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSummary>,
    /// This connection is read-only (opened with the metrics token): the gateway refuses every
    /// command that would change something. Sent only when `true`; absent from gateways that
    /// predate read-only connections.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// Periodic update: complete records of what changed since the previous tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    /// Wall-clock time of the tick, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// Workers whose record changed (active load, health or a counter).
    pub workers: Vec<WorkerRecord>,
    /// Tracked keys whose record changed.
    pub keys: Vec<KeyRecord>,
    /// Labels of keys that left the tracked set (evicted as least recently active).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_keys: Vec<String>,
    /// Spill and no-eligible-candidate events since the previous tick, oldest first.
    pub spills: Vec<SpillEvent>,
    /// Fleet-wide rates and totals.
    pub totals: Totals,
    /// Frames this connection lost because its queue was full (cumulative for the connection).
    pub dropped_events: u64,
    /// Every DNS discovery source in force, when any source's record changed since the previous
    /// tick (each good refresh moves `last_good_ms`); absent otherwise. The list replaces the last
    /// one; an empty list means no source is configured any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Vec<DiscoverySource>>,
    /// The admission queue and shedding now (in every tick); absent from gateways that predate
    /// admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSummary>,
}

/// Sent when worker membership changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingUpdate {
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The full worker list after the change, in configuration order.
    pub workers: Vec<WorkerRecord>,
    /// The new ring ownership.
    pub ring: RingOwnership,
}

/// Sent when the policy or a threshold changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyUpdate {
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The policy now in force.
    pub policy: PolicyRecord,
    /// Who changed it.
    pub changed_by: Open<ChangeSource>,
    /// The peer address of the client that made the change (`ws` and `http` changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// Sent once when a draining worker's last in-flight request ended: it is idle and can be taken
/// down for maintenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainedUpdate {
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The worker's name.
    pub worker: String,
    /// Whether the gateway removed the worker from the membership (the drain asked for it).
    pub removed: bool,
}

/// Who made a policy change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeSource {
    /// A websocket client's `set_policy`.
    Ws,
    /// `PUT /admin/policy`.
    Http,
    /// `POST /admin/reload` or SIGHUP re-read the configuration file.
    Reload,
    /// A DNS discovery source's answer changed the membership. It never changes the policy, so
    /// it names membership changes in the gateway's log, not `policy` frames.
    Discovery,
    /// A drained worker was removed once idle, as its drain asked. Like `Discovery`, only in the
    /// gateway's log.
    Drain,
}

impl std::fmt::Display for ChangeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for SpillCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl KeyKind {
    /// The wire name (`explicit`, `implicit`).
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Explicit => "explicit",
            KeyKind::Implicit => "implicit",
        }
    }
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ChangeSource {
    /// Every source.
    pub const ALL: [ChangeSource; 5] = [
        ChangeSource::Ws,
        ChangeSource::Http,
        ChangeSource::Reload,
        ChangeSource::Discovery,
        ChangeSource::Drain,
    ];

    /// The snake-case name used on the wire and in the log (`ws`, `http`, `reload`, `discovery`,
    /// `drain`).
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeSource::Ws => "ws",
            ChangeSource::Http => "http",
            ChangeSource::Reload => "reload",
            ChangeSource::Discovery => "discovery",
            ChangeSource::Drain => "drain",
        }
    }
}

/// Answer to a successful client command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    /// The `id` the client sent, echoed back (absent if the client sent none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CommandId>,
    /// The policy after the command.
    pub policy: PolicyRecord,
    /// For `drain` and `undrain`: the worker's record after the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerRecord>,
}

/// Answer to a rejected client command; nothing was changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandError {
    /// The `id` the client sent, if it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<CommandId>,
    /// Human-readable reason, naming the offending field.
    pub message: String,
}

/// A client-chosen command identifier: a JSON number or string, echoed back verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CommandId {
    /// Numeric id.
    Number(u64),
    /// Text id.
    Text(String),
}

/// Client → server commands, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientCommand {
    /// Change the policy and/or thresholds; every field optional; validated exactly like
    /// `PUT /admin/policy`.
    SetPolicy {
        /// Echoed in the `ack` or `error`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<CommandId>,
        /// New policy kind.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<PolicyKind>,
        /// New `min_load_gap` (requests, integer ≥ 0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min_load_gap: Option<u64>,
        /// New `max_load_skew` (finite, ≥ 1.0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_load_skew: Option<f64>,
        /// New spill order (`ring` or `hash_seeded`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spill_order: Option<SpillOrder>,
        /// New load source: `local` or `worker_metrics`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        load_source: Option<LoadSource>,
        /// Admission changes, the `[admission]` field names:
        /// `{"admission": {"max_in_flight_per_worker": 4}}`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        admission: Option<AdmissionPatch>,
    },
    /// Stop sending new requests to a worker; its in-flight requests finish. A `drained` frame
    /// follows when the last one ended. Validated like `POST /admin/workers/{name}/drain`.
    Drain {
        /// Echoed in the `ack` or `error`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<CommandId>,
        /// The worker's name.
        worker: String,
        /// Remove the worker from the membership once it is idle.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        remove: bool,
    },
    /// Route new requests to a draining worker again (cancels a pending removal).
    Undrain {
        /// Echoed in the `ack` or `error`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<CommandId>,
        /// The worker's name.
        worker: String,
    },
    /// Ask for a fresh `snapshot` (after a `seq` gap, for example).
    Resync {
        /// Echoed in nothing; accepted for symmetry with `set_policy`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<CommandId>,
    },
}

/// Ring ownership: how the hash space divides among workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingOwnership {
    /// Virtual nodes per worker.
    pub virtual_nodes: u32,
    /// One entry per worker, in configuration order.
    pub workers: Vec<RingShare>,
}

/// One worker's part of the ring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingShare {
    /// Worker name.
    pub name: String,
    /// Fraction of the hash space the worker owns, 0.0..=1.0 (all shares sum to 1).
    pub share: f64,
    /// The arcs the worker owns as `[start, end)` fractions of the ring in 0.0..=1.0, adjacent arcs
    /// merged, sorted by start. Rounded for display; placement uses exact 64-bit positions.
    pub arcs: Vec<[f64; 2]>,
}

/// Whether a tracked key came from the explicit routing-key header or an implicit header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// `X-SMG-Routing-Key` (may spill under the bounded policy).
    Explicit,
    /// Authorization / X-Forwarded-For / Cookie (never spills; always shown hashed).
    Implicit,
}

/// Placement of one tracked routing key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Display label: explicit keys truncated to 64 characters (or `key:` + 8 hex digits when
    /// `redact_keys = true`), implicit keys always `implicit:` + 8 hex digits.
    pub key: String,
    /// Explicit or implicit.
    pub kind: Open<KeyKind>,
    /// The worker the ring prefers for this key (first healthy clockwise), by name.
    pub preferred: String,
    /// The worker that served the key's most recent request, by name.
    pub current: String,
    /// In-flight requests of this key per worker name (only non-zero entries).
    pub active: std::collections::BTreeMap<String, u64>,
    /// Requests routed for this key since it became tracked.
    pub requests_total: u64,
    /// Of those, how many spilled off the preferred worker.
    pub spills_total: u64,
    /// When the key last received a request, milliseconds since the Unix epoch.
    pub last_seen_ms: u64,
}

/// A bounded-policy decision that left the preferred worker (`explicit_routing_key_spillover`) or
/// wanted to and found no candidate (`explicit_routing_key_no_eligible_candidate`), or an explicit
/// key that left a full preferred worker (`branch: explicit_routing_key_spillover` with `cause:
/// capacity`, see [`SpillCause::of`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpillEvent {
    /// When it happened, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// Key label (same rules as [`KeyRecord::key`]).
    pub key: String,
    /// Which of the two spill branches.
    pub branch: Open<Branch>,
    /// Preferred worker name.
    pub from: String,
    /// Worker that got the request (equal to `from` when no candidate was eligible).
    pub to: String,
    /// Preferred worker's in-flight requests before this request.
    pub preferred_load: u64,
    /// Minimum in-flight requests over healthy workers.
    pub min_load: u64,
    /// Mean in-flight requests over healthy workers.
    pub mean_load: f64,
    /// `min_load_gap` in force for the decision.
    pub min_load_gap: u64,
    /// `max_load_skew` in force for the decision.
    pub max_load_skew: f64,
    /// Which signal the compared loads came from (`local`, `worker_metrics` or `mixed`).
    #[serde(default)]
    pub load_signal: Open<LoadSignal>,
    /// Why the key left (or wanted to leave) its preferred worker: the bound (absent) or the
    /// preferred worker being full (`capacity`).
    #[serde(default, skip_serializing_if = "SpillCause::is_bound_open")]
    pub cause: Open<SpillCause>,
}

/// Why a spill event happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpillCause {
    /// The bounded rule fired (the preferred worker was clearly overloaded).
    #[default]
    Bound,
    /// The preferred worker was full (at its capacity, or its engine saturated).
    Capacity,
}

impl SpillCause {
    /// Whether this is the default cause, which the wire leaves out.
    pub fn is_bound(&self) -> bool {
        *self == SpillCause::Bound
    }

    /// [`SpillCause::is_bound`] of a cause as the wire carries it.
    pub fn is_bound_open(cause: &Open<SpillCause>) -> bool {
        *cause == SpillCause::Bound
    }

    /// The wire name (`bound`, `capacity`).
    pub fn as_str(self) -> &'static str {
        match self {
            SpillCause::Bound => "bound",
            SpillCause::Capacity => "capacity",
        }
    }

    /// The `branch` and `cause` a spill event carries for a decision's `branch`. A capacity spill
    /// travels as `explicit_routing_key_spillover` with `cause: capacity`: consoles that predate
    /// capacity parse `branch` as a closed set of names, and must keep reading the spill log.
    pub fn of(branch: Branch) -> (Branch, SpillCause) {
        match branch {
            Branch::ExplicitRoutingKeyCapacitySpill => {
                (Branch::ExplicitRoutingKeySpillover, SpillCause::Capacity)
            }
            other => (other, SpillCause::Bound),
        }
    }
}

/// Fleet-wide rates and totals.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Totals {
    /// Requests routed per second, averaged over the last second (traffic is bursty).
    pub requests_per_s: f64,
    /// Spills per second, averaged over the last second.
    pub spills_per_s: f64,
    /// Requests routed since start.
    pub requests_total: u64,
    /// Spills since start.
    pub spills_total: u64,
}

impl ServerFrame {
    /// Wraps a message in version 1's envelope, what a client that asks for nothing gets.
    pub fn new(seq: u64, message: ServerMessage) -> Self {
        Self {
            v: FIRST_PROTOCOL_VERSION,
            seq,
            message,
        }
    }
}

#[cfg(test)]
mod tests;
