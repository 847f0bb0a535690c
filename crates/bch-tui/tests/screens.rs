//! Whole-screen snapshots from recorded telemetry, at the smallest supported terminal (80×24) and a
//! large one (160×48). Time is passed in, so the screens are the same on every run.

#[path = "common_fleet/big_fleet.rs"]
mod big_fleet;
mod common;

use bch_core::telemetry::{ServerMessage, WorkerSource};
use bch_tui::{Action, ConnEvent, ConnStatus, ReplicaId, State};
use big_fleet::big;
use common::{connected_with, frame, frame_at, refusal, render};
use insta::assert_snapshot;
use tokio::time::{Duration, Instant};

fn connected() -> State {
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(ReplicaId(0), frame("snapshot"));
    s
}

fn spilling() -> State {
    let mut s = connected();
    s.apply_replica_frame(ReplicaId(0), frame("tick_spill"));
    s
}

fn unhealthy() -> State {
    let mut s = spilling();
    s.apply_replica_frame(ReplicaId(0), frame("tick_unhealthy"));
    s
}

#[test]
fn connected_80x24() {
    assert_snapshot!(render(&connected(), 80, 24, Instant::now()));
}

#[test]
fn connected_160x48() {
    assert_snapshot!(render(&connected(), 160, 48, Instant::now()));
}

#[test]
fn waiting_for_first_connection_80x24() {
    let s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    assert_snapshot!(render(&s, 80, 24, Instant::now()));
}

#[test]
fn spill_happening_80x24() {
    assert_snapshot!(render(&spilling(), 80, 24, Instant::now()));
}

/// At 120 columns a 32-character key puts the key table above the spill log, so the log has the
/// full width and writes every spill in full, with the whole key (the compact form, which keeps
/// every number of the rule, is pinned with IP:PORT names in `screen_sizes`).
#[test]
fn spill_happening_120x40() {
    let screen = render(&spilling(), 120, 40, Instant::now());
    assert!(
        screen.contains(" chat-session-0001 w0 → w1 pref 9 min 2 mean 3.50 gap 2 skew 1.50"),
        "{screen}"
    );
    assert_snapshot!(screen);
}

#[test]
fn spill_happening_160x48() {
    assert_snapshot!(render(&spilling(), 160, 48, Instant::now()));
}

/// Workers found by DNS discovery: the title counts them by source and wide rows name each
/// worker's source.
#[test]
fn discovered_workers_160x48() {
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    let mut snapshot = frame("snapshot");
    let ServerMessage::Snapshot(ref mut body) = snapshot.message else {
        panic!("the snapshot fixture is a snapshot");
    };
    for worker in body.workers.iter_mut().skip(1) {
        worker.source = WorkerSource::Dns("_http._tcp.llm.default.svc.cluster.local".into()).into();
    }
    s.apply_replica_frame(ReplicaId(0), snapshot);
    let screen = render(&s, 160, 48, Instant::now());
    assert!(screen.contains("discovered, 1 static"), "{screen}");
    // At 160 columns every counter comes first; the source is cut to what the bar leaves.
    assert!(screen.contains("dns:_http…er.local"), "{screen}");
    assert_snapshot!(screen);
}

/// The unhealthy fleet with `w2`'s probes failing TLS verification, as the gateway reports it.
fn tls_failing() -> State {
    let mut s = spilling();
    let mut tick = frame("tick_unhealthy");
    let ServerMessage::Tick(ref mut t) = tick.message else {
        panic!("tick_unhealthy.json holds a {:?}", tick.message);
    };
    t.workers[0].probe_failure = Some("tls: certificate not trusted (UnknownIssuer)".into());
    s.apply_replica_frame(ReplicaId(0), tick);
    s
}

#[test]
fn tls_probe_failure_80x24() {
    let screen = render(&tls_failing(), 80, 24, Instant::now());
    assert!(screen.contains("DOWN"), "{screen}");
    assert!(screen.contains("tls: certific…"), "{screen}");
    assert_snapshot!(screen);
}

#[test]
fn tls_probe_failure_120x40() {
    let screen = render(&tls_failing(), 120, 40, Instant::now());
    assert!(screen.contains("tls: certificate not…"), "{screen}");
    assert_snapshot!(screen);
}

#[test]
fn unhealthy_worker_80x24() {
    assert_snapshot!(render(&unhealthy(), 80, 24, Instant::now()));
}

#[test]
fn unhealthy_worker_160x48() {
    assert_snapshot!(render(&unhealthy(), 160, 48, Instant::now()));
}

#[test]
fn reconnecting_counts_down_80x24() {
    let mut s = unhealthy();
    let now = Instant::now();
    s.apply_replica_event(
        ReplicaId(0),
        common::reconnecting(
            now + Duration::from_millis(4_000),
            5,
            "Connection refused (os error 111)",
        ),
    );
    let screen = render(&s, 80, 24, now);
    assert!(screen.contains("RECONNECTING IN 4s"), "{screen}");
    let later = render(&s, 80, 24, now + Duration::from_millis(2_500));
    assert!(later.contains("RECONNECTING IN 2s"), "{later}");
    assert_snapshot!(screen);
}

