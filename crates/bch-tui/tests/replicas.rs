//! Several replicas in one console (`bch-tui --url A --url B --url C`): the fleet merged across
//! them, one row per replica, a replica whose settings differ flagged, a threshold key sent to
//! every replica with each answer shown, and the load bars reading the load the rule reads, with
//! stale workers marked; a drain anywhere shows in the merge, drain keys reach every replica, one
//! silent replica marks the view stale and an unanswered change times out on each replica.

mod common;

use bch_core::fleet_load::LoadSource;
use bch_core::telemetry::{
    Ack, ClientCommand, CommandId, ServerFrame, ServerMessage, Snapshot, WorkerState,
};
use bch_tui::{Action, CommandState, ConnEvent, ConnStatus, Effect, ReplicaId, State};
use common::{frame, render, snapshot_with};
use insta::assert_snapshot;
use tokio::time::{Duration, Instant};

const URLS: [&str; 3] = [
    "ws://10.0.0.1:9090/ws",
    "ws://10.0.0.2:9090/ws",
    "ws://10.0.0.3:9090/ws",
];

/// Three connected replicas of one worker_metrics fleet, each with the recorded snapshot edited by
/// `edit(replica, snapshot)`.
fn three(edit: impl Fn(usize, &mut Snapshot)) -> State {
    let mut s = State::for_replicas(URLS.iter().map(|u| (*u).to_owned()).collect());
    for i in 0..3 {
        s.apply_replica_event(ReplicaId(i), ConnEvent::Status(ConnStatus::Connected));
        let snapshot = snapshot_with(|snap| {
            snap.policy.load_source = LoadSource::WorkerMetrics.into();
            edit(i, snap);
        });
        assert_eq!(s.apply_replica_frame(ReplicaId(i), snapshot), None);
    }
    s
}

/// Each replica's share of the fleet: the recorded loads, plus the fleet-wide load every replica's
/// rule reads (the sum, 6 on w0), with w3's scrape stale on replica 2.
fn fleet_of_three() -> State {
    three(|i, snap| {
        for (w, worker) in snap.workers.iter_mut().enumerate() {
            worker.active = [2, 1, 1, 0][w] + u64::from(i == 0 && w == 0);
            worker.load = Some([6, 3, 3, 1][w]);
            worker.reported_load = Some([6, 3, 3, 1][w]);
            worker.scrape_age_ms = Some(40);
        }
        if i == 2 {
            snap.workers[3].load_stale = true;
            snap.workers[3].load = Some(0);
        }
        snap.spills[0].ts_ms += i as u64;
    })
}

#[test]
fn the_fleet_is_merged_across_replicas() {
    let s = fleet_of_three();
    let fleet = s.visible();
    let w0 = &fleet.workers[0];
    assert_eq!(w0.active, 7, "every replica's in-flight requests on w0");
    assert_eq!(w0.rule_load(), 6, "the fleet-wide load the rules read");
    assert_eq!(w0.requests_total, 3 * 812);
    assert!(fleet.workers[3].load_stale, "stale on one replica");
    assert_eq!(fleet.spills.len(), 6, "the three spill logs interleaved");
    assert!(fleet.spills.iter().is_sorted_by_key(|e| e.ts_ms));
    assert!((fleet.totals.requests_per_s - 3.0 * 48.0).abs() < 1e-9);
    let key = &fleet.keys["chat-session-0001"];
    assert_eq!(key.active["w0"], 6);
    assert_eq!(key.requests_total, 3 * 41);
    assert_eq!(s.differing(), vec![false, false, false]);
}

#[test]
fn a_replica_with_other_settings_is_flagged() {
    let s = three(|i, snap| {
        if i == 1 {
            snap.policy.load_source = LoadSource::Local.into();
        }
    });
    assert_eq!(s.differing(), vec![false, true, false]);
    let s = three(|i, snap| {
        if i == 2 {
            snap.policy.min_load_gap = 4;
        }
    });
    assert_eq!(s.differing(), vec![false, false, true]);
}

fn ack(id: u64, seq: u64, gap: u64) -> ServerFrame {
    let ServerMessage::Snapshot(snap) = frame("snapshot").message else {
        unreachable!()
    };
    let mut policy = snap.policy;
    policy.min_load_gap = gap;
    policy.load_source = LoadSource::WorkerMetrics.into();
    ServerFrame::new(
        seq,
        ServerMessage::Ack(Ack {
            id: Some(CommandId::Number(id)),
            policy,
            worker: None,
        }),
    )
}

