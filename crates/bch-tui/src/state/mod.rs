//! Everything the console knows, and the pure rules that change it: telemetry frames in, actions in,
//! commands to send out. No I/O and no clock here (the time is passed in where needed), so every
//! transition is a plain unit test.
//!
//! [`State`] owns the parts: the live and the frozen [`Fleet`] (`fleet.rs`), the threshold changes
//! and their fate (`commands.rs`) and the view-only [`Ui`] (`ui.rs`). Its fields are private: the
//! app and the tests change it only through `apply_*` and [`State::set_viewports`], and read it
//! through accessors.

mod commands;
mod fleet;
mod ui;

use bch_core::telemetry::{
    ClientCommand, CommandId, KeyRecord, ServerFrame, ServerMessage, WorkerRecord,
};
use tokio::time::{Duration, Instant};

pub use self::commands::{COMMAND_TIMEOUT, Change, CommandEntry, CommandState};
use self::commands::{CommandLog, Threshold};
pub(crate) use self::fleet::routable;
pub use self::fleet::{Baseline, Fleet, FleetBound, SPILL_LOG_CAP, Sample};
pub use self::ui::{Panel, SortColumn, Ui, WorkerOrder};
use crate::conn::{ConnEvent, ConnStatus};
use crate::input::{Action, Mode};

/// What the app loop must do after an action.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Nothing beyond a redraw.
    None,
    /// Send this command to the gateway.
    Send(ClientCommand),
    /// Restore the terminal and exit.
    Quit,
}

/// The whole console state: the connection, the live and the frozen fleet, the threshold changes,
/// the operator notice and the view-only state. A plain value with no I/O in it: the app owns one
/// and tests build their own.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    url: String,
    conn: ConnStatus,
    /// Every frame applies here, paused or not.
    live: Fleet,
    /// While paused, the copy the panels show.
    frozen: Option<Fleet>,
    /// Seq of the last frame on this connection, to spot frames the gateway dropped.
    last_seq: Option<u64>,
    /// A `resync` was sent after a seq gap and no snapshot has arrived since.
    resyncing: bool,
    commands: CommandLog,
    notice: Option<String>,
    ui: Ui,
    /// When the last frame arrived on this console's clock (`None` before the first, or when the
    /// app does not say: tests that only apply frames).
    last_frame_at: Option<Instant>,
}

/// A silence this many tick intervals long marks the view stale.
const STALE_TICKS: u32 = 5;
/// ...but never less than this: a gateway with a 10 ms tick interval may pause that long.
const STALE_MIN: Duration = Duration::from_secs(1);