#[test]
fn reconnecting_160x48() {
    let mut s = unhealthy();
    let now = Instant::now();
    s.apply_replica_event(
        ReplicaId(0),
        common::reconnecting(
            now + Duration::from_millis(1_500),
            2,
            "gateway closed the connection",
        ),
    );
    assert_snapshot!(render(&s, 160, 48, now));
}

#[test]
fn help_open_80x24() {
    let mut s = spilling();
    s.apply_action(Action::ToggleHelp);
    assert_snapshot!(render(&s, 80, 24, Instant::now()));
}

#[test]
fn filter_typing_80x24() {
    let mut s = spilling();
    s.apply_action(Action::StartFilter);
    for c in "chat".chars() {
        s.apply_action(Action::FilterChar(c));
    }
    assert_snapshot!(render(&s, 80, 24, Instant::now()));
}

#[test]
fn filter_applied_sorted_160x48() {
    let mut s = unhealthy();
    s.apply_action(Action::StartFilter);
    for c in "agent".chars() {
        s.apply_action(Action::FilterChar(c));
    }
    s.apply_action(Action::FilterApply);
    s.apply_action(Action::CycleSort);
    assert_snapshot!(render(&s, 160, 48, Instant::now()));
}

#[test]
fn threshold_change_pending_80x24() {
    let mut s = connected();
    s.apply_action(Action::GapUp);
    assert_snapshot!(render(&s, 80, 24, Instant::now()));
}

#[test]
fn threshold_change_applied_80x24() {
    let mut s = connected();
    s.apply_action(Action::GapUp);
    s.apply_replica_frame(ReplicaId(0), frame_at("ack", 1));
    let screen = render(&s, 80, 24, Instant::now());
    assert!(screen.contains("gap 3"), "{screen}");
    assert_snapshot!(screen);
}

#[test]
fn threshold_change_refused_80x24() {
    let mut s = connected_with(|snap| snap.policy.max_load_skew = 1.0);
    // Refused twice: the status line shows the newest, #2.
    s.apply_action(Action::SkewDown);
    s.apply_replica_frame(ReplicaId(0), refusal(1, 1));
    s.apply_action(Action::SkewDown);
    s.apply_replica_frame(ReplicaId(0), refusal(2, 2));
    assert_snapshot!(render(&s, 80, 24, Instant::now()));
}

#[test]
fn paused_with_resync_pending_160x48() {
    let mut s = spilling();
    s.apply_action(Action::TogglePause);
    // seq 2 lost: the live state resyncs underneath while the view stays frozen.
    s.apply_replica_frame(ReplicaId(0), frame_at("tick_unhealthy", 3));
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::FocusNext);
    assert_snapshot!(render(&s, 160, 48, Instant::now()));
}

#[test]
fn sixty_four_workers_160x48() {
    assert_snapshot!(render(&big(), 160, 48, Instant::now()));
}

#[test]
fn sixty_four_workers_scrolled_80x24() {
    let mut s = big();
    s.apply_action(Action::Scroll(2));
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::Scroll(10));
    assert_snapshot!(render(&s, 80, 24, Instant::now()));
}

/// Drawing 64 workers and 256 keys works at every size, down to 80×24, and shows what matters:
/// the OVER worker in the title even when its row is off screen.
#[test]
fn drawing_a_big_fleet_fits_every_size() {
    let s = big();
    for (width, height) in [(80, 24), (120, 40), (160, 48), (240, 60)] {
        let screen = render(&s, width, height, Instant::now());
        let workers_title = screen.lines().nth(4).unwrap();
        assert!(
            workers_title.contains("1 OVER"),
            "{width}x{height}:\n{screen}"
        );
        assert_eq!(screen.lines().count(), usize::from(height));
    }
}

#[test]
fn url_named_workers_stay_distinguishable_80x24() {
    // gatewayd names a worker after its URL when the config gives no name; the port is what differs.
    let mut f = frame("snapshot");
    if let ServerMessage::Snapshot(ref mut snap) = f.message {
        for (i, w) in snap.workers.iter_mut().enumerate() {
            w.name = format!("node.cluster.internal:1810{i}");
        }
        for (i, share) in snap
            .ring
            .iter_mut()
            .flat_map(|r| &mut r.workers)
            .enumerate()
        {
            share.name = format!("node.cluster.internal:1810{i}");
        }
    }
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    s.apply_replica_frame(ReplicaId(0), f);
    let screen = render(&s, 80, 24, Instant::now());
    let workers_panel: String = screen
        .lines()
        .skip(6)
        .take(4)
        .collect::<Vec<_>>()
        .join("\n");
    for port in ["18100", "18101", "18102", "18103"] {
        assert!(workers_panel.contains(port), "{port} missing:\n{screen}");
    }
}

#[test]
fn a_policy_change_names_who_made_it() {
    let mut s = connected();
    s.apply_replica_frame(ReplicaId(0), frame_at("policy", 1));
    let screen = render(&s, 160, 48, Instant::now());
    let policy_line = screen.lines().nth(1).unwrap();
    assert!(policy_line.contains("gap 3"), "{screen}");
    assert!(
        policy_line.ends_with("(changed by http, lost on reload)"),
        "a runtime change says it does not survive a reload: {screen}"
    );
}
