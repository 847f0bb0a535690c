//! The snapshot matrix: every panel and state of the console, at 80×24, 120×40 and 200×50, live
//! and in a replay, from one scripted drill of two replicas (a storm that spills, an unhealthy
//! worker and a failing discovery source, a full worker and a shedding gateway, a refused
//! command, a replica lost and back, a seq gap and its resync).
//!
//! Each row of [`CASES`] is one cell of the matrix: the moment of the drill, the operator's
//! actions, and which consoles it applies to. The live console applies the drill's events as
//! the app does (the receive time, then the event) and then the actions; the replay is the
//! drill written as a recording file and played by `run_replay` on a test terminal, with the
//! replay's own keys (→ ten seconds on, `]` the next spill, space) to reach the moment and the
//! actions' keys after them. A new panel or state is one more row. Each snapshot file holds the
//! three sizes of one case and one console, so a change shows as one file's diff. The replay's
//! screens live only here (`replay.rs` tests its engine and keys).
//!
//! Left to other files, since they pin something this drill does not carry: a fleet of 64 or
//! 10,000 workers and the fleet summary (`screens`, `scale`), three replicas and their merge
//! (`replicas`, `screen_sizes`), the cutting of IP:PORT names and tenant keys at each width
//! (`screen_sizes`), a change unconfirmed past its timeout and threshold answers (`screens`,
//! `screen_sizes`), the warnings pane's every source (`warnings`) and the overload marks with
//! capacity spills (`overload`). Time is passed in, so every run draws the same screens.

mod common;

use bch_core::recording::{RecordedEvent, RecordedKind, RecordingHeader};
use bch_core::telemetry::{AdmissionSummary, ServerFrame, ServerMessage, ShedRates};
use bch_tui::{Action, ConnEvent, ConnStatus, Replay, ReplicaId, State, run_replay, screen_text};
use common::{buffer_text, failing_dns, realistic_frame, refusal};
use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tokio::time::{Duration, Instant};

/// The sizes every case is drawn at.
const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (200, 50)];
/// The two gateways the drill watches.
const URLS: [&str; 2] = ["ws://10.96.0.21:9090/ws", "ws://10.96.0.22:9090/ws"];
/// The drill's first receive time, 2026-01-01 12:00:00 UTC.
const START_MS: u64 = 1_767_268_800_000;
/// Recorded time between two moments of the drill: one → of the replay.
const STEP_MS: u64 = 10_000;

/// The drill's moments, ten seconds apart: what has just happened at each.
mod moment {
    /// Both replicas connected and sent their snapshot.
    pub const CONNECTED: u64 = 0;
    /// A storm on one key: its home worker is full and requests spill.
    pub const SPILLING: u64 = 1;
    /// A worker fails its health probes and the DNS discovery source fails.
    pub const UNHEALTHY: u64 = 2;
    /// Workers capped and one full; the gateway queues and sheds.
    pub const OVERLOADED: u64 = 3;
    /// The first replica refused a command (an error moment).
    pub const REFUSED: u64 = 4;
    /// The second replica's connection was lost.
    pub const REPLICA_DOWN: u64 = 5;
    /// The first replica's frames skipped a seq: a resync is pending.
    pub const RESYNCING: u64 = 6;
    /// Both replicas back, each on a fresh snapshot: the recording's end.
    pub const RECOVERED: u64 = 7;
}

/// Which consoles a case is drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consoles {
    Both,
    LiveOnly,
    ReplayOnly,
}

/// One cell of the matrix (at every size).
struct Case {
    /// The snapshot's name (`_live` or `_replay` is added).
    name: &'static str,
    /// The moment of the drill; `None` is before the first event (live only: a replay starts at
    /// its first event).
    at: Option<u64>,
    /// What the operator does there, in order (a replay presses the same keys).
    actions: &'static [Action],
    /// Replay only: the replay's own keys, pressed instead of seeking to `at`.
    replay_keys: &'static [KeyCode],
    /// The live console runs with `--read-only`.
    read_only: bool,
    consoles: Consoles,
}

impl Case {
    const fn at(name: &'static str, at: u64, actions: &'static [Action]) -> Self {
        Self {
            name,
            at: Some(at),
            actions,
            replay_keys: &[],
            read_only: false,
            consoles: Consoles::Both,
        }
    }

