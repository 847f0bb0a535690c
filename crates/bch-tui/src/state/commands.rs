//! The changes the operator made and what became of them: the threshold step one key press asks
//! for ([`Change::step`]), drains, and the log of sent changes with their fate ([`CommandLog`]),
//! which is what the status line shows and what `ack`/`error` frames are matched against. A change
//! that gets no answer within [`COMMAND_TIMEOUT`] is unconfirmed until a late answer or a frame
//! showing it in force settles it, and a new connection starts a new log: an answer can only come
//! on the connection that carried the command.

use std::collections::VecDeque;
use std::time::Duration;

use bch_core::admission::AdmissionPatch;
use bch_core::policy::PolicySettings;
use bch_core::telemetry::{ClientCommand, CommandId, WorkerState};
use tokio::time::Instant;

use super::picture::FleetPicture;

/// How long a sent change may wait for the gateway's answer before it is shown as failed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Threshold changes remembered; the status line shows only the newest, the rest are there so a
/// late `ack` or `error` still finds its entry.
const COMMAND_LOG_CAP: usize = 16;
/// How far one press of `s` / `S` moves `max_load_skew`.
const SKEW_STEP: f64 = 0.05;

/// A threshold of the bounded policy the console can change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Threshold {
    /// `min_load_gap`, in in-flight requests.
    MinLoadGap,
    /// `max_load_skew`, a factor over the fleet mean.
    MaxLoadSkew,
    /// `max_in_flight_per_worker`, the fleet's default capacity in requests (0 = no cap).
    Capacity,
}

/// One requested change: a threshold as `(from, to)` — `from` is what the change was computed
/// from, so the status line can say `gap 2 → 3` — or a worker drained or undrained.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// `min_load_gap` from → to, in requests.
    Gap(u64, u64),
    /// `max_load_skew` from → to, as factors.
    Skew(f64, f64),
    /// `max_in_flight_per_worker` from → to, in requests (0 = no cap).
    Cap(u64, u64),
    /// Drain the named worker (no new requests; in-flight ones finish).
    Drain(String),
    /// Route new requests to the named worker again.
    Undrain(String),
}

impl Change {
    /// Which threshold this changes, if it is a threshold change.
    pub(crate) fn threshold(&self) -> Option<Threshold> {
        match self {
            Change::Gap(..) => Some(Threshold::MinLoadGap),
            Change::Skew(..) => Some(Threshold::MaxLoadSkew),
            Change::Cap(..) => Some(Threshold::Capacity),
            Change::Drain(_) | Change::Undrain(_) => None,
        }
    }

    /// The change one key press asks for: a step `up` or down from `pending` (the newest change to
    /// the same threshold still awaiting an answer) or, without one, from the policy in force. So
    /// pressing `G` three times quickly asks for +3, not for +1 three times. `Err` says why there
    /// is no change to make. `busiest` is the highest load a worker carries now: the first cap
    /// set from "no cap" is that load, so one press caps the fleet where it stands rather than at
    /// one request.
    pub(crate) fn step(
        threshold: Threshold,
        up: bool,
        pending: Option<Change>,
        policy: &PolicySettings,
        busiest: u64,
    ) -> Result<Change, &'static str> {
        match threshold {
            Threshold::Capacity => {
                let from = match pending {
                    Some(Change::Cap(_, to)) => to,
                    _ => policy.admission.max_in_flight_per_worker,
                };
                let to = match (from, up) {
                    (0, true) => busiest.max(1),
                    (_, true) => from.saturating_add(1),
                    (0, false) => return Err("max_in_flight_per_worker is already 0 (no cap)"),
                    (_, false) => from - 1,
                };
                Ok(Change::Cap(from, to))
            }
            Threshold::MinLoadGap => {
                let from = match pending {
                    Some(Change::Gap(_, to)) => to,
                    _ => policy.min_load_gap,
                };
                let to = if up {
                    from.saturating_add(1)
                } else {
                    from.checked_sub(1).ok_or("min_load_gap is already 0")?
                };
                Ok(Change::Gap(from, to))
            }
            Threshold::MaxLoadSkew => {
                let from = match pending {
                    Some(Change::Skew(_, to)) => to,
                    _ => policy.max_load_skew,
                };
                let delta = if up { SKEW_STEP } else { -SKEW_STEP };
                // Round to the step's precision so repeated presses do not drift (1.5 + 0.05 × 3 =
                // 1.65, not 1.6500000000000001). Not clamped at 1.0: the gateway validates and
                // says why.
                let to = ((from + delta) * 100.0).round() / 100.0;
                Ok(Change::Skew(from, to))
            }
        }
    }

    /// The command asking for this change under command id `id`.
    fn command(&self, id: u64) -> ClientCommand {
        let id = Some(CommandId::Number(id));
        let (min_load_gap, max_load_skew, admission) = match self {
            Change::Gap(_, to) => (Some(*to), None, None),
            Change::Skew(_, to) => (None, Some(*to), None),
            Change::Cap(_, to) => (
                None,
                None,
                Some(AdmissionPatch {
                    max_in_flight_per_worker: Some(*to),
                    ..AdmissionPatch::default()
                }),
            ),
            Change::Drain(worker) => {
                return ClientCommand::Drain {
                    id,
                    worker: worker.clone(),
                    remove: false,
                };
            }
            Change::Undrain(worker) => {
                return ClientCommand::Undrain {
                    id,
                    worker: worker.clone(),
                };
            }
        };
        ClientCommand::SetPolicy {
            id,
            kind: None,
            min_load_gap,
            max_load_skew,
            spill_order: None,
            load_source: None,
            admission,
        }
    }
}