#[test]
fn a_threshold_key_goes_to_every_replica_and_each_answer_is_shown() {
    let mut s = fleet_of_three();
    let Effect::Send(ClientCommand::SetPolicy {
        id, min_load_gap, ..
    }) = s.apply_action(Action::GapUp)
    else {
        panic!("a set_policy for every replica")
    };
    assert_eq!((id, min_load_gap), (Some(CommandId::Number(1)), Some(3)));
    s.apply_replica_frame(ReplicaId(0), ack(1, 1, 3));
    let entry = s.last_command().unwrap();
    assert_eq!(
        entry.state,
        CommandState::Pending,
        "two replicas have not answered"
    );
    assert_eq!(entry.replies[0], CommandState::Applied);
    // Replica 1 drops before answering; replica 2 acknowledges.
    s.apply_replica_event(
        ReplicaId(1),
        common::reconnecting(
            Instant::now() + Duration::from_secs(1),
            1,
            "connection reset",
        ),
    );
    s.apply_replica_frame(ReplicaId(2), ack(1, 1, 3));
    let entry = s.last_command().unwrap();
    assert!(matches!(&entry.replies[1], CommandState::Failed(m) if m.contains("connection lost")));
    assert!(matches!(&entry.state, CommandState::Failed(m) if m.starts_with("replica 2:")));
    assert_eq!(entry.replies[2], CommandState::Applied);
    // Replicas 1 (still on gap 2) and the others (now on 3) differ: the odd one is flagged.
    assert_eq!(s.differing(), vec![false, true, false]);
}

#[test]
fn three_replicas_160x48() {
    let mut s = fleet_of_three();
    s.apply_action(Action::GapUp);
    s.apply_replica_frame(ReplicaId(0), ack(1, 1, 3));
    s.apply_replica_frame(ReplicaId(2), ack(1, 1, 3));
    let screen = render(&s, 160, 48, Instant::now());
    assert!(screen.contains("3 replicas, merged"), "{screen}");
    assert!(screen.contains("▒"), "the stale worker is marked: {screen}");
    assert!(screen.contains("DIFFERS"), "{screen}");
    assert_snapshot!(screen);
}

#[test]
fn three_replicas_80x24() {
    assert_snapshot!(render(&fleet_of_three(), 80, 24, Instant::now()));
}

#[test]
fn a_worker_draining_on_one_replica_is_draining_in_the_merge_and_a_drain_goes_to_every_replica() {
    let s = three(|i, snap| {
        if i == 1 {
            snap.workers[2].state = WorkerState::Draining.into();
        }
    });
    let fleet = s.visible();
    assert_eq!(fleet.workers[2].state, WorkerState::Draining);
    assert_eq!(fleet.workers[0].state, WorkerState::Active);

    let mut s = fleet_of_three();
    let Effect::Send(ClientCommand::Drain { id, worker, .. }) = s.apply_action(Action::Drain)
    else {
        panic!("a drain for every replica")
    };
    assert_eq!((id, worker.as_str()), (Some(CommandId::Number(1)), "w0"));
    let entry = s.last_command().unwrap();
    assert_eq!(
        entry.replies.len(),
        3,
        "one answer expected from each replica"
    );
}

#[test]
fn one_silent_replica_marks_the_view_stale_and_an_unanswered_change_times_out_on_each() {
    let mut s = fleet_of_three();
    let start = Instant::now();
    for i in 0..3 {
        s.frame_received_on(ReplicaId(i), start);
    }
    assert!(!s.stale(start + Duration::from_millis(200)));
    // Replicas 0 and 1 keep talking; replica 2 goes silent.
    let later = start + Duration::from_secs(5);
    s.frame_received_on(ReplicaId(0), later);
    s.frame_received_on(ReplicaId(1), later);
    assert!(s.stale(later), "replica 2 sent nothing for 5 s");
    assert_eq!(s.frame_age(later), Some(Duration::from_secs(5)));

    let Effect::Send(_) = s.apply_action(Action::GapUp) else {
        panic!("a set_policy for every replica")
    };
    s.apply_replica_frame(ReplicaId(0), ack(1, 1, 3));
    assert!(!s.expire_commands(later));
    assert!(s.expire_commands(later + bch_tui::COMMAND_TIMEOUT));
    let entry = s.last_command().unwrap();
    assert_eq!(entry.replies[0], CommandState::Applied, "answered in time");
    assert_eq!(entry.replies[1], CommandState::Unconfirmed);
    assert_eq!(entry.state, CommandState::Unconfirmed);
}

