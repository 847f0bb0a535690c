//! One gateway replica the console is connected to: its URL, connection, the fleet as that
//! replica describes it, and its frame sequence. Frames apply here; the answers to commands
//! (`ack`, `error`) are handed back to the state, which owns the command log.

use bch_core::fleet_load::LoadSource;
use bch_core::policy::PolicySettings;
use bch_core::telemetry::{ClientCommand, ServerFrame, ServerMessage};
use tokio::time::{Duration, Instant};

use super::picture::FleetPicture;
use crate::conn::ConnStatus;

/// Which replica an event or a frame came from: its position in the console's `--url` list
/// (`ReplicaId(0)` is the first). The app tags each network task's events with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub usize);

impl std::fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "replica {}", self.0 + 1)
    }
}

/// One replica: where it is, how the connection stands and what it last said.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    url: String,
    conn: ConnStatus,
    fleet: FleetPicture,
    /// Seq of the last frame on this connection, to spot frames the gateway dropped.
    last_seq: Option<u64>,
    /// A `resync` was sent after a seq gap and no snapshot has arrived since.
    resyncing: bool,
    /// When the last frame arrived on this console's clock (`None` before the first, or when the
    /// app does not say: tests that only apply frames).
    last_frame_at: Option<Instant>,
    /// The last failed attempt since the last connect, `(attempt, why)`: still true while the
    /// next attempt is under way (a host that is gone spends seconds in each).
    last_failure: Option<(u32, String)>,
}

/// A silence this many tick intervals long marks the view stale.
const STALE_TICKS: u32 = 5;
/// ...but never less than this: a gateway with a 10 ms tick interval may pause that long.
const STALE_MIN: Duration = Duration::from_secs(1);

/// A command answer a frame carried, for the state's command log.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Answer {
    /// `ack` with this id.
    Ack(Option<bch_core::telemetry::CommandId>),
    /// `error` with this id and message.
    Error(Option<bch_core::telemetry::CommandId>, String),
    /// A line for the operator (a drained worker).
    Notice(String),
}

/// The settings a replica row compares: kind, both thresholds and the load source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `min_load_gap`, requests.
    pub min_load_gap: u64,
    /// `max_load_skew`, factor.
    pub max_load_skew: f64,
    /// Which load the rule reads.
    pub load_source: LoadSource,
    /// The policy kind.
    pub kind: bch_core::policy::PolicyKind,
}

impl Settings {
    fn of(policy: &PolicySettings) -> Self {
        Self {
            min_load_gap: policy.min_load_gap,
            max_load_skew: policy.max_load_skew,
            load_source: policy.load_source,
            kind: policy.kind,
        }
    }
}

impl Replica {
    /// A replica at `url`, connecting, nothing known yet.
    pub(super) fn new(url: String) -> Self {
        Self {
            url,
            conn: ConnStatus::Connecting,
            fleet: FleetPicture::default(),
            last_seq: None,
            resyncing: false,
            last_frame_at: None,
            last_failure: None,
        }
    }

    /// Records that a frame arrived at `now`.
    pub(super) fn frame_received(&mut self, now: Instant) {
        self.last_frame_at = Some(now);
    }

    /// How long ago its last frame arrived, at `now`; `None` when unknown.
    pub fn frame_age(&self, now: Instant) -> Option<Duration> {
        Some(now.saturating_duration_since(self.last_frame_at?))
    }

    /// Whether the replica stopped talking: connected, yet no frame for [`STALE_TICKS`] tick
    /// intervals (and at least [`STALE_MIN`]). A frozen gateway process keeps its socket open, so
    /// the connection alone cannot tell.
    pub fn stale(&self, now: Instant) -> bool {
        let Some(age) = self.frame_age(now) else {
            return false;
        };
        let interval = Duration::from_millis(self.fleet.tick_interval_ms.unwrap_or(100));
        self.conn == ConnStatus::Connected && age > (interval * STALE_TICKS).max(STALE_MIN)
    }

    /// The replica's websocket URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where its connection stands.
    pub fn conn(&self) -> &ConnStatus {
        &self.conn
    }

    /// The fleet as this replica last described it.
    pub fn fleet(&self) -> &FleetPicture {
        &self.fleet
    }

    /// Whether its picture belongs in the merged fleet: connected, and described by a snapshot
    /// on this connection. Between a reconnect and that snapshot the picture is still the last
    /// frame before the connection dropped, a fleet that no longer is.
    pub fn merged(&self) -> bool {
        self.conn == ConnStatus::Connected && self.last_seq.is_some()
    }

