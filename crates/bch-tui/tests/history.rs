//! Placement history and worker load trails: built from scripted telemetry frames (a key at home,
//! spilled, home again; a worker's load rising and falling), bounded against a flood, the same in
//! a replay of the frames as live, and the history pane (Enter) at the three screen sizes, live
//! and in a replay.

mod common;

use bch_core::recording::{RecordedEvent, RecordedKind, Recording, RecordingHeader};
use bch_core::telemetry::{KeyRecord, ServerFrame, ServerMessage, Tick};
use bch_tui::{
    Action, ConnEvent, ConnStatus, HistoryOf, MAX_HISTORY_KEYS, MAX_PLACEMENTS, MAX_TEXT_BYTES,
    Panel, Reason, Replay, ReplicaId, State, TRAIL_LEN, TRAIL_STEP_MS,
};
use common::{frame, frame_at, realistic_frame, render};
use insta::assert_snapshot;
use tokio::time::Instant;

const T0: u64 = 1_767_268_800_000;
const KEY: &str = "chat-session-0001";
const R0: ReplicaId = ReplicaId(0);

fn connected() -> State {
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(R0, ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(R0, frame("snapshot"));
    s
}

/// The recorded spill tick at `seq` and `ts_ms`, with `edit` applied.
fn tick_with(seq: u64, ts_ms: u64, edit: impl FnOnce(&mut Tick)) -> ServerFrame {
    let mut f = frame_at("tick_spill", seq);
    let ServerMessage::Tick(tick) = &mut f.message else {
        panic!("tick_spill.json holds a {:?}", f.message);
    };
    tick.ts_ms = ts_ms;
    edit(tick);
    f
}

/// A tick in which [`KEY`]'s last request, just before `ts_ms`, went home to `w0`.
fn home_tick(seq: u64, ts_ms: u64) -> ServerFrame {
    tick_with(seq, ts_ms, |t| {
        t.spills.clear();
        t.keys[0].current = "w0".into();
        t.keys[0].last_seen_ms = ts_ms - 5;
    })
}

#[test]
fn a_key_at_home_then_spilled_then_home_again() {
    let mut s = connected();
    s.apply_replica_frame(R0, frame_at("tick_spill", 1));
    s.apply_replica_frame(R0, home_tick(2, T0 + 200));
    let history = s.history().placements.key(KEY).expect("a history");
    let p: Vec<_> = history.placements().collect();
    assert_eq!(p.len(), 3, "{p:#?}");
    assert_eq!(
        (p[0].worker.as_str(), &p[0].reason, p[0].first_ms),
        ("w0", &Reason::Home, T0 - 100)
    );
    assert_eq!(
        (p[1].worker.as_str(), p[1].preferred.as_str()),
        ("w1", "w0")
    );
    assert_eq!(p[1].spills, 2, "both spill events of the tick, one run");
    assert_eq!((p[1].first_ms, p[1].last_ms), (T0 + 40, T0 + 90));
    assert_eq!(
        p[1].reason,
        Reason::Bound {
            preferred_load: 9,
            min_load: 2,
            mean_load: 3.5,
            min_load_gap: 2,
            max_load_skew: 1.5,
        },
        "the newest decision's numbers"
    );
    assert_eq!(
        (p[2].worker.as_str(), &p[2].reason, p[2].first_ms),
        ("w0", &Reason::Home, T0 + 195)
    );

    // An older record that disagrees (another replica's view of an earlier request) is no news.
    s.apply_replica_frame(
        R0,
        tick_with(3, T0 + 250, |t| {
            t.spills.clear();
            t.keys[0].last_seen_ms = T0 + 50;
        }),
    );
    assert_eq!(
        s.history().placements.key(KEY).unwrap().placements().len(),
        3
    );

    // A snapshot (a resync) repeats the spill log: nothing is counted twice.
    let before = s.history().clone();
    let mut again = frame("snapshot");
    if let ServerMessage::Snapshot(snap) = &mut again.message {
        snap.ts_ms = T0 + 300;
        let ServerMessage::Tick(tick) = frame("tick_spill").message else {
            unreachable!()
        };
        snap.spills.extend(tick.spills);
        snap.keys[0].current = "w0".into();
        snap.keys[0].last_seen_ms = T0 + 195;
    }
    s.apply_replica_frame(R0, again);
    assert_eq!(
        s.history().placements.key(KEY),
        before.placements.key(KEY),
        "a snapshot's old spills and unchanged records add nothing"
    );
}

#[test]
fn capacity_no_eligible_and_unknown_reasons_are_kept_apart() {
    let mut s = connected();
    s.apply_replica_frame(
        R0,
        tick_with(1, T0 + 100, |t| {
            let base = t.spills[0].clone();
            let mut capacity = base.clone();
            capacity.cause = bch_core::telemetry::SpillCause::Capacity.into();
            capacity.to = "w2".into();
            let mut stayed = base.clone();
            stayed.branch = bch_core::policy::Branch::ExplicitRoutingKeyNoEligibleCandidate.into();
            stayed.to = "w0".into();
            let mut newer = base;
            newer.branch =
                bch_core::telemetry::Open::Unknown("explicit_routing_key_teleport".into());
            t.spills = vec![capacity, stayed, newer];
            t.keys.clear();
        }),
    );
    let reasons: Vec<Reason> = s
        .history()
        .placements
        .key(KEY)
        .unwrap()
        .placements()
        .skip(1)
        .map(|p| p.reason.clone())
        .collect();
    assert_eq!(
        reasons,
        [
            Reason::Capacity { preferred_load: 9 },
            Reason::NoEligible { preferred_load: 9 },
            Reason::Unknown("explicit_routing_key_teleport bound".into()),
        ]
    );
}

#[test]
fn a_key_moved_without_a_spill_event_says_so() {
    let mut s = connected();
    s.apply_replica_frame(R0, tick_with(1, T0 + 100, |t| t.spills.clear()));
    let last = s
        .history()
        .placements
        .key(KEY)
        .unwrap()
        .placements()
        .next_back()
        .unwrap()
        .clone();
    assert_eq!((last.worker.as_str(), last.reason), ("w1", Reason::Unseen));
}

#[test]
fn the_history_stays_bounded_against_a_flood() {
    let mut s = connected();
    // Twice as many keys as are kept, each with a spill event and a record; one key that moves
    // between two workers on every tick.
    for seq in 1..=(2 * MAX_HISTORY_KEYS as u64) {
        let ts_ms = T0 + seq * 10;
        s.apply_replica_frame(
            R0,
            tick_with(seq, ts_ms, |t| {
                let label = format!("flood-{seq:05}-{}", "x".repeat(1_000));
                let mut spill = t.spills[0].clone();
                spill.key = label.clone();
                spill.ts_ms = ts_ms;
                let mut mover = t.keys[0].clone();
                mover.current = if seq % 2 == 0 { "w1" } else { "w2" }.into();
                mover.last_seen_ms = ts_ms;
                let mut record: KeyRecord = t.keys[0].clone();
                record.key = label;
                record.last_seen_ms = ts_ms;
                t.spills = vec![spill];
                t.keys = vec![mover, record];
            }),
        );
    }
    let placements = &s.history().placements;
    assert_eq!(placements.len(), MAX_HISTORY_KEYS);
    let mover = placements
        .key(KEY)
        .expect("the most recently active key stays");
    assert_eq!(mover.placements().len(), MAX_PLACEMENTS);
    assert!(
        placements
            .key(&format!("flood-00001-{}", "x".repeat(1_000)))
            .is_none(),
        "the least recently active key went"
    );
    let newest = format!("flood-{:05}-{}", 2 * MAX_HISTORY_KEYS, "x".repeat(1_000));
    assert!(
        placements.key(&newest[..MAX_TEXT_BYTES]).is_some(),
        "a key of over 256 bytes is kept under its cut label"
    );
}

/// `w0`'s load at each tick of the scripted drill: a rise to 9 and back.
const LOADS: [u64; 12] = [2, 3, 5, 9, 8, 6, 4, 2, 2, 1, 1, 2];

/// The drill's ticks, one every 500 ms from `T0 + 500`, `w0` at [`LOADS`]; `KEY` spills to `w1`
/// from the fourth to the sixth tick, then goes home.
fn drill() -> Vec<ServerFrame> {
    LOADS
        .iter()
        .enumerate()
        .map(|(i, &load)| {
            let seq = i as u64 + 1;
            let ts_ms = T0 + seq * 500;
            tick_with(seq, ts_ms, |t| {
                t.workers[0].active = load;
                t.workers.truncate(1);
                let spilled = (4..=6).contains(&seq);
                for spill in &mut t.spills {
                    spill.ts_ms = ts_ms - 20;
                }
                if !spilled {
                    t.spills.clear();
                }
                t.keys[0].current = if spilled { "w1" } else { "w0" }.into();
                t.keys[0].last_seen_ms = ts_ms - 10;
            })
        })
        .collect()
}

#[test]
fn a_worker_trail_keeps_the_highest_load_of_each_step() {
    let mut s = connected();
    for f in drill() {
        s.apply_replica_frame(R0, f);
    }
    let trail = s.history().loads.trail("w0").expect("a trail");
    assert_eq!(trail.len(), TRAIL_LEN);
    assert_eq!(TRAIL_STEP_MS, 2_000);
    // Steps of 2 s from T0 (the snapshot, w0 at 2): the ticks at +0.5..1.5 s (3, 5 at most),
    // +2..3.5 s (9), +4..5.5 s (2 and below, but it held 4 when the step began), +6 s (2).
    let seen: Vec<Option<u64>> = trail.iter().copied().skip_while(Option::is_none).collect();
    assert_eq!(seen, [Some(5), Some(9), Some(4), Some(2)]);
    let quiet = s.history().loads.trail("w1").expect("a trail");
    let quiet: Vec<Option<u64>> = quiet.into_iter().skip_while(Option::is_none).collect();
    assert_eq!(quiet, [Some(2); 4], "a worker no tick named keeps its load");
}

#[test]
fn trails_follow_the_fleet_and_stay_bounded() {
    let mut s = connected();
    assert_eq!(s.history().loads.len(), 4);
    // A silence far longer than the trail: it still holds one ring per worker.
    s.apply_replica_frame(R0, home_tick(1, T0 + 3_600_000));
    let trail = s.history().loads.trail("w3").unwrap();
    assert_eq!(trail.len(), TRAIL_LEN);
    assert!(
        trail.iter().all(Option::is_some),
        "filled at the load it held"
    );
    // A snapshot without w3: its trail goes.
    let mut fewer = frame("snapshot");
    if let ServerMessage::Snapshot(snap) = &mut fewer.message {
        snap.ts_ms = T0 + 3_700_000;
        snap.workers.truncate(3);
        snap.ring = None;
    }
    s.apply_replica_frame(R0, fewer);
    assert!(s.history().loads.trail("w3").is_none());
    assert_eq!(s.history().loads.len(), 3);
}

#[test]
fn enter_opens_the_pane_on_the_focused_selection_and_esc_closes_it() {
    let mut s = connected();
    s.apply_action(Action::ToggleHistory);
    assert_eq!(
        s.ui().history_of(),
        Some(HistoryOf::Worker),
        "workers panel"
    );
    s.apply_action(Action::FilterClear);
    assert_eq!(s.ui().history_of(), None, "Esc closes it");
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::ToggleHistory);
    assert_eq!(s.ui().history_of(), None, "nothing to show in the ring");
    assert!(
        s.notice().unwrap().contains("keys panel"),
        "{:?}",
        s.notice()
    );
    s.apply_action(Action::FocusNext);
    assert_eq!(s.ui().focus(), Panel::Keys);
    s.apply_action(Action::Scroll(2));
    let third = s.key_rows()[2].key.clone();
    assert_eq!(
        s.selected_key().unwrap().key,
        third,
        "↓ moves the selection"
    );
    s.apply_action(Action::ToggleHistory);
    assert_eq!(s.ui().history_of(), Some(HistoryOf::Key));
    s.apply_action(Action::ToggleHistory);
    assert_eq!(s.ui().history_of(), None, "Enter closes it too");
    // With a kept filter: the first Esc closes the pane, the second clears the filter.
    s.apply_action(Action::StartFilter);
    s.apply_action(Action::FilterChar('a'));
    s.apply_action(Action::FilterApply);
    s.apply_action(Action::ToggleHistory);
    s.apply_action(Action::FilterClear);
    assert_eq!((s.ui().history_of(), s.ui().filter()), (None, "a"));
    s.apply_action(Action::FilterClear);
    assert_eq!(s.ui().filter(), "");
}