/// Where a sent threshold change stands.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandState {
    /// Sent; no `ack` or `error` yet.
    Pending,
    /// The gateway acknowledged it and the policy now holds the new value.
    Applied,
    /// No answer within [`COMMAND_TIMEOUT`]: the gateway may still apply it (a busy gateway, a
    /// slow link), so it is not called failed; a late `ack`, `error`, or a frame showing the
    /// change in force settles it.
    Unconfirmed,
    /// The gateway refused it (its message), or it never reached the gateway (why not).
    Failed(String),
}

/// One threshold change the operator made, and its fate. With several replicas the same command
/// (same id) goes to each of them, and each answers for itself.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandEntry {
    /// The command id sent in `set_policy`, which the gateway's `ack` or `error` echoes.
    pub id: u64,
    /// The change asked for, with the value it was computed from.
    pub change: Change,
    /// Where it stands overall: pending until every replica answered, then applied if all applied,
    /// else failed with the first refusal.
    pub state: CommandState,
    /// Where it stands on each replica, in `--url` order.
    pub replies: Vec<CommandState>,
    /// When the console first saw it pending (set by [`CommandLog::expire`]); the timeout counts
    /// from here.
    since: Option<Instant>,
}

impl CommandEntry {
    /// Recomputes [`CommandEntry::state`] from the replies.
    fn settle(&mut self) {
        self.state = if self.replies.contains(&CommandState::Pending) {
            CommandState::Pending
        } else if let Some((i, CommandState::Failed(message))) = self
            .replies
            .iter()
            .enumerate()
            .find(|(_, r)| matches!(r, CommandState::Failed(_)))
        {
            if self.replies.len() > 1 {
                CommandState::Failed(format!("replica {}: {message}", i + 1))
            } else {
                CommandState::Failed(message.clone())
            }
        } else if self.replies.contains(&CommandState::Unconfirmed) {
            CommandState::Unconfirmed
        } else {
            CommandState::Applied
        };
    }

    /// Whether `fleet`, as one replica describes it, has this change in force: the threshold at
    /// the asked value, the worker draining or active again.
    fn in_force(&self, fleet: &FleetPicture) -> bool {
        let state_of = |name: &str| {
            fleet
                .workers
                .iter()
                .find(|w| w.name == name)
                .map(|w| w.state.clone())
        };
        match (&self.change, fleet.policy) {
            (Change::Gap(_, to), Some(p)) => p.min_load_gap == *to,
            (Change::Skew(_, to), Some(p)) => (p.max_load_skew - to).abs() < 1e-9,
            (Change::Cap(_, to), Some(p)) => p.admission.max_in_flight_per_worker == *to,
            (Change::Drain(name), _) => state_of(name) == Some(WorkerState::Draining.into()),
            (Change::Undrain(name), _) => state_of(name) == Some(WorkerState::Active.into()),
            _ => false,
        }
    }
}

/// The sent threshold changes, oldest first, at most [`COMMAND_LOG_CAP`], and the id the next one
/// gets. Ids start at 1 and only grow, so an answer can never be matched to the wrong change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CommandLog {
    entries: VecDeque<CommandEntry>,
    next_id: u64,
}

impl Default for CommandLog {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            next_id: 1,
        }
    }
}