/// The replica-failure drill: replica 3 carried the storm (w0 over the bound, 120 req/s) when it was
/// killed. Its last frame must leave the merge at once, or the console shows a phantom OVER worker
/// and phantom rates for as long as it stays down, while the live replicas report an idle fleet;
/// the status line names the replica that fails.
#[test]
fn a_disconnected_replica_leaves_the_merge_and_the_status_line_names_it() {
    let mut s = three(|i, snap| {
        snap.policy.load_source = LoadSource::Local.into();
        for worker in &mut snap.workers {
            worker.active = u64::from(i == 2 && worker.name == "w0") * 9;
        }
        for key in &mut snap.keys {
            key.active.clear();
        }
        snap.totals.requests_per_s = if i == 2 { 120.0 } else { 0.0 };
        snap.totals.spills_per_s = if i == 2 { 30.0 } else { 0.0 };
    });
    assert_eq!(s.visible().over(), 1, "the storm, while replica 3 is up");
    let now = Instant::now();
    s.apply_replica_event(
        ReplicaId(2),
        common::reconnecting(
            now + Duration::from_secs(2),
            1,
            "Connection refused (os error 111)",
        ),
    );
    let fleet = s.visible();
    assert_eq!(
        fleet.workers[0].active, 0,
        "replica 3's requests left with it"
    );
    assert_eq!(fleet.over(), 0, "no phantom OVER worker");
    assert_eq!(fleet.totals.requests_per_s, 0.0, "no phantom req/s");
    assert_eq!(
        fleet.workers.len(),
        4,
        "the live replicas still describe the fleet"
    );
    let screen = render(&s, 80, 24, now);
    assert!(!screen.contains("OVER"), "{screen}");
    let status = screen.lines().nth(3).unwrap();
    assert!(
        status.contains("replica 3") && status.contains("Connection refused"),
        "the status line names the failing replica: {screen}"
    );
    // Back up: its next snapshot puts it in the merge again.
    s.apply_replica_event(ReplicaId(2), ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(ReplicaId(2), snapshot_with(|_| {}));
    assert_eq!(s.visible().workers[0].active, 2);
}

/// A frame tagged with a replica the console does not watch is a bug in the caller: it must not
/// land on another replica (the last one, as a clamped index would put it) under a wrong name.
#[test]
#[should_panic(expected = "replica 4 is not watched")]
fn a_frame_from_an_unwatched_replica_is_refused() {
    let mut s = three(|_, _| {});
    s.apply_replica_frame(ReplicaId(3), snapshot_with(|_| {}));
}

/// A killed replica that comes back reconnects first and sends its snapshot after: until that
/// snapshot, what it holds is still its last frame before it died (the storm it was in), which
/// must not rejoin the merge as a phantom OVER worker.
#[test]
fn a_reconnected_replica_rejoins_the_merge_with_its_new_snapshot_not_its_old_frame() {
    let mut s = three(|i, snap| {
        snap.policy.load_source = LoadSource::Local.into();
        for worker in &mut snap.workers {
            worker.active = u64::from(i == 2 && worker.name == "w0") * 9;
        }
        for key in &mut snap.keys {
            key.active.clear();
        }
    });
    assert_eq!(s.visible().over(), 1, "the storm, while replica 3 is up");
    let now = Instant::now();
    s.apply_replica_event(
        ReplicaId(2),
        common::reconnecting(
            now + Duration::from_secs(2),
            1,
            "Connection refused (os error 111)",
        ),
    );
    s.apply_replica_event(ReplicaId(2), ConnEvent::Status(ConnStatus::Connected));
    assert_eq!(
        s.visible().workers[0].active,
        0,
        "connected, no snapshot yet: its old frame stays out of the merge"
    );
    assert_eq!(s.visible().over(), 0, "no phantom OVER worker");
    let screen = render(&s, 80, 24, now);
    assert!(screen.contains("3 replicas, 2 merged"), "{screen}");
    s.apply_replica_frame(
        ReplicaId(2),
        snapshot_with(|snap| {
            for worker in &mut snap.workers {
                worker.active = 1;
            }
        }),
    );
    assert_eq!(
        s.visible().workers[0].active,
        1,
        "its new snapshot is merged"
    );
}

/// One replica reconnecting must not wipe a change the operator just sent to the others: it
/// vanished from the status line and its late answers were reported as stray errors.
#[test]
fn a_replica_reconnecting_keeps_a_change_still_pending_on_the_others() {
    let mut s = fleet_of_three();
    let Effect::Send(_) = s.apply_action(Action::GapUp) else {
        panic!("a set_policy for every replica")
    };
    s.apply_replica_event(
        ReplicaId(1),
        common::reconnecting(
            Instant::now() + Duration::from_secs(1),
            1,
            "connection reset",
        ),
    );
    s.apply_replica_event(ReplicaId(1), ConnEvent::Status(ConnStatus::Connected));
    let entry = s.last_command().expect("the change is still in the log");
    assert_eq!(
        entry.state,
        CommandState::Pending,
        "replicas 1 and 3 owe an answer"
    );
    s.apply_replica_frame(ReplicaId(0), ack(1, 1, 3));
    s.apply_replica_frame(ReplicaId(2), ack(1, 1, 3));
    let entry = s.last_command().unwrap();
    assert_eq!(entry.replies[0], CommandState::Applied);
    assert_eq!(entry.replies[2], CommandState::Applied);
    assert!(matches!(&entry.state, CommandState::Failed(m) if m.starts_with("replica 2:")));
    assert_eq!(s.notice(), None, "no stray error for the answers");
}

/// The replica rows are a table: with one replica counting down to a reconnect, its `gap` column
/// was pushed right of the others' (`RECONNECTING IN 1s gap 2` under `CONNECTED  gap 2`).
#[test]
fn the_replica_rows_keep_their_columns_while_one_reconnects() {
    let mut s = three(|i, snap| {
        if i == 2 {
            snap.policy.min_load_gap = 3;
        }
    });
    let now = Instant::now();
    s.apply_replica_event(
        ReplicaId(1),
        common::reconnecting(
            now + Duration::from_secs(1),
            1,
            "Connection refused (os error 111)",
        ),
    );
    for (width, height) in [(80, 24), (120, 40)] {
        let screen = render(&s, width, height, now);
        let columns: Vec<usize> = screen
            .lines()
            .filter(|l| l.contains(":9090/ws "))
            .map(|l| l.find("gap ").map(|i| l[..i].chars().count()).unwrap())
            .collect();
        assert_eq!(columns.len(), 3, "{screen}");
        // Aligned, yet whole: replica 3's flag still fits 80 columns (the URLs give way).
        assert!(screen.contains("DIFFERS"), "at {width}×{height}:\n{screen}");
        assert!(
            columns.iter().all(|c| *c == columns[0]),
            "at {width}×{height}, gap at columns {columns:?}:\n{screen}"
        );
    }
}

/// A replica whose host is gone (no refusal: every attempt runs into the 5 s connect timeout)
/// spends half its time connecting. The status line must keep naming it then, not go back to the
/// key hints as if the fleet were whole.
#[test]
fn a_replica_down_is_named_also_while_it_tries_again() {
    let mut s = fleet_of_three();
    let now = Instant::now();
    s.apply_replica_event(
        ReplicaId(2),
        common::reconnecting(
            now + Duration::from_secs(5),
            2,
            "connect timed out after 5s",
        ),
    );
    s.apply_replica_event(ReplicaId(2), ConnEvent::Status(ConnStatus::Connecting));
    let screen = render(&s, 120, 40, now);
    let status = screen.lines().nth(3).unwrap();
    assert!(
        status.contains("replica 3") && status.contains("connect timed out"),
        "the status line names the failing replica: {screen}"
    );
    // Connected again: nothing to say.
    s.apply_replica_event(ReplicaId(2), ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(ReplicaId(2), snapshot_with(|_| {}));
    let screen = render(&s, 120, 40, now);
    assert!(
        !screen.lines().nth(3).unwrap().contains("replica 3"),
        "{screen}"
    );
}