#[test]
fn pausing_freezes_the_history_with_the_panels() {
    let mut s = connected();
    s.apply_action(Action::TogglePause);
    let frozen = s.history().clone();
    s.apply_replica_frame(R0, frame_at("tick_spill", 1));
    assert_eq!(s.history(), &frozen);
    s.apply_action(Action::TogglePause);
    assert_ne!(s.history(), &frozen, "the live history went on");
}

/// The drill as a recording: connected, the snapshot, the ticks, each received as sent.
fn recording(frames: Vec<ServerFrame>) -> Recording {
    let event = |at_ms, kind| RecordedEvent {
        at_ms,
        replica: 0,
        kind,
    };
    let mut events = vec![event(T0, RecordedKind::Connected)];
    for f in frames {
        let at_ms = match &f.message {
            ServerMessage::Tick(t) => t.ts_ms + 3,
            _ => T0 + 2,
        };
        events.push(event(at_ms, RecordedKind::Frame { frame: Box::new(f) }));
    }
    Recording {
        header: RecordingHeader::new("bch-tui", T0, vec!["ws://gw/ws".into()]),
        events,
        damaged: Vec::new(),
        truncated: false,
    }
}

#[test]
fn a_replay_builds_the_same_history_frame_by_frame_as_the_live_run() {
    let frames: Vec<ServerFrame> = std::iter::once(frame("snapshot")).chain(drill()).collect();
    let mut live = State::for_replicas(vec!["ws://gw/ws".into()]);
    live.apply_replica_event(R0, ConnEvent::Status(ConnStatus::Connected));
    let mut replay = Replay::new(recording(frames.clone()), Instant::now());
    replay.step().expect("connected");
    for f in frames {
        live.apply_replica_event(R0, ConnEvent::Frame(Box::new(f)));
        replay.step().expect("a frame");
        assert_eq!(replay.state().history(), live.history());
    }
    assert!(replay.step().is_none());
    // A seek back rebuilds it from a checkpoint to the same history.
    let end = replay.state().history().clone();
    replay.seek(T0);
    replay.seek(replay.end_ms());
    assert_eq!(replay.state().history(), &end);
}