    const fn only(self, consoles: Consoles) -> Self {
        Self { consoles, ..self }
    }
}

use Action::*;
use moment::*;

/// Every panel and state, one row each.
const CASES: &[Case] = &[
    // The states of the connections and the stream.
    Case {
        at: None,
        ..Case::at("connecting", 0, &[])
    }
    .only(Consoles::LiveOnly),
    Case::at("connected", CONNECTED, &[]),
    Case::at("spilling", SPILLING, &[]),
    Case::at("unhealthy_warning_summed_up", UNHEALTHY, &[]),
    Case::at("overloaded", OVERLOADED, &[]),
    Case::at("command_refused", REFUSED, &[]),
    Case::at("one_replica_reconnecting", REPLICA_DOWN, &[]),
    Case::at("resyncing", RESYNCING, &[]),
    Case::at("recovered_at_the_end", RECOVERED, &[]),
    // The panels' toggles and prompts.
    Case::at("warnings_pane_open", UNHEALTHY, &[ToggleWarnings]),
    Case::at("help_open", SPILLING, &[ToggleHelp]),
    Case::at(
        "filter_typing",
        SPILLING,
        &[StartFilter, FilterChar('a'), FilterChar('c')],
    ),
    Case::at(
        "filter_applied_sorted_by_spills",
        SPILLING,
        &[
            StartFilter,
            FilterChar('a'),
            FilterChar('c'),
            FilterChar('m'),
            FilterChar('e'),
            FilterApply,
            CycleSort,
            CycleSort,
            CycleSort,
            CycleSort,
        ],
    ),
    Case::at(
        "worker_search",
        SPILLING,
        &[StartSearch, SearchChar('3'), SearchChar('.')],
    ),
    Case::at(
        "workers_by_load_hottest_selected",
        OVERLOADED,
        &[ToggleWorkerOrder, JumpHottest],
    ),
    Case::at("spill_log_focused", SPILLING, &[FocusPrev, ScrollBottom]),
    Case::at("frozen", SPILLING, &[TogglePause]),
    // The history pane: the first key's placements, the first worker's load trail.
    Case::at(
        "key_history_open",
        RECOVERED,
        &[FocusNext, FocusNext, ToggleHistory],
    ),
    Case::at("worker_history_open", RECOVERED, &[ToggleHistory]),
    // What the write keys do where they can do nothing: `--read-only` live, any replay.
    Case {
        read_only: true,
        ..Case::at("write_key_refused", SPILLING, &[GapUp])
    },
    Case::at("change_pending", SPILLING, &[GapUp, SkewUp]).only(Consoles::LiveOnly),
    // The replay's own keys: the next spill, paused; the end at ×4.
    Case {
        replay_keys: &[KeyCode::Char(']'), KeyCode::Char(' ')],
        ..Case::at("paused_at_the_first_spill", SPILLING, &[])
    }
    .only(Consoles::ReplayOnly),
    Case {
        replay_keys: &[KeyCode::Char('>'), KeyCode::Char('+'), KeyCode::Char('+')],
        ..Case::at("at_the_end_four_times_faster", RECOVERED, &[])
    }
    .only(Consoles::ReplayOnly),
];

/// A gateway queueing 3 requests and shedding 1.5 a second.
fn shedding() -> AdmissionSummary {
    AdmissionSummary {
        waiting: 3,
        admitted_per_s: 12.0,
        shed_per_s: 1.5,
        shed_per_s_by_reason: ShedRates {
            queue_timeout: 1.5,
            ..ShedRates::default()
        },
        admitted_total: 900,
        shed_total: 40,
    }
}

/// The fixture tick `name` at `seq`, stamped at moment `at`, with `edit` applied.
fn tick(
    name: &str,
    seq: u64,
    at: u64,
    edit: impl FnOnce(&mut bch_core::telemetry::Tick),
) -> ServerFrame {
    let mut frame = realistic_frame(name, seq);
    let ServerMessage::Tick(ref mut tick) = frame.message else {
        panic!("{name} holds no tick");
    };
    tick.ts_ms = START_MS + at * STEP_MS + 2;
    edit(tick);
    frame
}

/// A tick that changes nothing: the heartbeat.
fn quiet(seq: u64, at: u64) -> ServerFrame {
    tick("tick_spill", seq, at, |t| {
        t.workers.clear();
        t.keys.clear();
        t.spills.clear();
    })
}

