//! The warnings pane: one sentence per problem, computed from the console state, shown in the `w`
//! panel and summed up in the header.

mod common;

use bch_core::telemetry::{
    AdmissionSummary, DiscoverySource, DiscoveryState, Open, ServerFrame, ServerMessage, Tick,
    Totals, WorkerState,
};
use bch_tui::{Action, ConnEvent, ReplicaId, Severity, State};
use common::{connected_with, reconnecting, render};
use tokio::time::{Duration, Instant};

fn sentences(state: &State, now: Instant) -> Vec<String> {
    state
        .warnings(now)
        .into_iter()
        .map(|w| w.sentence)
        .collect()
}

/// A tick at `seq`, `seq` seconds after the snapshot, with `spills_per_s` and `edit` applied.
fn tick(seq: u64, spills_per_s: f64, edit: impl FnOnce(&mut Tick)) -> ServerFrame {
    let mut tick = Tick {
        ts_ms: 1_767_268_800_000 + seq * 1000,
        workers: Vec::new(),
        keys: Vec::new(),
        removed_keys: Vec::new(),
        spills: Vec::new(),
        totals: Totals {
            spills_per_s,
            ..Totals::default()
        },
        dropped_events: 0,
        discovery: None,
        admission: None,
    };
    edit(&mut tick);
    ServerFrame::new(seq, ServerMessage::Tick(tick))
}

/// The recorded snapshot's record of worker `name`.
fn snapshot_worker(name: &str) -> bch_core::telemetry::WorkerRecord {
    let ServerMessage::Snapshot(snap) = common::message("snapshot") else {
        panic!("snapshot.json holds no snapshot");
    };
    snap.workers.into_iter().find(|w| w.name == name).unwrap()
}

#[test]
fn a_healthy_fleet_has_no_warning() {
    let s = connected_with(|_| {});
    assert_eq!(sentences(&s, Instant::now()), Vec::<String>::new());
}

#[test]
fn a_worker_failing_its_probes_says_the_last_probe_error() {
    let s = connected_with(|snap| {
        snap.workers[1].healthy = false;
        snap.workers[1].probe_failure = Some("refused".into());
    });
    let warnings = s.warnings(Instant::now());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].severity, Severity::Alert);
    assert_eq!(
        warnings[0].sentence,
        "worker w1 fails its health probes: refused"
    );
}

#[test]
fn a_stale_scrape_says_its_age() {
    let s = connected_with(|snap| {
        snap.workers[2].load_stale = true;
        snap.workers[2].scrape_age_ms = Some(42_000);
    });
    assert_eq!(
        sentences(&s, Instant::now()),
        [
            "worker w2's load scrape is stale (its last good scrape is 42.0s old): the rule reads this gateway's own load for it"
        ]
    );
}

#[test]
fn a_failing_or_empty_discovery_source_says_why() {
    let source = |name: &str, state: DiscoveryState, error: &str| DiscoverySource {
        name: name.into(),
        source: format!("dns:{name}"),
        kind: Open::Unknown("srv".into()),
        state: Open::Known(state),
        last_error: Some(error.into()),
        last_error_ms: None,
        last_good_ms: None,
        last_good_age_ms: None,
        workers: 3,
    };
    let s = connected_with(|snap| {
        snap.discovery = vec![
            source("_a._tcp", DiscoveryState::Failing, "timeout"),
            source("_b._tcp", DiscoveryState::Empty, "NXDOMAIN"),
            source("_c._tcp", DiscoveryState::Ok, "old"),
        ];
    });
    assert_eq!(
        sentences(&s, Instant::now()),
        [
            "discovery of _a._tcp fails (timeout): its last good 3 worker(s) are kept",
            "discovery of _b._tcp found no worker (NXDOMAIN)",
        ]
    );
}

