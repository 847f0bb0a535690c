//! Everything the console knows, and the pure rules that change it: telemetry frames in, actions in,
//! commands to send out. No I/O and no clock here (the time is passed in where needed), so every
//! transition is a plain unit test.

use std::collections::{BTreeMap, VecDeque};

use bch_core::policy::{BoundCheck, FleetLoad, PolicySettings};
use bch_core::telemetry::{
    ChangeSource, ClientCommand, CommandId, KeyRecord, RingOwnership, ServerFrame, ServerMessage,
    Snapshot, SpillEvent, Tick, Totals, WorkerRecord,
};

use crate::conn::{ConnEvent, ConnStatus};
use crate::input::{Action, Mode};

/// Spill events kept for the log; older ones fall off the front.
pub const SPILL_LOG_CAP: usize = 200;
/// Rate samples kept for the sparklines (one per tick: 24 s at the default 100 ms interval), more
/// than the widest screen shows.
pub const HISTORY_CAP: usize = 240;
/// Threshold changes remembered for the status line.
pub const COMMAND_LOG_CAP: usize = 16;
/// Step of `s` / `S`.
pub const SKEW_STEP: f64 = 0.05;

/// The telemetry-derived picture of the fleet. Cloned whole when the view is paused, so the
/// panels can show a frozen copy while frames keep applying to the live one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    /// Gateway time of the last applied snapshot or tick, ms since the Unix epoch.
    pub ts_ms: u64,
    /// Policy in force, once known.
    pub policy: Option<PolicySettings>,
    /// Who made the last policy change seen on this connection.
    pub policy_changed_by: Option<ChangeSource>,
    /// Workers in configuration order.
    pub workers: Vec<WorkerRecord>,
    /// Ring ownership, once known.
    pub ring: Option<RingOwnership>,
    /// Every arc of the ring as `(start, end, index into ring.workers)`, sorted by start, so the
    /// ring strip can look up the owner of any position by binary search.
    pub arcs: Vec<(f64, f64, usize)>,
    /// Tracked routing keys by label.
    pub keys: BTreeMap<String, KeyRecord>,
    /// Recent spill events, oldest first, at most [`SPILL_LOG_CAP`].
    pub spills: VecDeque<SpillEvent>,
    /// Latest fleet-wide rates and totals.
    pub totals: Totals,
    /// Frames the gateway dropped for this connection (cumulative).
    pub dropped_events: u64,
    /// Rate history for the sparklines, oldest first.
    pub history: VecDeque<Sample>,
}

/// One point of the sparklines.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Requests per second.
    pub requests_per_s: f64,
    /// Spills per second.
    pub spills_per_s: f64,
}

/// The bound the bounded policy enforces right now: the healthy workers' load summary and the
/// thresholds in force. The numbers and the spill test are bch-core's ([`FleetLoad`],
/// [`BoundCheck`]), the same code the gateway routes with, so the OVER flag can never disagree
/// with the gateway's decision on the same loads (`docs/policy.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetBound {
    load: FleetLoad,
    policy: PolicySettings,
}

impl FleetBound {
    /// Min, mean and count of the healthy workers' in-flight requests.
    pub fn load(&self) -> FleetLoad {
        self.load
    }

    /// The check for a new explicit-key request whose preferred worker has `active` in-flight
    /// requests; [`BoundCheck::should_spill`] says whether it would spill.
    pub fn check(&self, active: u64) -> BoundCheck {
        self.load.bound_for(active, &self.policy)
    }

    /// `min + min_load_gap`, in requests: a preferred worker must be above it to spill. It does not
    /// depend on the preferred worker's load, so any load gives it.
    pub fn gap_bound(&self) -> u64 {
        self.check(self.load.min_load).gap_bound()
    }

    /// `mean × max_load_skew`, in requests: a preferred worker must be above it to spill and a
    /// target must be at or below it. Independent of the preferred worker's load, like the gap bound.
    pub fn skew_bound(&self) -> f64 {
        self.check(self.load.min_load).skew_bound()
    }
}