/// The drill, as `(moment, replica, event)` in the order received.
fn drill() -> Vec<(u64, usize, RecordedKind)> {
    let frame = |frame: ServerFrame| RecordedKind::Frame {
        frame: Box::new(frame),
    };
    let storm = |seq| {
        tick("tick_spill", seq, SPILLING, |t| {
            for key in &mut t.keys {
                key.active.insert("10.244.3.121:8000".into(), 1);
            }
        })
    };
    let unhealthy = |seq| {
        tick("tick_unhealthy", seq, UNHEALTHY, |t| {
            for worker in &mut t.workers {
                worker.probe_failure = Some("refused".into());
            }
            t.discovery = Some(vec![failing_dns(4)]);
        })
    };
    let overloaded = |seq| {
        tick("tick_spill", seq, OVERLOADED, |t| {
            t.keys.clear();
            t.spills.clear();
            for worker in &mut t.workers {
                worker.capacity = Some(9);
                worker.full = worker.active >= 9;
            }
            t.admission = Some(shedding());
        })
    };
    let mut events = Vec::new();
    for replica in 0..2 {
        events.push((CONNECTED, replica, RecordedKind::Connected));
        events.push((CONNECTED, replica, frame(realistic_frame("snapshot", 0))));
    }
    for replica in 0..2 {
        events.push((SPILLING, replica, frame(storm(1))));
    }
    for replica in 0..2 {
        events.push((UNHEALTHY, replica, frame(unhealthy(2))));
    }
    for replica in 0..2 {
        events.push((OVERLOADED, replica, frame(overloaded(3))));
    }
    events.push((REFUSED, 0, frame(refusal(1, 4))));
    events.push((REFUSED, 1, frame(quiet(4, REFUSED))));
    events.push((REPLICA_DOWN, 0, frame(quiet(5, REPLICA_DOWN))));
    events.push((
        REPLICA_DOWN,
        1,
        RecordedKind::Disconnected {
            reason: "Connection refused (os error 111)".into(),
        },
    ));
    // Frames 6 to 8 never came.
    events.push((RESYNCING, 0, frame(quiet(9, RESYNCING))));
    events.push((RECOVERED, 0, frame(realistic_frame("snapshot", 10))));
    events.push((RECOVERED, 1, RecordedKind::Connected));
    events.push((RECOVERED, 1, frame(realistic_frame("snapshot", 0))));
    events
}

/// The console as the live app leaves it after every event of the drill up to moment `at`,
/// the drill starting at `origin` on the console's clock.
fn live(at: Option<u64>, origin: Instant) -> State {
    let mut state = State::for_replicas(URLS.iter().map(|u| (*u).to_owned()).collect());
    for (moment, replica, kind) in drill() {
        if at.is_none_or(|at| moment > at) {
            break;
        }
        let now = origin + Duration::from_millis(moment * STEP_MS);
        let replica = ReplicaId(replica);
        let event = match kind {
            RecordedKind::Frame { frame } => {
                state.frame_received_on(replica, now);
                ConnEvent::Frame(frame)
            }
            RecordedKind::Connected => ConnEvent::Status(ConnStatus::Connected),
            RecordedKind::Disconnected { reason } => ConnEvent::Status(ConnStatus::Reconnecting {
                retry_at: now,
                attempt: 1,
                reason,
            }),
            RecordedKind::BadFrame { error } => ConnEvent::BadFrame(error),
        };
        state.apply_replica_event(replica, event);
    }
    state
}