const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (200, 50)];

/// The drill with realistic names: a storm on the tenant key, then home.
fn realistic_drill() -> Vec<ServerFrame> {
    let mut frames = vec![realistic_frame("snapshot", 0)];
    for (i, f) in drill().into_iter().enumerate() {
        let text = serde_json::to_string(&f).unwrap();
        let mut real: ServerFrame = serde_json::from_str(
            &text
                .replace("\"w0\"", "\"10.244.1.17:8000\"")
                .replace("\"w1\"", "\"10.244.2.5:8000\"")
                .replace(
                    "\"chat-session-0001\"",
                    "\"tenant-acme/chat-session-7f3a9c21-0001\"",
                ),
        )
        .unwrap();
        real.seq = i as u64 + 1;
        frames.push(real);
    }
    frames
}

/// Opens the pane in `state` on the key table's first key (`Keys`) or the first worker.
fn open(state: &mut State, of: HistoryOf) {
    if of == HistoryOf::Key {
        state.apply_action(Action::FocusNext);
        state.apply_action(Action::FocusNext);
    }
    state.apply_action(Action::ToggleHistory);
    assert_eq!(state.ui().history_of(), Some(of));
}

fn name(of: HistoryOf) -> &'static str {
    match of {
        HistoryOf::Key => "key",
        HistoryOf::Worker => "worker",
    }
}