/// Watching several replicas, the warnings pane read the merged fleet, which had no discovery
/// sources: a failing resolver was on the workers panel's border and never in the pane.
#[test]
fn a_failing_discovery_source_is_said_with_several_replicas() {
    let urls = ["ws://a/ws", "ws://b/ws"];
    let mut s = State::for_replicas(urls.iter().map(|u| u.to_string()).collect());
    for i in 0..2 {
        s.apply_replica_event(
            ReplicaId(i),
            ConnEvent::Status(bch_tui::ConnStatus::Connected),
        );
        let frame = common::snapshot_with(|snap| {
            snap.discovery = vec![DiscoverySource {
                name: "_a._tcp".into(),
                source: "dns:_a._tcp".into(),
                kind: Open::Unknown("srv".into()),
                state: Open::Known(DiscoveryState::Failing),
                last_error: Some("timeout".into()),
                last_error_ms: None,
                last_good_ms: None,
                last_good_age_ms: None,
                workers: 3,
            }];
        });
        s.apply_replica_frame(ReplicaId(i), frame);
    }
    assert_eq!(
        sentences(&s, Instant::now()),
        ["discovery of _a._tcp fails (timeout): its last good 3 worker(s) are kept"],
        "once, though both replicas report it"
    );
}

#[test]
fn a_disconnected_replica_says_why() {
    let mut s = connected_with(|_| {});
    let now = Instant::now();
    s.apply_replica_event(
        ReplicaId(0),
        reconnecting(now + Duration::from_secs(1), 2, "Connection refused"),
    );
    assert_eq!(
        sentences(&s, now),
        ["replica ws://127.0.0.1:9090/ws is disconnected: attempt 2 failed: Connection refused"]
    );
}

#[test]
fn replicas_with_different_thresholds_are_named() {
    let urls = ["ws://a/ws", "ws://b/ws", "ws://c/ws"];
    let mut s = State::for_replicas(urls.iter().map(|u| u.to_string()).collect());
    for i in 0..3 {
        s.apply_replica_event(
            ReplicaId(i),
            ConnEvent::Status(bch_tui::ConnStatus::Connected),
        );
        let gap = if i == 2 { 7 } else { 2 };
        let frame = common::snapshot_with(|snap| snap.policy.min_load_gap = gap);
        s.apply_replica_frame(ReplicaId(i), frame);
    }
    assert_eq!(
        sentences(&s, Instant::now()),
        [
            "replica ws://c/ws has thresholds unlike the other replicas: they route the same key differently"
        ]
    );
}

#[test]
fn a_long_drain_is_reported_after_the_chosen_minutes() {
    let mut s = connected_with(|_| {});
    s.set_drain_warning(Duration::from_secs(60));
    let start = Instant::now();
    let draining = |seq| {
        tick(seq, 0.0, |t| {
            let mut w = snapshot_worker("w3");
            w.state = Open::Known(WorkerState::Draining);
            w.active = 4;
            t.workers.push(w);
        })
    };
    s.frame_received_on(ReplicaId(0), start);
    s.apply_replica_frame(ReplicaId(0), draining(1));
    s.frame_received_on(ReplicaId(0), start + Duration::from_secs(1));
    s.apply_replica_frame(ReplicaId(0), draining(2));
    // Frames keep coming (the replica is not silent); the drain goes on.
    let later = start + Duration::from_secs(59);
    s.frame_received_on(ReplicaId(0), later);
    assert_eq!(sentences(&s, later), Vec::<String>::new(), "59 s: not yet");
    let later = start + Duration::from_secs(122);
    s.frame_received_on(ReplicaId(0), later);
    assert_eq!(
        sentences(&s, later),
        ["worker w3 has been draining for 2 min: 4 request(s) still in flight"]
    );
}

#[test]
fn a_full_worker_and_a_shedding_gateway_are_reported() {
    let s = connected_with(|snap| {
        snap.workers[0].full = true;
        snap.workers[0].capacity = Some(8);
        snap.admission = Some(AdmissionSummary {
            waiting: 5,
            shed_per_s: 2.5,
            ..AdmissionSummary::default()
        });
    });
    let warnings = s.warnings(Instant::now());
    let got: Vec<(Severity, &str)> = warnings
        .iter()
        .map(|w| (w.severity, w.sentence.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (
                Severity::Alert,
                "the gateway sheds 2.5 req/s: every candidate worker is full (0.0/s with no queue, 0.0/s queue full, 5 waiting)"
            ),
            (
                Severity::Warning,
                "worker w0 is full (at its capacity of 8): it takes no new request"
            ),
        ],
        "alerts first"
    );
}

