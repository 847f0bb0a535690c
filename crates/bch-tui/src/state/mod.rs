//! Everything the console knows, and the pure rules that change it: telemetry frames in, actions in,
//! commands to send out. No I/O and no clock here (the time is passed in where needed), so every
//! transition is a plain unit test.
//!
//! [`State`] owns the parts: one [`Replica`] per gateway the console watches (`replica.rs`: its
//! connection, seq, last frame time and [`FleetPicture`]), the picture merged across them
//! (`merge.rs`), the frozen copy, the threshold changes and their fate (`commands.rs`) and the
//! view-only [`Ui`] (`ui.rs`); `pools.rs` sees the fleet by model (one pool's picture, the OVER
//! rule per pool) and `pool_selection.rs` keeps the shown pool's picture; `actions.rs` carries
//! out the operator's actions ([`State::apply_action`]); the history pane's [`History`]
//! (`history.rs`: every key's placements from `placements.rs`, every worker's load trail from
//! `load_trails.rs`) is fed by every frame, and `history_pane.rs` keeps the key selection and
//! opens the pane; `worker_rows.rs` gives the workers
//! panel its rows at any fleet size, the worker search and the jump to the hottest worker. Its
//! fields are private: the app and the tests change it only through `apply_*` and
//! [`State::set_viewports`], and read it through accessors. Events and frames name their replica
//! with a [`ReplicaId`]; one that the state does not watch is a bug in the caller, and panics.

mod actions;
mod caps;
mod commands;
mod history;
mod history_pane;
mod load_trails;
mod merge;
mod picture;
mod placements;
mod playback;
mod pool_selection;
mod pools;
mod replica;
mod ui;
mod warning;
mod warnings;
mod worker_rows;

use bch_core::telemetry::{
    ClientCommand, CommandId, KeyRecord, ServerFrame, ServerMessage, WorkerRecord,
};
use tokio::time::{Duration, Instant};

pub use self::caps::{
    MAX_DISCOVERY_SOURCES, MAX_KEY_WORKERS, MAX_KEYS, MAX_TEXT_BYTES, MAX_WORKER_MODELS,
    MAX_WORKERS,
};
use self::commands::CommandLog;
pub use self::commands::{COMMAND_TIMEOUT, Change, CommandEntry, CommandState};
pub use self::history::History;
pub use self::load_trails::{LoadTrails, TRAIL_LEN, TRAIL_STEP_MS};
pub use self::picture::{Baseline, FleetBound, FleetPicture, SPILL_LOG_CAP, Sample};
pub use self::placements::{
    KeyHistory, MAX_HISTORY_KEYS, MAX_PLACEMENTS, Placement, PlacementHistory, Reason,
};
pub use self::playback::Playback;
pub use self::pools::OverRule;
use self::replica::{Answer, differing};
pub use self::replica::{Replica, ReplicaId, Settings};
pub use self::ui::{HistoryOf, Panel, SortColumn, Ui, WorkerOrder};
pub use self::warning::{DRAIN_WARNING_DEFAULT, Severity, Warning};
use crate::conn::{ConnEvent, ConnStatus};
use crate::input::Mode;

/// What the app loop must do after an action.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Nothing beyond a redraw.
    None,
    /// Send this command to every replica.
    Send(ClientCommand),
    /// Restore the terminal and exit.
    Quit,
}

/// The whole console state: the replicas and their connections, the merged and the frozen fleet,
/// the threshold changes, the operator notice and the view-only state. A plain value with no I/O
/// in it: the app owns one and tests build their own.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// At least one.
    replicas: Vec<Replica>,
    /// The fleet across every replica; only kept when there are several (with one, the replica's
    /// own fleet is the picture).
    merged: FleetPicture,
    /// While paused, the copy the panels show.
    frozen: Option<FleetPicture>,
    /// With a pool picked ([`Ui::pool`]): that pool's picture of the live or frozen fleet, which
    /// the panels show.
    pool_view: Option<FleetPicture>,
    /// Every key's placements and every worker's load trail, from every frame applied.
    history: History,
    /// While paused, the copy the history pane shows.
    frozen_history: Option<History>,
    commands: CommandLog,
    notice: Option<String>,
    ui: Ui,
    /// In a replay, where it stands; `None` live.
    playback: Option<Playback>,
    /// `--read-only`: the write keys send nothing.
    read_only: bool,
    /// When this console first saw each draining worker draining (the gateway does not say);
    /// at most one entry per worker of the live picture.
    draining_since: std::collections::BTreeMap<String, Instant>,
    /// A drain longer than this is a warning.
    drain_warning: Duration,
}