#[test]
fn the_history_pane_live_at_every_size() {
    for of in [HistoryOf::Key, HistoryOf::Worker] {
        let mut s = State::for_replicas(vec!["ws://10.96.0.21:9090/ws".into()]);
        s.apply_replica_event(R0, ConnEvent::Status(ConnStatus::Connected));
        for f in realistic_drill() {
            s.apply_replica_frame(R0, f);
        }
        open(&mut s, of);
        for (width, height) in SIZES {
            let screen = render(&s, width, height, Instant::now());
            assert!(screen.contains("History of"), "{screen}");
            assert_snapshot!(format!("live_{}_{width}x{height}", name(of)), screen);
        }
    }
}

#[test]
fn the_history_pane_in_a_replay_at_every_size() {
    for of in [HistoryOf::Key, HistoryOf::Worker] {
        let mut replay = Replay::new(recording(realistic_drill()), Instant::now());
        replay.seek(replay.end_ms());
        replay.set_paused(true);
        let now = replay.instant_of(replay.position_ms());
        let playback = replay.playback();
        let state = replay.state_mut();
        state.set_playback(Some(playback));
        open(state, of);
        for (width, height) in SIZES {
            let screen = bch_tui::screen_text(state, width, height, now);
            assert!(screen.contains("REPLAY"), "{screen}");
            assert_snapshot!(format!("replay_{}_{width}x{height}", name(of)), screen);
        }
    }
}