    /// The last failed attempt since the last connect, `(attempt, why)`; `None` while connected
    /// or before the first attempt failed. It stays while the next attempt is under way.
    pub fn last_failure(&self) -> Option<(u32, &str)> {
        self.last_failure
            .as_ref()
            .map(|(n, why)| (*n, why.as_str()))
    }

    /// Seq of the last frame on this connection; `None` before the first.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// Whether a `resync` was sent after a seq gap and no snapshot has arrived since.
    pub fn resyncing(&self) -> bool {
        self.resyncing
    }

    /// The settings its policy frames last reported; `None` before the first snapshot.
    pub fn settings(&self) -> Option<Settings> {
        self.fleet.policy.as_ref().map(Settings::of)
    }

    /// A new connection status; answers whether the connection was lost (pending commands to it
    /// can no longer be answered).
    pub(super) fn set_status(&mut self, status: ConnStatus) -> bool {
        let lost = matches!(status, ConnStatus::Reconnecting { .. });
        match &status {
            ConnStatus::Reconnecting {
                attempt, reason, ..
            } => self.last_failure = Some((*attempt, reason.clone())),
            ConnStatus::Connected => self.last_failure = None,
            ConnStatus::Connecting => {}
        }
        if status == ConnStatus::Connected {
            // seq restarts at 0 on every connection and the first frame is a snapshot. The
            // counters may belong to a new gateway process: a baseline from the previous one
            // would be wrong.
            self.last_seq = None;
            self.resyncing = false;
            self.fleet.forget_baseline();
            self.last_frame_at = None;
        }
        self.conn = status;
        lost
    }

    /// Applies one frame: `resync` when its seq shows frames were missed, and the command answer
    /// it carried, if any.
    pub(super) fn apply_frame(
        &mut self,
        frame: ServerFrame,
    ) -> (Option<ClientCommand>, Option<Answer>) {
        let expected = self.last_seq.map_or(0, |s| s + 1);
        self.last_seq = Some(frame.seq);
        let mut resync = None;
        if let ServerMessage::Snapshot(_) = frame.message {
            // A snapshot replaces everything, so frames missed before it do not matter.
            self.resyncing = false;
        } else if frame.seq != expected && !self.resyncing {
            self.resyncing = true;
            resync = Some(ClientCommand::Resync { id: None });
        }
        // Records are complete, so applying what did arrive is still correct for those items.
        let answer = match frame.message {
            ServerMessage::Snapshot(snap) => {
                self.fleet.apply_snapshot(snap);
                None
            }
            ServerMessage::Tick(tick) => {
                self.fleet.apply_tick(tick);
                None
            }
            ServerMessage::Ring(update) => {
                self.fleet.apply_ring(update);
                None
            }
            ServerMessage::Membership(update) => {
                // A delta that does not add up means this list is not the gateway's: start over
                // from a snapshot, as after a seq gap.
                if !self.fleet.apply_membership(update) && !self.resyncing {
                    self.resyncing = true;
                    resync = Some(ClientCommand::Resync { id: None });
                }
                None
            }
            ServerMessage::Policy(update) => {
                self.fleet.apply_policy(update);
                None
            }
            ServerMessage::Ack(ack) => {
                self.fleet.apply_acked_policy(ack.policy);
                if let Some(worker) = ack.worker {
                    self.fleet.apply_worker(worker);
                }
                Some(Answer::Ack(ack.id))
            }
            ServerMessage::Drained(mut drained) => Some(Answer::Notice({
                super::caps::cut(&mut drained.worker);
                if drained.removed {
                    format!("{} drained: idle and removed", drained.worker)
                } else {
                    format!("{} drained: no request in flight", drained.worker)
                }
            })),
            ServerMessage::Error(mut err) => {
                // The command log keeps it: a hostile server's megabyte message must not be.
                super::caps::cut(&mut err.message);
                Some(Answer::Error(err.id, err.message))
            }
            // A newer gateway's message: nothing to apply, and its seq was counted above.
            ServerMessage::Unknown => None,
        };
        (resync, answer)
    }
}

/// For each replica, whether its settings differ from the ones most replicas share (ties go to
/// the earlier replica's); replicas that reported none yet are never flagged.
pub(super) fn differing(replicas: &[Replica]) -> Vec<bool> {
    let known: Vec<Option<Settings>> = replicas.iter().map(Replica::settings).collect();
    let agreeing = |s: &Settings| known.iter().flatten().filter(|o| *o == s).count();
    let common = known
        .iter()
        .flatten()
        .fold(None::<(&Settings, usize)>, |best, s| {
            let n = agreeing(s);
            match best {
                Some((_, m)) if m >= n => best,
                _ => Some((s, n)),
            }
        })
        .map(|(s, _)| *s);
    known
        .iter()
        .map(|s| matches!((s, common), (Some(s), Some(c)) if *s != c))
        .collect()
}
