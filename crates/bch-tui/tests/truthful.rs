//! What the console says must be true: no bound drawn where none is in force, a frozen gateway
//! shown stale, every queued change visible and none pending forever, the previous process's
//! answers gone after a reconnect, every OVER worker counted, the numbers kept whole before the
//! bars, counters since the last policy change, and the drain keys acting on the selected worker.

mod common;

use bch_core::policy::{Branch, PolicyKind};
use bch_core::telemetry::{
    ChangeSource, DrainedUpdate, PolicyUpdate, ServerFrame, ServerMessage, SpillEvent, Tick,
    WorkerState,
};
use bch_tui::{
    Action, COMMAND_TIMEOUT, CommandState, ConnEvent, ConnStatus, Effect, Panel, ReplicaId, State,
};
use common::{connected_with, frame, frame_at, render};
use tokio::time::{Duration, Instant};

fn connected() -> State {
    connected_with(|_| {})
}

fn sent(effect: Effect) -> serde_json::Value {
    match effect {
        Effect::Send(cmd) => serde_json::to_value(cmd).unwrap(),
        other => panic!("expected a command, got {other:?}"),
    }
}

/// A tick at `seq` and gateway time `ts_ms` that changes nothing.
fn empty_tick(seq: u64, ts_ms: u64) -> ServerFrame {
    ServerFrame::new(
        seq,
        ServerMessage::Tick(Tick {
            ts_ms,
            workers: vec![],
            keys: vec![],
            removed_keys: vec![],
            spills: vec![],
            totals: Default::default(),
            dropped_events: 0,
            discovery: None,
            admission: None,
        }),
    )
}

#[test]
fn under_consistent_hashing_no_bound_is_drawn_and_threshold_keys_say_why() {
    let mut s = connected_with(|snap| {
        snap.policy.kind = PolicyKind::ConsistentHashing.into();
        snap.workers[0].active = 40;
    });
    assert!(s.live().bound().is_none());
    assert_eq!(s.live().over(), 0);
    let screen = render(&s, 120, 40, Instant::now());
    assert!(!screen.contains("OVER"), "{screen}");
    assert!(
        screen.contains("no bound: consistent_hashing never spills"),
        "{screen}"
    );
    assert!(!screen.contains("min+gap"), "{screen}");
    assert_eq!(s.apply_action(Action::GapUp), Effect::None);
    assert!(
        s.notice().unwrap().contains("never spills"),
        "{:?}",
        s.notice()
    );
    assert_eq!(s.apply_action(Action::SkewDown), Effect::None);
}

#[test]
fn a_gateway_that_stops_sending_is_shown_stale() {
    let mut s = connected();
    let t0 = Instant::now();
    // Ticks 100 ms apart set the expected interval.
    for (i, seq) in (1..=3u64).enumerate() {
        s.apply_replica_frame(
            ReplicaId(0),
            empty_tick(seq, 1_767_268_800_000 + i as u64 * 100),
        );
        s.frame_received_on(ReplicaId(0), t0);
    }
    let fresh = render(&s, 80, 24, t0 + Duration::from_millis(200));
    assert!(
        fresh
            .lines()
            .next()
            .unwrap()
            .contains("● CONNECTED 0.2s ago"),
        "{fresh}"
    );
    assert!(!s.stale(t0 + Duration::from_millis(900)));
    let later = t0 + Duration::from_secs(12);
    assert!(s.stale(later));
    let frozen = render(&s, 80, 24, later);
    let header = frozen.lines().next().unwrap();
    assert!(header.contains("◌ STALE: no frame for 12.0s"), "{header}");
    assert!(!header.contains("CONNECTED"), "{header}");
}