/// Routing keys and worker names from the data plane reach the pane through the sanitiser.
#[test]
fn the_pane_draws_network_text_through_the_sanitiser() {
    let evil_key = "tenant\u{202e}evil\u{200b}key\nx";
    let evil_worker = "w\u{2066}1\u{7}";
    let mut s = connected();
    s.apply_replica_frame(
        R0,
        tick_with(1, T0 + 100, |t| {
            for spill in &mut t.spills {
                spill.key = evil_key.into();
                spill.to = evil_worker.into();
            }
            t.keys[0].key = evil_key.into();
            t.keys[0].current = evil_worker.into();
        }),
    );
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::FocusNext);
    let row = s.key_rows().iter().position(|k| k.key == evil_key).unwrap();
    s.apply_action(Action::Scroll(row as i32));
    s.apply_action(Action::ToggleHistory);
    let screen = render(&s, 120, 40, Instant::now());
    assert!(
        screen.contains("History of key tenant�evil�key x"),
        "{screen}"
    );
    assert!(screen.contains("w�1�"), "{screen}");
    for raw in ['\u{202e}', '\u{200b}', '\u{2066}', '\u{7}'] {
        assert!(!screen.contains(raw), "{raw:?} reached the screen");
    }
}

/// A replay seeked back to before any key was known, with the key pane open: the pane stays
/// drawn and says why it shows no key (it used to leave the lower half of the screen blank).
#[test]
fn a_pane_with_no_key_to_show_stays_drawn_and_says_why() {
    let mut replay = Replay::new(recording(realistic_drill()), Instant::now());
    replay.seek(replay.end_ms());
    open(replay.state_mut(), HistoryOf::Key);
    replay.seek(T0);
    assert!(replay.state().key_rows().is_empty(), "no key known at T0");
    let now = replay.instant_of(replay.position_ms());
    for (width, height) in SIZES {
        let screen = bch_tui::screen_text(replay.state_mut(), width, height, now);
        assert!(screen.contains("History of key"), "{screen}");
        assert!(screen.contains("no key to show"), "{screen}");
        assert!(screen.contains("Enter / Esc closes"), "{screen}");
    }
}

/// `/` while the pane is open closes it, so the prompt and the table it filters are in view.
#[test]
fn the_filter_prompt_closes_the_pane_so_it_shows() {
    let mut s = connected();
    open(&mut s, HistoryOf::Key);
    s.apply_action(Action::StartFilter);
    for c in "zzz".chars() {
        s.apply_action(Action::FilterChar(c));
    }
    assert_eq!(s.ui().history_of(), None);
    let screen = render(&s, 120, 40, Instant::now());
    assert!(screen.contains("/zzz▏"), "{screen}");
}

/// The key pane says its placements are sampled: every spill event, but of the other requests
/// only each tick's last one per key, so a key that is mostly at home may show only spills.
#[test]
fn the_key_pane_says_what_its_placements_sample() {
    let mut s = connected();
    s.apply_replica_frame(R0, frame_at("tick_spill", 1));
    open(&mut s, HistoryOf::Key);
    let screen = render(&s, 120, 40, Instant::now());
    assert!(
        screen.contains("sampled: every spill seen, and the last request of each tick"),
        "{screen}"
    );
}