impl Fleet {
    /// The current bound, or `None` before the policy is known or while no worker is healthy.
    pub fn bound(&self) -> Option<FleetBound> {
        let policy = self.policy?;
        let healthy = self.workers.iter().filter(|w| w.healthy).map(|w| w.active);
        Some(FleetBound {
            load: FleetLoad::of(healthy)?,
            policy,
        })
    }

    /// Index into `ring.workers` of the worker owning ring position `x` (0.0..1.0).
    pub fn owner_at(&self, x: f64) -> Option<usize> {
        let i = self.arcs.partition_point(|&(start, _, _)| start <= x);
        let &(start, end, owner) = self.arcs.get(i.checked_sub(1)?)?;
        (start <= x && x < end).then_some(owner)
    }

    fn set_ring(&mut self, ring: RingOwnership) {
        self.arcs = ring
            .workers
            .iter()
            .enumerate()
            .flat_map(|(i, share)| share.arcs.iter().map(move |&[s, e]| (s, e, i)))
            .collect();
        self.arcs.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.ring = Some(ring);
    }

    fn apply_snapshot(&mut self, snap: Snapshot) {
        let history = std::mem::take(&mut self.history);
        *self = Fleet {
            ts_ms: snap.ts_ms,
            policy: Some(snap.policy),
            workers: snap.workers,
            keys: snap.keys.into_iter().map(|k| (k.key.clone(), k)).collect(),
            totals: snap.totals,
            history,
            ..Fleet::default()
        };
        self.set_ring(snap.ring);
        self.push_spills(snap.spills);
    }

    fn apply_tick(&mut self, tick: Tick) {
        self.ts_ms = tick.ts_ms;
        for worker in tick.workers {
            match self.workers.iter_mut().find(|w| w.name == worker.name) {
                Some(slot) => *slot = worker,
                None => self.workers.push(worker),
            }
        }
        for key in tick.keys {
            self.keys.insert(key.key.clone(), key);
        }
        for gone in &tick.removed_keys {
            self.keys.remove(gone);
        }
        self.push_spills(tick.spills);
        self.totals = tick.totals;
        self.dropped_events = tick.dropped_events;
        self.history.push_back(Sample {
            requests_per_s: tick.totals.requests_per_s,
            spills_per_s: tick.totals.spills_per_s,
        });
        while self.history.len() > HISTORY_CAP {
            self.history.pop_front();
        }
    }

    fn push_spills(&mut self, spills: Vec<SpillEvent>) {
        self.spills.extend(spills);
        while self.spills.len() > SPILL_LOG_CAP {
            self.spills.pop_front();
        }
    }
}

/// A threshold field the console can change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// `min_load_gap` from → to.
    Gap(u64, u64),
    /// `max_load_skew` from → to.
    Skew(f64, f64),
}

/// Where a sent threshold change stands.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandState {
    /// Sent; no `ack` or `error` yet.
    Pending,
    /// The gateway acknowledged it.
    Applied,
    /// The gateway refused it (its message), or it never reached the gateway.
    Failed(String),
}

/// One threshold change the operator made.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandEntry {
    /// The command id sent in `set_policy`.
    pub id: u64,
    /// What was asked for.
    pub change: Change,
    /// Its fate so far.
    pub state: CommandState,
}

/// A panel that can have focus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Panel {
    /// Worker load bars.
    Workers,
    /// Ring ownership.
    Ring,
    /// Per-key placement table.
    Keys,
    /// Spill log.
    Spills,
}

impl Panel {
    /// Focus order.
    pub const ALL: [Panel; 4] = [Panel::Workers, Panel::Ring, Panel::Keys, Panel::Spills];

    fn index(self) -> usize {
        Panel::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
}

/// The key table's sort column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortColumn {
    /// Most recently seen first (the gateway's own order).
    Recent,
    /// Label, A→Z.
    Key,
    /// Most in-flight requests first.
    Active,
    /// Most requests first.
    Requests,
    /// Most spills first.
    Spills,
}

