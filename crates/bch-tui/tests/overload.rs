//! The console under overload: workers with a capacity, some of them FULL, the gateway's queue
//! non-empty and shedding, a capacity spill in the log; at the three sizes an operator meets, and
//! the state rules behind it (the capacity keys, the merge of several replicas).

mod common;

use bch_core::admission::AdmissionPatch;
use bch_core::policy::Branch;
use bch_core::telemetry::{
    AdmissionSummary, ClientCommand, ServerFrame, ServerMessage, ShedRates, SpillCause,
    WorkerRecord,
};
use bch_tui::{Action, ConnEvent, ConnStatus, Effect, ReplicaId, State};
use common::{realistic_frame, render};
use insta::assert_snapshot;
use tokio::time::Instant;

/// The cap every worker of the fixture fleet gets (its loads are 9, 3, 1 and 1).
const CAP: u64 = 3;

/// A gateway shedding `shed_per_s` with `waiting` requests queued.
fn summary(waiting: u64, shed_per_s: f64) -> AdmissionSummary {
    AdmissionSummary {
        waiting,
        admitted_per_s: 12.0,
        shed_per_s,
        shed_per_s_by_reason: ShedRates {
            queue_timeout: shed_per_s,
            ..ShedRates::default()
        },
        admitted_total: 900,
        shed_total: 140,
    }
}

/// `worker` with the fleet's cap, full when its load reached it (as the gateway computes it).
fn capped(worker: &mut WorkerRecord) {
    worker.capacity = Some(CAP);
    worker.full = worker.rule_load() >= CAP;
}

/// The recorded frame `name` as a gateway with a cap of [`CAP`] sends it; ticks carry `admission`,
/// and the storm tick's newest spill left a full worker.
fn overloaded(name: &str, seq: u64, admission: AdmissionSummary) -> ServerFrame {
    let mut frame = realistic_frame(name, seq);
    match frame.message {
        ServerMessage::Snapshot(ref mut snap) => {
            snap.policy.admission.max_in_flight_per_worker = CAP;
            snap.workers.iter_mut().for_each(capped);
            snap.admission = Some(admission);
        }
        ServerMessage::Tick(ref mut tick) => {
            tick.workers.iter_mut().for_each(capped);
            tick.admission = Some(admission);
            if let Some(last) = tick.spills.last().cloned() {
                let (branch, cause) = SpillCause::of(Branch::ExplicitRoutingKeyCapacitySpill);
                tick.spills.push(bch_core::telemetry::SpillEvent {
                    ts_ms: last.ts_ms + 10,
                    key: "tenant-acme/chat-session-7f3a9c21-0002".into(),
                    branch: branch.into(),
                    cause: cause.into(),
                    from: "10.244.2.5:8000".into(),
                    to: "10.244.3.121:8000".into(),
                    preferred_load: CAP,
                    ..last
                });
            }
        }
        _ => {}
    }
    frame
}

/// A console connected to `replicas` gateways, each with the overloaded snapshot and a few ticks
/// of a growing shed rate (so the sparkline has a shape).
fn watching_overload(replicas: usize) -> State {
    let urls = (0..replicas)
        .map(|i| format!("ws://10.96.0.{}:9090/ws", 21 + i))
        .collect();
    let mut s = State::for_replicas(urls);
    for i in 0..replicas {
        let replica = ReplicaId(i);
        s.apply_replica_event(replica, ConnEvent::Status(ConnStatus::Connected));
        s.apply_replica_frame(replica, overloaded("snapshot", 0, summary(0, 0.0)));
        for (seq, shed) in [0.0, 1.5, 4.0, 6.5].into_iter().enumerate() {
            let frame = overloaded("tick_spill", seq as u64 + 1, summary(6, shed));
            s.apply_replica_frame(replica, frame);
        }
    }
    s
}

#[test]
fn full_workers_and_a_waiting_queue_at_every_size() {
    let state = watching_overload(1);
    let now = Instant::now();
    for (width, height) in [(80, 24), (120, 40), (200, 50)] {
        let screen = render(&state, width, height, now);
        assert_eq!(screen.lines().count(), usize::from(height));
        assert!(screen.contains("FULL"), "{width}x{height}:\n{screen}");
        assert!(screen.contains("queue 6"), "{width}x{height}:\n{screen}");
        assert!(screen.contains('┃'), "the cap marker, {width}x{height}");
        assert_snapshot!(format!("overload_{width}x{height}"), screen);
    }
}

#[test]
fn the_capacity_keys_ask_for_the_cap_in_the_admission_object() {
    let mut s = watching_overload(1);
    let Effect::Send(ClientCommand::SetPolicy { admission, .. }) = s.apply_action(Action::CapUp)
    else {
        panic!("C sends a set_policy");
    };
    assert_eq!(
        admission,
        Some(AdmissionPatch {
            max_in_flight_per_worker: Some(CAP + 1),
            ..AdmissionPatch::default()
        })
    );
    // A second press before the answer steps from the pending value.
    let Effect::Send(ClientCommand::SetPolicy { admission, .. }) = s.apply_action(Action::CapUp)
    else {
        panic!("C sends a set_policy");
    };
    assert_eq!(admission.unwrap().max_in_flight_per_worker, Some(CAP + 2));
}

#[test]
fn from_no_cap_the_first_cap_is_the_busiest_load_and_c_at_zero_refuses() {
    let mut s = common::connected_with(|_| {});
    assert_eq!(s.apply_action(Action::CapDown), Effect::None);
    assert!(
        s.notice().unwrap().contains("already 0"),
        "{:?}",
        s.notice()
    );
    let busiest = s.live().workers.iter().map(|w| w.rule_load()).max();
    let Effect::Send(ClientCommand::SetPolicy { admission, .. }) = s.apply_action(Action::CapUp)
    else {
        panic!("C sends a set_policy");
    };
    assert_eq!(admission.unwrap().max_in_flight_per_worker, busiest);
}

#[test]
fn replicas_add_their_queues_and_sheds_and_share_the_capacity() {
    let s = watching_overload(3);
    let fleet = s.live();
    let admission = fleet.admission.expect("the merged summary");
    assert_eq!(admission.waiting, 18);
    assert_eq!(admission.shed_per_s, 3.0 * 6.5);
    assert_eq!(fleet.history.back().unwrap().shed_per_s, 3.0 * 6.5);
    for worker in &fleet.workers {
        assert_eq!(worker.capacity, Some(CAP), "{}", worker.name);
    }
    assert_eq!(fleet.full(), 2);
}