#[test]
fn quick_presses_show_every_queued_change_and_time_out() {
    let mut s = connected();
    for _ in 0..3 {
        sent(s.apply_action(Action::GapUp));
    }
    let screen = render(&s, 80, 24, Instant::now());
    let status = screen.lines().nth(3).unwrap();
    assert!(status.contains("#1–#3 gap 2 → 5 … 3 pending"), "{status}");
    // Nothing answers: the clock starts when the console first looks, and they are unconfirmed
    // after it (the gateway may still apply them).
    let t0 = Instant::now();
    assert!(!s.expire_commands(t0));
    assert!(!s.expire_commands(t0 + COMMAND_TIMEOUT - Duration::from_millis(1)));
    assert!(s.expire_commands(t0 + COMMAND_TIMEOUT));
    assert_eq!(s.last_command().unwrap().state, CommandState::Unconfirmed);
    assert_eq!(s.pending().count(), 0);
}

#[test]
fn a_new_connection_forgets_the_previous_processs_answers() {
    let mut s = connected();
    sent(s.apply_action(Action::GapUp));
    s.apply_replica_frame(ReplicaId(0), frame_at("ack", 1));
    assert_eq!(s.last_command().unwrap().state, CommandState::Applied);
    s.apply_replica_event(
        ReplicaId(0),
        common::reconnecting(Instant::now(), 1, "gone"),
    );
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(ReplicaId(0), frame("snapshot"));
    assert!(
        s.last_command().is_none(),
        "no ✓ applied from the old process"
    );
    let screen = render(&s, 80, 24, Instant::now());
    assert!(!screen.contains("applied"), "{screen}");
    // Ids keep growing, so a late answer can never be matched to a new change.
    assert_eq!(sent(s.apply_action(Action::GapUp))["id"], 2);
}

#[test]
fn drain_keys_act_on_the_selected_worker_and_the_answer_shows() {
    let mut s = connected();
    assert_eq!(s.ui().focus(), Panel::Workers);
    s.apply_action(Action::Scroll(2));
    assert_eq!(s.selected_worker().unwrap().name, "w2");
    let json = sent(s.apply_action(Action::Drain));
    assert_eq!(
        json,
        serde_json::json!({"type": "drain", "id": 1, "worker": "w2"})
    );
    let mut record = s.live().workers[2].clone();
    record.state = WorkerState::Draining.into();
    let ack = ServerFrame::new(
        1,
        ServerMessage::Ack(bch_core::telemetry::Ack {
            id: Some(bch_core::telemetry::CommandId::Number(1)),
            policy: s.live().policy.unwrap().into(),
            worker: Some(record),
        }),
    );
    s.apply_replica_frame(ReplicaId(0), ack);
    assert_eq!(s.last_command().unwrap().state, CommandState::Applied);
    let screen = render(&s, 120, 40, Instant::now());
    assert!(screen.contains("1 draining"), "{screen}");
    assert!(
        screen.contains("w2") && screen.contains("DRAIN"),
        "{screen}"
    );
    assert!(screen.contains("#1 drain w2 ✓ applied"), "{screen}");
    s.apply_replica_frame(
        ReplicaId(0),
        ServerFrame::new(
            2,
            ServerMessage::Drained(DrainedUpdate {
                ts_ms: 1,
                worker: "w2".into(),
                removed: false,
            }),
        ),
    );
    assert_eq!(s.notice(), Some("w2 drained: no request in flight"));
    assert_eq!(
        sent(s.apply_action(Action::Undrain)),
        serde_json::json!({"type": "undrain", "id": 2, "worker": "w2"})
    );
}

#[test]
fn the_title_counts_over_workers_and_load_order_brings_them_up() {
    let mut s = connected_with(|snap| {
        // Twelve workers; the last one far over the bound.
        let template = snap.workers[0].clone();
        snap.workers = (0..12)
            .map(|i| bch_core::telemetry::WorkerRecord {
                name: format!("w{i:02}"),
                active: if i == 11 { 30 } else { 1 },
                ..template.clone()
            })
            .collect();
    });
    let screen = render(&s, 80, 24, Instant::now());
    assert!(screen.contains("1 OVER"), "{screen}");
    assert!(!screen.contains("w11"), "scrolled out of view at 80×24");
    s.apply_action(Action::ToggleWorkerOrder);
    let screen = render(&s, 80, 24, Instant::now());
    // Line 6 is the fleet summary (twelve workers do not all fit); the first worker row follows.
    let first_row = screen.lines().nth(7).unwrap();
    assert!(
        first_row.contains("w11") && first_row.contains("OVER"),
        "{screen}"
    );
    assert!(screen.contains("by load"), "{screen}");
}