impl SortColumn {
    /// Cycle order of `o`.
    pub const ALL: [SortColumn; 5] = [
        SortColumn::Recent,
        SortColumn::Key,
        SortColumn::Active,
        SortColumn::Requests,
        SortColumn::Spills,
    ];

    /// Short name shown in the table title.
    pub fn name(self) -> &'static str {
        match self {
            SortColumn::Recent => "recent",
            SortColumn::Key => "key",
            SortColumn::Active => "active",
            SortColumn::Requests => "requests",
            SortColumn::Spills => "spills",
        }
    }

    fn next(self) -> Self {
        let i = SortColumn::ALL.iter().position(|c| *c == self).unwrap_or(0);
        SortColumn::ALL[(i + 1) % SortColumn::ALL.len()]
    }
}

/// View-only state: focus, scrolling, sorting, filter, overlays.
#[derive(Debug, Clone, PartialEq)]
pub struct Ui {
    /// Focused panel.
    pub focus: Panel,
    /// First visible row per panel, indexed like [`Panel::ALL`].
    pub scroll: [usize; 4],
    /// Key table sort column.
    pub sort: SortColumn,
    /// Key filter (substring of the label); applied live while typing.
    pub filter: String,
    /// The `/` prompt is open.
    pub filter_editing: bool,
    /// The help overlay is open.
    pub help: bool,
    /// Content rows each panel showed at the last draw (0 before the first), so scrolling stops
    /// at the last full page.
    pub viewport: [usize; 4],
}

impl Default for Ui {
    fn default() -> Self {
        Self {
            focus: Panel::Workers,
            scroll: [0; 4],
            sort: SortColumn::Recent,
            filter: String::new(),
            filter_editing: false,
            help: false,
            viewport: [0; 4],
        }
    }
}

/// What the app loop must do after an action.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Nothing beyond a redraw.
    None,
    /// Send this command to the gateway.
    Send(ClientCommand),
    /// Leave.
    Quit,
}

/// The whole console state.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// Gateway websocket URL, for the header.
    pub url: String,
    /// Connection status.
    pub conn: ConnStatus,
    /// Live fleet picture: every frame applies here, paused or not.
    pub live: Fleet,
    /// While paused, the copy the panels show.
    pub frozen: Option<Fleet>,
    /// Seq of the last frame on this connection.
    pub last_seq: Option<u64>,
    /// A `resync` was sent after a seq gap and no snapshot has arrived since.
    pub resyncing: bool,
    /// Threshold changes, oldest first, at most [`COMMAND_LOG_CAP`].
    pub commands: VecDeque<CommandEntry>,
    /// Next command id.
    pub next_id: u64,
    /// A one-line message for the operator (a refused key, an unreadable frame, an error without
    /// id); replaced by the next one.
    pub notice: Option<String>,
    /// View-only state.
    pub ui: Ui,
}