impl State {
    /// A fresh state for a console watching every gateway replica in `urls` (at least one; an
    /// empty list watches none and shows nothing).
    pub fn for_replicas(urls: Vec<String>) -> Self {
        let mut replicas: Vec<Replica> = urls.into_iter().map(Replica::new).collect();
        if replicas.is_empty() {
            replicas.push(Replica::new(String::new()));
        }
        Self {
            replicas,
            merged: FleetPicture::default(),
            frozen: None,
            pool_view: None,
            history: History::default(),
            frozen_history: None,
            commands: CommandLog::default(),
            notice: None,
            ui: Ui::default(),
            playback: None,
            read_only: false,
            draining_since: std::collections::BTreeMap::new(),
            drain_warning: DRAIN_WARNING_DEFAULT,
        }
    }

    /// Makes this console watch-only (`--read-only`): the threshold, capacity and drain keys send
    /// nothing and say why.
    pub fn set_read_only(&mut self) {
        self.read_only = true;
    }

    /// How long a worker may drain before the warnings pane reports it (`--drain-warning`).
    pub fn set_drain_warning(&mut self, after: Duration) {
        self.drain_warning = after;
    }

    /// Why the write keys do nothing, if they do not: `--read-only`, or a replica whose gateway
    /// said the connection is read-only (its commands would be refused).
    pub fn read_only(&self) -> Option<&'static str> {
        if self.read_only {
            Some(
                "read-only console (--read-only): thresholds, capacity and drains are not changed from here",
            )
        } else if self.replicas.iter().any(|r| r.fleet().read_only) {
            Some(
                "read-only connection (the gateway was reached with its metrics token): it refuses thresholds, capacity and drains; use the admin token to change them",
            )
        } else {
            None
        }
    }

    /// Records that a frame of replica `replica` arrived at `now` (the app calls it for every
    /// frame it applies).
    pub fn frame_received_on(&mut self, replica: ReplicaId, now: Instant) {
        let index = self.index(replica);
        self.replicas[index].frame_received(now);
        self.track_draining(now);
    }

    /// `replica`'s position in `replicas`. Panics for a replica this state does not watch: the
    /// app only tags events with the ids it made from the `--url` list, so that is a bug, and
    /// applying the event to another replica would show that replica's data under a wrong name.
    fn index(&self, replica: ReplicaId) -> usize {
        assert!(
            replica.0 < self.replicas.len(),
            "{replica} is not watched: the console watches {} replica(s)",
            self.replicas.len()
        );
        replica.0
    }

    /// How long ago the last frame arrived, at `now`, on the replica that has been silent
    /// longest; `None` when unknown.
    pub fn frame_age(&self, now: Instant) -> Option<Duration> {
        self.replicas.iter().filter_map(|r| r.frame_age(now)).max()
    }

    /// Whether a gateway stopped talking: a replica connected, yet without a frame for several
    /// tick intervals. A frozen gateway process keeps its socket open, so the connection alone
    /// cannot tell.
    pub fn stale(&self, now: Instant) -> bool {
        self.replicas.iter().any(|r| r.stale(now))
    }

    /// Marks unconfirmed the changes that waited longer than [`COMMAND_TIMEOUT`] for an answer at
    /// `now`; `true` when one did (the screen must say so).
    pub fn expire_commands(&mut self, now: Instant) -> bool {
        self.commands.expire(now)
    }

    /// The changes still waiting for an answer.
    pub fn pending(&self) -> impl Iterator<Item = &CommandEntry> {
        self.commands
            .iter()
            .filter(|c| c.state == CommandState::Pending)
    }

    /// The workers panel's rows, in the chosen order (ties keep configuration order).
    pub fn worker_rows(&self) -> Vec<&WorkerRecord> {
        let mut rows: Vec<&WorkerRecord> = self.visible().workers.iter().collect();
        if self.ui.worker_order() == WorkerOrder::Load {
            rows.sort_by_key(|w| std::cmp::Reverse(w.rule_load()));
        }
        rows
    }

    /// The worker the drain keys act on: the picked one while it exists, else the first row.
    pub fn selected_worker(&self) -> Option<&WorkerRecord> {
        let rows = self.worker_rows();
        let picked = self.ui.selected_worker();
        rows.iter()
            .find(|w| Some(w.name.as_str()) == picked)
            .or(rows.first())
            .copied()
    }

    /// Every replica, in `--url` order.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Per replica (in `--url` order): whether its thresholds, kind or load source differ from the
    /// ones most replicas share.
    pub fn differing(&self) -> Vec<bool> {
        differing(&self.replicas)
    }

    /// The (first) gateway websocket URL, for the header.
    pub fn url(&self) -> &str {
        self.replicas[0].url()
    }

    /// Where the connection stands, for the header and the reconnect countdown: the first
    /// replica that is not connected, else connected.
    pub fn conn(&self) -> &ConnStatus {
        self.replicas
            .iter()
            .map(Replica::conn)
            .find(|c| **c != ConnStatus::Connected)
            .unwrap_or(self.replicas[0].conn())
    }

    /// Whether any replica counts down to a reconnect (the app redraws on a tick then).
    pub fn counting_down(&self) -> bool {
        self.replicas.iter().any(|r| r.conn().is_counting_down())
    }

    /// The live fleet: every frame applies here, paused or not. The header reads it, so rates and
    /// the policy stay current while the panels are frozen. With several replicas, the merge.
    pub fn live(&self) -> &FleetPicture {
        match self.replicas.as_slice() {
            [one] => one.fleet(),
            _ => &self.merged,
        }
    }

    /// What the panels show: the picked pool's picture, else the whole fleet ([`State::whole`]).
    pub fn visible(&self) -> &FleetPicture {
        self.pool_view.as_ref().unwrap_or_else(|| self.whole())
    }

    /// The whole fleet, whatever pool is picked: the frozen copy while paused, else the live
    /// fleet. The warnings read it, so a pool's view hides nothing that is wrong elsewhere.
    pub fn whole(&self) -> &FleetPicture {
        self.frozen.as_ref().unwrap_or_else(|| self.live())
    }

    /// Whether the view is paused (`p`): the panels show a frozen copy while frames keep applying.
    pub fn paused(&self) -> bool {
        self.frozen.is_some()
    }

    /// Seq of the last frame on the first replica's connection; `None` before the first.
    pub fn last_seq(&self) -> Option<u64> {
        self.replicas[0].last_seq()
    }

    /// Whether a `resync` was sent after a seq gap and no snapshot has arrived since, on any
    /// replica.
    pub fn resyncing(&self) -> bool {
        self.replicas.iter().any(Replica::resyncing)
    }

    /// A one-line message for the operator (a refused key, an unreadable frame, an error without
    /// id); replaced by the next one, cleared by the next threshold change.
    pub fn notice(&self) -> Option<&str> {
        self.notice.as_deref()
    }

    /// The threshold changes sent, oldest first; the oldest fall off past `COMMAND_LOG_CAP`, so a
    /// long session stays bounded.
    pub fn commands(&self) -> impl DoubleEndedIterator<Item = &CommandEntry> + ExactSizeIterator {
        self.commands.iter()
    }

    /// The most recent threshold change, for the status line.
    pub fn last_command(&self) -> Option<&CommandEntry> {
        self.commands.iter().next_back()
    }

    /// In a replay, where it stands (the header says REPLAY and draws the timeline); `None` live.
    pub fn playback(&self) -> Option<&Playback> {
        self.playback.as_ref()
    }

    /// Tells the state where the replay stands (the replay driver, before each draw).
    pub fn set_playback(&mut self, playback: Option<Playback>) {
        self.playback = playback;
    }

    /// Shows `notice` on the message line (a key a replay refuses, a recording that stopped).
    pub fn set_notice(&mut self, notice: String) {
        self.notice = Some(notice);
    }

    /// Takes `other`'s view-only state (focus, scrolling, filter, selection): a replay that seeks
    /// back rebuilds the fleet from an earlier state but keeps where the operator was looking.
    pub fn keep_view_of(&mut self, other: &State) {
        self.ui = other.ui.clone();
        self.refresh_pool_view();
    }

    /// View-only state: focus, scrolling, sort, filter, help.
    pub fn ui(&self) -> &Ui {
        &self.ui
    }

    /// Which key bindings apply now.
    pub(crate) fn mode(&self) -> Mode {
        self.ui.mode()
    }

    /// First visible row of `panel`'s content.
    pub fn scroll(&self, panel: Panel) -> usize {
        self.ui.scroll(panel)
    }

    /// Records how many content rows each panel shows (indexed like [`Panel::ALL`]), so scrolling
    /// stops at the last full page rather than at the last row. The app calls it before each draw
    /// with what the view's layout gives for the terminal's size.
    pub fn set_viewports(&mut self, rows: [usize; 4]) {
        self.ui.set_viewports(rows);
    }

    /// Applies an event from replica `replica`'s network task; returns a command to send to that
    /// replica (a `resync`) if needed.
    pub fn apply_replica_event(
        &mut self,
        replica: ReplicaId,
        event: ConnEvent,
    ) -> Option<ClientCommand> {
        let index = self.index(replica);
        match event {
            ConnEvent::Status(status) => {
                if status == ConnStatus::Connected {
                    // The previous connection's commands cannot be answered on this one, and its
                    // `✓ applied` may describe another gateway process: start a fresh log. With
                    // several replicas, a change still waiting on another replica stays: its
                    // answers are still to come there.
                    self.commands.clear_settled();
                }
                if self.replicas[index].set_status(status) {
                    self.commands
                        .fail_pending(index, "connection lost before the gateway answered");
                }
                // A replica that went away takes its loads and rates out of the merge now, not
                // at its next frame (which never comes while it is down).
                self.remerge();
                self.refresh_live_pool_view();
                None
            }
            ConnEvent::Frame(frame) => self.apply_replica_frame(replica, *frame),
            ConnEvent::BadFrame(err) => {
                self.notice = Some(format!("unreadable frame ignored: {err}"));
                None
            }
            ConnEvent::NotSent(cmd) => {
                if let ClientCommand::SetPolicy {
                    id: Some(CommandId::Number(id)),
                    ..
                } = cmd
                {
                    self.commands
                        .failed(id, index, "not sent: not connected".to_owned());
                }
                None
            }
        }
    }

    /// Applies one telemetry frame of replica `replica`. Returns `resync` when the frame's seq
    /// shows frames were missed.
    pub fn apply_replica_frame(
        &mut self,
        replica: ReplicaId,
        frame: ServerFrame,
    ) -> Option<ClientCommand> {
        let index = self.index(replica);
        self.history
            .observe(&frame, live_workers(&self.replicas, &self.merged));
        let snapshot_ts_ms = match &frame.message {
            ServerMessage::Snapshot(snap) => Some(snap.ts_ms),
            _ => None,
        };
        let (resync, answer) = self.replicas[index].apply_frame(frame);
        match answer {
            Some(Answer::Ack(Some(CommandId::Number(id)))) => self.commands.applied(id, index),
            Some(Answer::Error(Some(CommandId::Number(id)), message))
                if self.commands.knows(id) =>
            {
                self.commands.failed(id, index, message);
            }
            Some(Answer::Error(_, message)) => {
                self.notice = Some(format!("gateway: {message}"));
            }
            Some(Answer::Notice(message)) => self.notice = Some(message),
            Some(Answer::Ack(_)) | None => {}
        }
        self.commands
            .confirm_from(index, self.replicas[index].fleet());
        self.remerge();
        self.refresh_live_pool_view();
        self.history
            .settled(snapshot_ts_ms, live_workers(&self.replicas, &self.merged));
        resync
    }

    /// Recomputes the merged fleet (several replicas only) from the replicas that are connected
    /// and sent a snapshot on this connection ([`Replica::merged`]): a replica that is down describes the fleet as it was when it went away, and its in-flight
    /// counts, OVER workers and rates would otherwise stay in the merge as phantoms while the live
    /// replicas report the present. With none connected, the merge keeps every replica's last
    /// data, as one gateway's console does while it reconnects (the header says so).
    fn remerge(&mut self) {
        if self.replicas.len() < 2 {
            return;
        }
        let connected: Vec<&FleetPicture> = self
            .replicas
            .iter()
            .filter(|r| r.merged())
            .map(Replica::fleet)
            .collect();
        self.merged = if connected.is_empty() {
            let all: Vec<&FleetPicture> = self.replicas.iter().map(Replica::fleet).collect();
            merge::merge(&all)
        } else {
            merge::merge(&connected)
        };
    }

    /// The key table's rows: filtered by the filter text, in the chosen sort order.
    pub fn key_rows(&self) -> Vec<&KeyRecord> {
        let needle = self.ui.filter().to_lowercase();
        let mut rows: Vec<&KeyRecord> = self
            .visible()
            .keys
            .values()
            .filter(|k| needle.is_empty() || k.key.to_lowercase().contains(&needle))
            .collect();
        let active = |k: &KeyRecord| k.active.values().sum::<u64>();
        // Ties break on the label so the order is stable between frames.
        match self.ui.sort() {
            SortColumn::Recent => rows.sort_by_key(|k| std::cmp::Reverse(k.last_seen_ms)),
            SortColumn::Key => {}
            SortColumn::Active => rows.sort_by_key(|k| std::cmp::Reverse(active(k))),
            SortColumn::Requests => rows.sort_by_key(|k| std::cmp::Reverse(k.requests_total)),
            SortColumn::Spills => rows.sort_by_key(|k| std::cmp::Reverse(k.spills_total)),
        }
        rows
    }
}

/// The live fleet's workers ([`State::live`]) from the two fields it reads, so the history can
/// be fed while borrowed apart from them.
fn live_workers<'a>(replicas: &'a [Replica], merged: &'a FleetPicture) -> &'a [WorkerRecord] {
    match replicas {
        [one] => &one.fleet().workers,
        _ => &merged.workers,
    }
}