#[test]
fn numbers_are_never_cut_and_errors_show_at_every_width() {
    let s = connected_with(|snap| snap.workers[1].errors_total = 7);
    for width in [80u16, 120, 200, 260] {
        let screen = render(&s, width, 40, Instant::now());
        let row = screen
            .lines()
            .find(|l| l.contains(" w1 "))
            .unwrap_or_else(|| panic!("{screen}"));
        assert!(row.contains("err    7"), "{width}: {row}");
    }
    // The key table's in-flight column keeps whole `worker:n` pairs.
    let spilling = {
        let mut s = connected();
        s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 1));
        s
    };
    for width in [80u16, 120] {
        let screen = render(&spilling, width, 40, Instant::now());
        assert!(screen.contains("w0:8 w1:2"), "{width}:\n{screen}");
    }
}

#[test]
fn key_counts_start_again_at_a_policy_change_and_home_share_says_where_requests_went() {
    let mut s = connected();
    s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 1));
    let key = s.live().keys["chat-session-0001"].clone();
    assert_eq!((key.requests_total, key.spills_total), (51, 2));
    let screen = render(&s, 80, 24, Instant::now());
    let row = screen
        .lines()
        .find(|l| l.contains("chat-session-0001"))
        .unwrap();
    assert!(
        row.trim_end_matches('│')
            .trim_end()
            .ends_with("51      2  96%"),
        "{row}"
    );
    s.apply_replica_frame(
        ReplicaId(0),
        ServerFrame::new(
            2,
            ServerMessage::Policy(PolicyUpdate {
                ts_ms: 1_767_268_800_000,
                policy: s.live().policy.unwrap().into(),
                changed_by: ChangeSource::Ws.into(),
                client: Some("10.0.0.3:5123".into()),
            }),
        ),
    );
    let mut tick = frame_at("tick_spill", 3);
    if let ServerMessage::Tick(ref mut t) = tick.message {
        t.spills.clear();
        for k in &mut t.keys {
            if k.key == "chat-session-0001" {
                k.requests_total = 61;
                k.spills_total = 2;
            }
        }
    }
    s.apply_replica_frame(ReplicaId(0), tick);
    let screen = render(&s, 160, 48, Instant::now());
    let row = screen
        .lines()
        .find(|l| l.starts_with("│chat-session-0001"))
        .unwrap();
    assert!(
        row.contains("   10      0 100%"),
        "10 requests since, all at home: {row}"
    );
    assert!(
        screen.contains("counts since the policy change at 12:00:00.000"),
        "{screen}"
    );
    let policy_line = screen.lines().nth(1).unwrap();
    assert!(
        policy_line.contains("(changed by ws 10.0.0.3:5123, lost on reload)"),
        "{policy_line}"
    );
}

#[test]
fn a_spill_log_that_turns_over_in_seconds_is_grouped_by_key_and_pair() {
    let mut s = connected();
    let template: SpillEvent = s.live().spills[0].clone();
    let mut f = frame_at("tick_spill", 1);
    if let ServerMessage::Tick(ref mut t) = f.message {
        t.spills = (0..300u64)
            .map(|i| SpillEvent {
                ts_ms: 1_767_268_800_000 + i * 10,
                key: format!("hot-{}", i % 2),
                branch: Branch::ExplicitRoutingKeySpillover.into(),
                from: "w0".into(),
                to: if i % 2 == 0 { "w1" } else { "w2" }.into(),
                ..template.clone()
            })
            .collect();
    }
    s.apply_replica_frame(ReplicaId(0), f);
    let screen = render(&s, 160, 48, Instant::now());
    assert!(
        screen.contains("the last 200 in 2.0s by key and pair"),
        "{screen}"
    );
    assert!(screen.contains("×100"), "{screen}");
    assert_eq!(screen.matches("×100").count(), 2, "{screen}");
}