impl State {
    /// A fresh state for a console pointed at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            conn: ConnStatus::Connecting,
            live: Fleet::default(),
            frozen: None,
            last_seq: None,
            resyncing: false,
            commands: VecDeque::new(),
            next_id: 1,
            notice: None,
            ui: Ui::default(),
        }
    }

    /// What the panels show: the frozen copy while paused, else the live fleet.
    pub fn visible(&self) -> &Fleet {
        self.frozen.as_ref().unwrap_or(&self.live)
    }

    /// Whether the view is paused.
    pub fn paused(&self) -> bool {
        self.frozen.is_some()
    }

    /// Which key bindings apply now.
    pub fn mode(&self) -> Mode {
        if self.ui.help {
            Mode::Help
        } else if self.ui.filter_editing {
            Mode::Filter
        } else {
            Mode::Normal
        }
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
                    self.fail_command(id, "not sent: not connected".to_owned());
                }
                None
            }
        }
    }

    fn set_status(&mut self, status: ConnStatus) {
        match &status {
            ConnStatus::Connected => {
                // seq restarts at 0 on every connection and the first frame is a snapshot.
                self.last_seq = None;
                self.resyncing = false;
            }
            ConnStatus::Reconnecting { .. } => {
                let ids: Vec<u64> = self.pending_ids().collect();
                for id in ids {
                    self.fail_command(id, "connection lost before the gateway answered".into());
                }
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
            ServerMessage::Ring(ring) => {
                self.live.workers = ring.workers;
                self.live.set_ring(ring.ring);
            }
            ServerMessage::Policy(update) => {
                self.live.policy = Some(update.policy);
                self.live.policy_changed_by = Some(update.changed_by);
            }
            ServerMessage::Ack(ack) => {
                self.live.policy = Some(ack.policy);
                if let Some(CommandId::Number(id)) = ack.id
                    && let Some(entry) = self.commands.iter_mut().find(|c| c.id == id)
                {
                    entry.state = CommandState::Applied;
                }
            }
            ServerMessage::Error(err) => match err.id {
                Some(CommandId::Number(id)) if self.commands.iter().any(|c| c.id == id) => {
                    self.fail_command(id, err.message);
                }
                _ => self.notice = Some(format!("gateway: {}", err.message)),
            },
        }
    }

    fn fail_command(&mut self, id: u64, message: String) {
        if let Some(entry) = self.commands.iter_mut().find(|c| c.id == id) {
            if entry.state == CommandState::Pending {
                entry.state = CommandState::Failed(message);
            }
        }
    }

    fn pending_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.commands
            .iter()
            .filter(|c| c.state == CommandState::Pending)
            .map(|c| c.id)
    }

    /// The most recent threshold change, for the status line.
    pub fn last_command(&self) -> Option<&CommandEntry> {
        self.commands.back()
    }

    /// Carries out an operator action.
    pub fn apply_action(&mut self, action: Action) -> Effect {
        match action {
            Action::Quit => return Effect::Quit,
            Action::GapDown => return self.change_gap(false),
            Action::GapUp => return self.change_gap(true),
            Action::SkewDown => return self.change_skew(-SKEW_STEP),
            Action::SkewUp => return self.change_skew(SKEW_STEP),
            Action::TogglePause => {
                self.frozen = match self.frozen {
                    Some(_) => None,
                    None => Some(self.live.clone()),
                };
            }
            Action::FocusNext | Action::FocusPrev => {
                let n = Panel::ALL.len();
                let step = if action == Action::FocusNext {
                    1
                } else {
                    n - 1
                };
                self.ui.focus = Panel::ALL[(self.ui.focus.index() + step) % n];
            }
            Action::Scroll(delta) => {
                let max = self.max_scroll(self.ui.focus);
                let slot = &mut self.ui.scroll[self.ui.focus.index()];
                *slot = slot.saturating_add_signed(delta as isize).min(max);
            }
            Action::ScrollTop => self.ui.scroll[self.ui.focus.index()] = 0,
            Action::ScrollBottom => {
                self.ui.scroll[self.ui.focus.index()] = self.max_scroll(self.ui.focus);
            }
            Action::CycleSort => self.ui.sort = self.ui.sort.next(),
            Action::StartFilter => {
                self.ui.filter_editing = true;
                self.ui.focus = Panel::Keys;
            }
            Action::FilterChar(c) => {
                self.ui.filter.push(c);
                self.ui.scroll[Panel::Keys.index()] = 0;
            }
            Action::FilterBackspace => {
                self.ui.filter.pop();
            }
            Action::FilterApply => self.ui.filter_editing = false,
            Action::FilterClear => {
                self.ui.filter_editing = false;
                self.ui.filter.clear();
            }
            Action::ToggleHelp => self.ui.help = !self.ui.help,
        }
        Effect::None
    }

    /// First visible row of `panel`'s content.
    pub fn scroll(&self, panel: Panel) -> usize {
        self.ui.scroll[panel.index()]
    }

    /// The last first-row that still fills the panel's viewport (or the last row, before the
    /// viewport is known).
    fn max_scroll(&self, panel: Panel) -> usize {
        let visible = self.ui.viewport[panel.index()].max(1);
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
        let needle = self.ui.filter.to_lowercase();
        let mut rows: Vec<&KeyRecord> = self
            .visible()
            .keys
            .values()
            .filter(|k| needle.is_empty() || k.key.to_lowercase().contains(&needle))
            .collect();
        let active = |k: &KeyRecord| k.active.values().sum::<u64>();
        // Ties break on the label so the order is stable between frames.
        match self.ui.sort {
            SortColumn::Recent => rows.sort_by_key(|k| std::cmp::Reverse(k.last_seen_ms)),
            SortColumn::Key => {}
            SortColumn::Active => rows.sort_by_key(|k| std::cmp::Reverse(active(k))),
            SortColumn::Requests => rows.sort_by_key(|k| std::cmp::Reverse(k.requests_total)),
            SortColumn::Spills => rows.sort_by_key(|k| std::cmp::Reverse(k.spills_total)),
        }
        rows
    }

    /// The gap the next `g`/`G` starts from: the newest pending change if any, so pressing `G`
    /// three times quickly asks for +3, not +1 three times.
    fn gap_base(&self, policy: &PolicySettings) -> u64 {
        self.commands
            .iter()
            .rev()
            .filter(|c| c.state == CommandState::Pending)
            .find_map(|c| match c.change {
                Change::Gap(_, to) => Some(to),
                Change::Skew(..) => None,
            })
            .unwrap_or(policy.min_load_gap)
    }

    fn skew_base(&self, policy: &PolicySettings) -> f64 {
        self.commands
            .iter()
            .rev()
            .filter(|c| c.state == CommandState::Pending)
            .find_map(|c| match c.change {
                Change::Skew(_, to) => Some(to),
                Change::Gap(..) => None,
            })
            .unwrap_or(policy.max_load_skew)
    }

    fn change_gap(&mut self, up: bool) -> Effect {
        let Some(policy) = self.live.policy else {
            self.notice = Some("no policy known yet: wait for the gateway's snapshot".into());
            return Effect::None;
        };
        let from = self.gap_base(&policy);
        let to = if up {
            from.saturating_add(1)
        } else if from == 0 {
            self.notice = Some("min_load_gap is already 0".into());
            return Effect::None;
        } else {
            from - 1
        };
        self.send_change(Change::Gap(from, to))
    }

    fn change_skew(&mut self, delta: f64) -> Effect {
        let Some(policy) = self.live.policy else {
            self.notice = Some("no policy known yet: wait for the gateway's snapshot".into());
            return Effect::None;
        };
        let from = self.skew_base(&policy);
        // Round to the step's precision so repeated presses do not drift (1.5 + 0.05 × 3 = 1.65,
        // not 1.6500000000000001). Not clamped at 1.0: the gateway validates and says why.
        let to = ((from + delta) * 100.0).round() / 100.0;
        self.send_change(Change::Skew(from, to))
    }

    fn send_change(&mut self, change: Change) -> Effect {
        let id = self.next_id;
        self.next_id += 1;
        self.commands.push_back(CommandEntry {
            id,
            change,
            state: CommandState::Pending,
        });
        while self.commands.len() > COMMAND_LOG_CAP {
            self.commands.pop_front();
        }
        self.notice = None;
        let (min_load_gap, max_load_skew) = match change {
            Change::Gap(_, to) => (Some(to), None),
            Change::Skew(_, to) => (None, Some(to)),
        };
        Effect::Send(ClientCommand::SetPolicy {
            id: Some(CommandId::Number(id)),
            kind: None,
            min_load_gap,
            max_load_skew,
        })
    }
}