/// The drill written as a recording file, as `--record` writes one.
fn recording_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("drill.jsonl");
    let header = RecordingHeader::new("bch-tui", START_MS, URLS.map(String::from).to_vec());
    let mut text = header.to_line();
    for (moment, replica, kind) in drill() {
        let event = RecordedEvent {
            at_ms: START_MS + moment * STEP_MS,
            replica,
            kind,
        };
        text.push_str(&event.to_line());
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// The key that asks for `action` where the panels have the keyboard, or a prompt is open for
/// the characters.
fn key_of(action: Action) -> KeyCode {
    match action {
        ToggleWarnings => KeyCode::Char('w'),
        ToggleHelp => KeyCode::Char('?'),
        StartFilter => KeyCode::Char('/'),
        StartSearch => KeyCode::Char('f'),
        FilterChar(c) | SearchChar(c) => KeyCode::Char(c),
        FilterApply | SearchApply => KeyCode::Enter,
        CycleSort => KeyCode::Char('o'),
        ToggleWorkerOrder => KeyCode::Char('l'),
        JumpHottest => KeyCode::Char('h'),
        FocusPrev => KeyCode::BackTab,
        FocusNext => KeyCode::Tab,
        ToggleHistory => KeyCode::Enter,
        ScrollBottom => KeyCode::End,
        TogglePause => KeyCode::Char('p'),
        GapUp => KeyCode::Char('G'),
        SkewUp => KeyCode::Char('S'),
        other => panic!("no key for {other:?} in this matrix"),
    }
}

/// The case live at every size, one screen after the other.
fn live_screens(case: &Case) -> String {
    let origin = Instant::now();
    let mut state = live(case.at, origin);
    if case.read_only {
        state.set_read_only();
    }
    for &action in case.actions {
        state.apply_action(action);
    }
    let now = origin + Duration::from_millis(case.at.unwrap_or(0) * STEP_MS);
    SIZES
        .iter()
        .map(|&(width, height)| {
            sized(
                width,
                height,
                screen_text(&mut state.clone(), width, height, now),
            )
        })
        .collect()
}

/// The case replayed at every size: the recording opened, the replay's keys pressed to reach
/// the moment, then the actions' keys, on a `width`×`height` test terminal.
async fn replay_screens(case: &Case, file: &std::path::Path) -> String {
    let mut screens = String::new();
    for (width, height) in SIZES {
        let mut replay = Replay::open(file).unwrap();
        let to_moment: Vec<KeyCode> = if case.replay_keys.is_empty() {
            vec![KeyCode::Right; case.at.unwrap_or(0) as usize]
        } else {
            case.replay_keys.to_vec()
        };
        let keys: Vec<std::io::Result<Event>> = to_moment
            .into_iter()
            .chain(case.actions.iter().map(|&a| key_of(a)))
            .chain([KeyCode::Char('q')])
            .map(|code| {
                let modifiers = match code {
                    KeyCode::Char(c) if c.is_ascii_uppercase() => KeyModifiers::SHIFT,
                    KeyCode::BackTab => KeyModifiers::SHIFT,
                    _ => KeyModifiers::NONE,
                };
                Ok(Event::Key(KeyEvent::new(code, modifiers)))
            })
            .collect();
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        run_replay(&mut terminal, futures_util::stream::iter(keys), &mut replay)
            .await
            .unwrap();
        assert_eq!(
            replay.position_ms(),
            START_MS + case.at.unwrap_or(0) * STEP_MS,
            "{}: the replay stands at its moment",
            case.name
        );
        screens.push_str(&sized(
            width,
            height,
            buffer_text(terminal.backend().buffer()),
        ));
    }
    screens
}

/// One screen of the snapshot, under a line naming its size.
fn sized(width: u16, height: u16, screen: String) -> String {
    assert_eq!(screen.lines().count(), usize::from(height));
    format!("──── {width}×{height} ────\n{screen}")
}

/// Every case on every console it applies to, at every size.
#[tokio::test(start_paused = true)]
async fn every_panel_and_state_at_every_size_live_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let file = recording_file(dir.path());
    for case in CASES {
        if case.consoles != Consoles::ReplayOnly {
            insta::assert_snapshot!(format!("{}_live", case.name), live_screens(case));
        }
        if case.consoles != Consoles::LiveOnly {
            insta::assert_snapshot!(
                format!("{}_replay", case.name),
                replay_screens(case, &file).await
            );
        }
    }
}

/// The replayed drill reaches the live console's state at every moment (the matrix's two
/// consoles differ in the header only because the replay is the same drill).
#[tokio::test(start_paused = true)]
async fn the_replay_reaches_the_live_state_at_every_moment() {
    let dir = tempfile::tempdir().unwrap();
    let mut replay = Replay::open(&recording_file(dir.path())).unwrap();
    for at in CONNECTED..=RECOVERED {
        replay.seek(START_MS + at * STEP_MS);
        let live = live(Some(at), Instant::now());
        assert_eq!(replay.state().live(), live.live(), "at moment {at}");
        assert_eq!(
            replay.state().resyncing(),
            live.resyncing(),
            "at moment {at}"
        );
    }
}