/// A change the gateway applies after the console stopped waiting is not a failure: it shows as
/// unconfirmed (no `✗`), and the policy frame that shows the new value turns it applied.
#[test]
fn a_change_without_an_answer_in_time_is_unconfirmed_and_a_late_policy_frame_confirms_it() {
    let mut s = connected();
    let now = Instant::now();
    sent(s.apply_action(Action::GapUp));
    s.expire_commands(now);
    assert!(s.expire_commands(now + COMMAND_TIMEOUT));
    let screen = render(&s, 80, 24, now + COMMAND_TIMEOUT);
    let status = screen.lines().nth(3).unwrap();
    assert!(
        status.contains("unconfirmed") && !status.contains('✗'),
        "{status}"
    );
    let mut policy = s.live().policy.unwrap();
    policy.min_load_gap = 3;
    s.apply_replica_frame(
        ReplicaId(0),
        ServerFrame::new(
            1,
            ServerMessage::Policy(PolicyUpdate {
                ts_ms: 1_767_268_800_500,
                policy: policy.into(),
                changed_by: ChangeSource::Ws.into(),
                client: None,
            }),
        ),
    );
    assert_eq!(s.last_command().unwrap().state, CommandState::Applied);
    // A late ack does the same.
    sent(s.apply_action(Action::GapUp));
    s.expire_commands(now);
    s.expire_commands(now + COMMAND_TIMEOUT);
    let mut ack = frame_at("ack", 2);
    if let ServerMessage::Ack(ref mut a) = ack.message {
        a.id = Some(bch_core::telemetry::CommandId::Number(2));
        a.policy.min_load_gap = 4;
    }
    s.apply_replica_frame(ReplicaId(0), ack);
    assert_eq!(s.last_command().unwrap().state, CommandState::Applied);
}

/// The gateway sends a policy change at once, but the counters of requests routed just before it
/// arrive with the next tick: a spill decided before the change (its event says when) is not
/// counted since the change.
#[test]
fn spills_from_before_a_policy_change_are_not_counted_since_it() {
    let mut s = connected();
    let change_ms = 1_767_268_800_200;
    s.apply_replica_frame(
        ReplicaId(0),
        ServerFrame::new(
            1,
            ServerMessage::Policy(PolicyUpdate {
                ts_ms: change_ms,
                policy: s.live().policy.unwrap().into(),
                changed_by: ChangeSource::Http.into(),
                client: None,
            }),
        ),
    );
    // The tick after it carries one spill from before the change (ts 040 and 085 are before
    // 200) and one after it.
    let mut tick = frame_at("tick_spill", 2);
    if let ServerMessage::Tick(ref mut t) = tick.message {
        t.ts_ms = change_ms + 100;
        t.spills[1].ts_ms = change_ms + 50;
    }
    let before = s.live().keys["chat-session-0001"].clone();
    s.apply_replica_frame(ReplicaId(0), tick);
    let key = s.live().keys["chat-session-0001"].clone();
    assert_eq!(key.spills_total, before.spills_total + 2, "{before:?}");
    let (_, spills) = s.live().baseline.as_ref().unwrap().since(&key);
    assert_eq!(spills, 1, "only the spill after the change");
}

/// A drain survives a reload (the gateway keeps worker states over one), unlike a threshold
/// change: its applied line must not say it ends there.
#[test]
fn an_applied_drain_does_not_claim_to_end_at_a_reload() {
    let mut s = connected();
    sent(s.apply_action(Action::Drain));
    let mut worker = s.live().workers[0].clone();
    worker.state = WorkerState::Draining.into();
    s.apply_replica_frame(
        ReplicaId(0),
        ServerFrame::new(
            1,
            ServerMessage::Ack(bch_core::telemetry::Ack {
                id: Some(bch_core::telemetry::CommandId::Number(1)),
                policy: s.live().policy.unwrap().into(),
                worker: Some(worker),
            }),
        ),
    );
    let screen = render(&s, 80, 24, Instant::now());
    let status = screen.lines().nth(3).unwrap();
    assert!(status.contains("drain w0 ✓ applied"), "{status}");
    assert!(!screen.contains("reload"), "{screen}");
}