impl State {
    /// A fresh state for a console pointed at `url`: connecting, nothing known yet.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            conn: ConnStatus::Connecting,
            live: Fleet::default(),
            frozen: None,
            last_seq: None,
            resyncing: false,
            commands: CommandLog::default(),
            notice: None,
            ui: Ui::default(),
            last_frame_at: None,
        }
    }

    /// Records that a frame arrived at `now` (the app calls it for every frame it applies).
    pub fn frame_received(&mut self, now: Instant) {
        self.last_frame_at = Some(now);
    }

    /// How long ago the last frame arrived, at `now`; `None` when unknown.
    pub fn frame_age(&self, now: Instant) -> Option<Duration> {
        Some(now.saturating_duration_since(self.last_frame_at?))
    }

    /// Whether the gateway stopped talking: connected, yet no frame for [`STALE_TICKS`] tick
    /// intervals (and at least [`STALE_MIN`]). A frozen gateway process keeps its socket open, so
    /// the connection alone cannot tell.
    pub fn stale(&self, now: Instant) -> bool {
        let Some(age) = self.frame_age(now) else {
            return false;
        };
        let interval = Duration::from_millis(self.live.tick_interval_ms.unwrap_or(100));
        self.conn == ConnStatus::Connected && age > (interval * STALE_TICKS).max(STALE_MIN)
    }

    /// Fails the changes that waited longer than [`COMMAND_TIMEOUT`] for an answer at `now`;
    /// `true` when one did (the screen must say so).
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
            rows.sort_by_key(|w| std::cmp::Reverse(w.active));
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

    /// The gateway websocket URL, for the header.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the connection stands, for the header and the reconnect countdown.
    pub fn conn(&self) -> &ConnStatus {
        &self.conn
    }

    /// The live fleet: every frame applies here, paused or not. The header reads it, so rates and
    /// the policy stay current while the panels are frozen.
    pub fn live(&self) -> &Fleet {
        &self.live
    }

    /// What the panels show: the frozen copy while paused, else the live fleet.
    pub fn visible(&self) -> &Fleet {
        self.frozen.as_ref().unwrap_or(&self.live)
    }

    /// Whether the view is paused (`p`): the panels show a frozen copy while frames keep applying.
    pub fn paused(&self) -> bool {
        self.frozen.is_some()
    }

    /// Seq of the last frame on this connection; `None` before the first.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// Whether a `resync` was sent after a seq gap and no snapshot has arrived since.
    pub fn resyncing(&self) -> bool {
        self.resyncing
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

    /// Applies an event from the network task; returns a command to send (a `resync`) if needed.
    pub fn apply_conn_event(&mut self, event: ConnEvent) -> Option<ClientCommand> {
        match event {
            ConnEvent::Status(status) => {
                self.set_status(status);
                None
            }
            ConnEvent::Frame(frame) => self.apply_frame(*frame),
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
                        .failed(id, "not sent: not connected".to_owned());
                }
                None
            }
        }
    }

    fn set_status(&mut self, status: ConnStatus) {
        match &status {
            ConnStatus::Connected => {
                // seq restarts at 0 on every connection and the first frame is a snapshot. The
                // previous connection's commands cannot be answered on this one, and its
                // `✓ applied` may describe another gateway process: start a fresh log.
                self.last_seq = None;
                self.resyncing = false;
                self.commands.clear();
                self.live.forget_baseline();
                self.last_frame_at = None;
            }
            ConnStatus::Reconnecting { .. } => {
                self.commands
                    .fail_pending("connection lost before the gateway answered");
            }
            ConnStatus::Connecting => {}
        }
        self.conn = status;
    }

    /// Applies one telemetry frame. Returns `resync` when the frame's seq shows frames were missed.
    pub fn apply_frame(&mut self, frame: ServerFrame) -> Option<ClientCommand> {
        let expected = self.last_seq.map_or(0, |s| s + 1);
        self.last_seq = Some(frame.seq);
        let mut reply = None;
        match frame.message {
            ServerMessage::Snapshot(snap) => {
                // A snapshot replaces everything, so frames missed before it do not matter.
                self.resyncing = false;
                self.live.apply_snapshot(snap);
            }
            message => {
                if frame.seq != expected && !self.resyncing {
                    self.resyncing = true;
                    reply = Some(ClientCommand::Resync { id: None });
                }
                // Records are complete, so applying what did arrive is still correct for those items.
                self.apply_message(message);
            }
        }
        reply
    }

    fn apply_message(&mut self, message: ServerMessage) {
        match message {
            ServerMessage::Snapshot(snap) => self.live.apply_snapshot(snap),
            ServerMessage::Tick(tick) => self.live.apply_tick(tick),
            ServerMessage::Ring(update) => self.live.apply_ring(update),
            ServerMessage::Policy(update) => self.live.apply_policy(update),
            ServerMessage::Ack(ack) => {
                self.live.apply_acked_policy(ack.policy);
                if let Some(worker) = ack.worker {
                    self.live.apply_worker(worker);
                }
                if let Some(CommandId::Number(id)) = ack.id {
                    self.commands.applied(id);
                }
            }
            ServerMessage::Drained(drained) => {
                self.notice = Some(if drained.removed {
                    format!("{} drained: idle and removed", drained.worker)
                } else {
                    format!("{} drained: no request in flight", drained.worker)
                });
            }
            ServerMessage::Error(err) => match err.id {
                Some(CommandId::Number(id)) if self.commands.knows(id) => {
                    self.commands.failed(id, err.message);
                }
                _ => self.notice = Some(format!("gateway: {}", err.message)),
            },
        }
    }

    /// Carries out an operator action; the effect tells the app what to send, or to quit.
    pub fn apply_action(&mut self, action: Action) -> Effect {
        match action {
            Action::Quit => return Effect::Quit,
            Action::GapDown => return self.nudge(Threshold::MinLoadGap, false),
            Action::GapUp => return self.nudge(Threshold::MinLoadGap, true),
            Action::SkewDown => return self.nudge(Threshold::MaxLoadSkew, false),
            Action::SkewUp => return self.nudge(Threshold::MaxLoadSkew, true),
            Action::TogglePause => {
                self.frozen = match self.frozen {
                    Some(_) => None,
                    None => Some(self.live.clone()),
                };
            }
            Action::FocusNext => self.ui.focus_step(true),
            Action::FocusPrev => self.ui.focus_step(false),
            Action::Scroll(delta) if self.ui.focus() == Panel::Workers => {
                self.move_worker_selection(delta);
            }
            Action::ScrollTop if self.ui.focus() == Panel::Workers => {
                self.move_worker_selection(i32::MIN / 2);
            }
            Action::ScrollBottom if self.ui.focus() == Panel::Workers => {
                self.move_worker_selection(i32::MAX / 2);
            }
            Action::Scroll(delta) => {
                let max = self.max_scroll(self.ui.focus());
                self.ui.scroll_by(delta, max);
            }
            Action::ScrollTop => self.ui.scroll_to(0),
            Action::ScrollBottom => self.ui.scroll_to(self.max_scroll(self.ui.focus())),
            Action::CycleSort => self.ui.cycle_sort(),
            Action::ToggleWorkerOrder => self.ui.toggle_worker_order(),
            Action::Drain | Action::Undrain => return self.drain(action == Action::Drain),
            Action::StartFilter => self.ui.start_filter(),
            Action::FilterChar(c) => self.ui.type_filter(c),
            Action::FilterBackspace => self.ui.erase_filter_char(),
            Action::FilterApply => self.ui.keep_filter(),
            Action::FilterClear => self.ui.clear_filter(),
            Action::ToggleHelp => self.ui.toggle_help(),
        }
        Effect::None
    }

    /// Moves the worker selection `delta` rows in the panel's order and scrolls so it stays on
    /// screen.
    fn move_worker_selection(&mut self, delta: i32) {
        let rows = self.worker_rows();
        if rows.is_empty() {
            return;
        }
        let current = self
            .selected_worker()
            .and_then(|w| rows.iter().position(|r| r.name == w.name))
            .unwrap_or(0);
        let next = current
            .saturating_add_signed(delta as isize)
            .min(rows.len() - 1);
        let name = rows[next].name.clone();
        self.ui.select_worker(name);
        let visible = self.ui.viewport(Panel::Workers).max(1);
        let scroll = self.ui.scroll(Panel::Workers);
        if next < scroll {
            self.ui.scroll_to(next);
        } else if next >= scroll + visible {
            self.ui.scroll_to(next + 1 - visible);
        }
    }

    /// `d` / `u`: asks the gateway to drain or undrain the selected worker.
    fn drain(&mut self, drain: bool) -> Effect {
        let Some(worker) = self.selected_worker() else {
            self.notice = Some("no worker to drain yet".into());
            return Effect::None;
        };
        let name = worker.name.clone();
        self.notice = None;
        let change = if drain {
            Change::Drain(name)
        } else {
            Change::Undrain(name)
        };
        Effect::Send(self.commands.send(change))
    }

    /// One press of a threshold key: asks the gateway for the next step of `threshold`, or says
    /// why not. Nothing changes locally until the gateway's `ack`.
    fn nudge(&mut self, threshold: Threshold, up: bool) -> Effect {
        let Some(policy) = self.live.policy else {
            self.notice = Some("no policy known yet: wait for the gateway's snapshot".into());
            return Effect::None;
        };
        if !self.live.bound_in_force() {
            self.notice = Some(format!(
                "{} never spills: the thresholds change nothing (PUT /admin/policy to switch kind)",
                policy.kind
            ));
            return Effect::None;
        }
        let pending = self.commands.newest_pending(threshold);
        match Change::step(threshold, up, pending, &policy) {
            Ok(change) => {
                self.notice = None;
                Effect::Send(self.commands.send(change))
            }
            Err(why) => {
                self.notice = Some(why.to_owned());
                Effect::None
            }
        }
    }

    /// The last first-row that still fills the panel's viewport (or the last row, before the
    /// viewport is known).
    fn max_scroll(&self, panel: Panel) -> usize {
        let visible = self.ui.viewport(panel).max(1);
        self.rows_in(panel).saturating_sub(visible)
    }

    fn rows_in(&self, panel: Panel) -> usize {
        let fleet = self.visible();
        match panel {
            Panel::Workers => fleet.workers.len(),
            Panel::Ring => fleet.ring.as_ref().map_or(0, |r| r.workers.len()),
            Panel::Keys => self.key_rows().len(),
            Panel::Spills => fleet.spills.len(),
        }
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