#[test]
fn a_spill_surge_needs_three_times_the_rate_before_and_the_floor() {
    let mut s = connected_with(|_| {});
    let mut seq = 0;
    let mut feed = |s: &mut State, rate: f64, n: usize| {
        for _ in 0..n {
            seq += 1;
            s.apply_replica_frame(ReplicaId(0), tick(seq, rate, |_| {}));
        }
    };
    // A steady 2 spills/s, then 5/s for 10 s: less than three times as many, no surge.
    feed(&mut s, 2.0, 60);
    feed(&mut s, 5.0, 10);
    assert_eq!(sentences(&s, Instant::now()), Vec::<String>::new());
    // 0.1/s then 0.5/s: five times as many, yet under the floor of 1 spill/s.
    let mut quiet = connected_with(|_| {});
    feed(&mut quiet, 0.1, 60);
    feed(&mut quiet, 0.5, 10);
    assert_eq!(sentences(&quiet, Instant::now()), Vec::<String>::new());
    // 2/s then 8/s: a surge.
    feed(&mut s, 2.0, 60);
    feed(&mut s, 8.0, 10);
    assert_eq!(
        sentences(&s, Instant::now()),
        [
            "spill surge: 8.0 spills/s over the last 10s against 2.0/s before: keys are leaving their home workers"
        ]
    );
}

#[test]
fn the_pane_opens_with_w_and_the_header_sums_up_while_closed() {
    let mut s = connected_with(|snap| {
        snap.workers[1].healthy = false;
        snap.workers[1].probe_failure = Some("tls: certificate not trusted".into());
        snap.workers[2].full = true;
    });
    let now = Instant::now();
    let closed = render(&s, 80, 24, now);
    assert!(
        closed.contains("✗ 2 warnings (w): worker w1 fails its health probes: tls: certif"),
        "{closed}"
    );
    s.apply_action(Action::ToggleWarnings);
    let open = render(&s, 120, 40, now);
    assert!(open.contains("Warnings (2) · w closes"), "{open}");
    assert!(
        open.contains("✗ worker w1 fails its health probes: tls: certificate not trusted"),
        "{open}"
    );
    assert!(
        open.contains(
            "! worker w2 is full (its engine reported saturation): it takes no new request"
        ),
        "{open}"
    );
    s.apply_action(Action::ToggleWarnings);
    assert_eq!(render(&s, 80, 24, now), closed);
}

/// The pane open and the summary closed, at the three sizes the console is checked at, with an
/// alert and a warning of each source the fixture can carry.
#[test]
fn warnings_screens_at_every_size() {
    let mut s = connected_with(|snap| {
        snap.workers[1].healthy = false;
        snap.workers[1].probe_failure = Some("timeout".into());
        snap.workers[2].load_stale = true;
        snap.workers[2].scrape_age_ms = Some(31_500);
        snap.workers[3].full = true;
        snap.workers[3].capacity = Some(4);
    });
    // Fixed times: the replica's last frame and the render time, so no age depends on the clock.
    let now = Instant::now();
    s.frame_received_on(ReplicaId(0), now);
    for (width, height) in [(80, 24), (120, 40), (200, 50)] {
        insta::assert_snapshot!(
            format!("warnings_closed_{width}x{height}"),
            render(&s, width, height, now)
        );
    }
    s.apply_action(Action::ToggleWarnings);
    for (width, height) in [(80, 24), (120, 40), (200, 50)] {
        insta::assert_snapshot!(
            format!("warnings_open_{width}x{height}"),
            render(&s, width, height, now)
        );
    }
}