impl CommandLog {
    /// Records `change` as pending on each of `replicas` and returns the command that asks every
    /// replica for it.
    pub(crate) fn send(&mut self, change: Change, replicas: usize) -> ClientCommand {
        let id = self.next_id;
        self.next_id += 1;
        let command = change.command(id);
        self.entries.push_back(CommandEntry {
            id,
            change,
            state: CommandState::Pending,
            since: None,
            replies: vec![CommandState::Pending; replicas.max(1)],
        });
        while self.entries.len() > COMMAND_LOG_CAP {
            self.entries.pop_front();
        }
        command
    }

    /// The newest change to `threshold` still waiting for an answer.
    pub(crate) fn newest_pending(&self, threshold: Threshold) -> Option<Change> {
        self.entries
            .iter()
            .rev()
            .filter(|c| c.state == CommandState::Pending)
            .map(|c| c.change.clone())
            .find(|c| c.threshold() == Some(threshold))
    }

    /// Starts the clock of every pending change not yet timed, and marks the ones that waited
    /// longer than [`COMMAND_TIMEOUT`] at `now` unconfirmed. Returns whether any was.
    pub(crate) fn expire(&mut self, now: Instant) -> bool {
        let mut expired = false;
        for entry in &mut self.entries {
            if entry.state != CommandState::Pending {
                continue;
            }
            let since = *entry.since.get_or_insert(now);
            if now.saturating_duration_since(since) >= COMMAND_TIMEOUT {
                for reply in &mut entry.replies {
                    if *reply == CommandState::Pending {
                        *reply = CommandState::Unconfirmed;
                    }
                }
                entry.settle();
                expired = true;
            }
        }
        expired
    }

    /// Forgets every entry no replica still owes an answer to: a new connection cannot answer the
    /// old one's commands, and its `✓ applied` would describe another process. A change still
    /// pending on another replica (several replicas, one of them reconnecting) stays, so its late
    /// answers find it. Ids keep growing.
    pub(crate) fn clear_settled(&mut self) {
        self.entries.retain(|c| c.state == CommandState::Pending);
    }

    /// Whether `id` is one of the changes in the log.
    pub(crate) fn knows(&self, id: u64) -> bool {
        self.entries.iter().any(|c| c.id == id)
    }

    /// Marks change `id` applied on `replica` (its `ack`).
    pub(crate) fn applied(&mut self, id: u64, replica: usize) {
        self.answer(id, replica, CommandState::Applied, true);
    }

    /// Marks change `id` failed on `replica` with `message`, unless it already has an answer there
    /// (unconfirmed is none): a late failure must not overwrite what the gateway said.
    pub(crate) fn failed(&mut self, id: u64, replica: usize, message: String) {
        self.answer(id, replica, CommandState::Failed(message), false);
    }

    fn answer(&mut self, id: u64, replica: usize, state: CommandState, overwrite: bool) {
        let Some(entry) = self.entries.iter_mut().find(|c| c.id == id) else {
            return;
        };
        if let Some(reply) = entry.replies.get_mut(replica)
            && (overwrite || matches!(reply, CommandState::Pending | CommandState::Unconfirmed))
        {
            *reply = state;
        }
        entry.settle();
    }

    /// Marks every change still pending on `replica` failed with `message`: after a lost
    /// connection no answer can come from it.
    pub(crate) fn fail_pending(&mut self, replica: usize, message: &str) {
        for entry in &mut self.entries {
            if let Some(reply) = entry.replies.get_mut(replica)
                && *reply == CommandState::Pending
            {
                *reply = CommandState::Failed(message.to_owned());
            }
            entry.settle();
        }
    }

    /// Marks applied on `replica` every change unconfirmed there that `fleet` (that replica's
    /// picture after a frame) shows in force: the gateway applied it after the console stopped
    /// waiting, and its `policy` frame or a worker's record says so.
    pub(crate) fn confirm_from(&mut self, replica: usize, fleet: &FleetPicture) {
        for entry in &mut self.entries {
            let unconfirmed = entry.replies.get(replica) == Some(&CommandState::Unconfirmed);
            if unconfirmed && entry.in_force(fleet) {
                entry.replies[replica] = CommandState::Applied;
                entry.settle();
            }
        }
    }

    /// The changes, oldest first (the status line shows the last).
    pub(crate) fn iter(
        &self,
    ) -> impl DoubleEndedIterator<Item = &CommandEntry> + ExactSizeIterator {
        self.entries.iter()
    }
}
