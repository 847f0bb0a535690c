//! State transitions from recorded telemetry frames and operator actions.

mod common;

use bch_core::policy::{BoundCheck, PolicyKind};
use bch_core::telemetry::{ChangeSource, ClientCommand, CommandId, ServerMessage, SpillEvent};
use bch_tui::{
    Action, CommandState, ConnEvent, ConnStatus, Effect, FleetPicture, Panel, ReplicaId,
    SPILL_LOG_CAP, SortColumn, State,
};
use common::{connected_with, frame, frame_at, refusal};
use tokio::time::{Duration, Instant};

fn connected() -> State {
    let mut s = State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]);
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    assert_eq!(s.apply_replica_frame(ReplicaId(0), frame("snapshot")), None);
    s
}

fn worker<'a>(f: &'a FleetPicture, name: &str) -> &'a bch_core::telemetry::WorkerRecord {
    f.workers.iter().find(|w| w.name == name).unwrap()
}

#[test]
fn snapshot_replaces_everything() {
    let mut s = connected();
    let f = s.live();
    assert_eq!(f.workers.len(), 4);
    assert_eq!(f.keys.len(), 8);
    assert_eq!(f.spills.len(), 2);
    let policy = f.policy.unwrap();
    assert_eq!(policy.kind, PolicyKind::BoundedConsistentHashing);
    assert_eq!((policy.min_load_gap, policy.max_load_skew), (2, 1.5));
    let ring = f.ring.as_ref().unwrap();
    let total: f64 = ring.workers.iter().map(|w| w.share).sum();
    assert!((total - 1.0).abs() < 1e-4, "{total}");
    // Every position of the ring has an owner.
    for i in 0..1000 {
        assert!(f.owner_at(i as f64 / 1000.0).is_some(), "{i}");
    }

    // A second snapshot (e.g. after a resync) drops what the first one had.
    s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 1));
    let mut snap = frame_at("snapshot", 2);
    if let ServerMessage::Snapshot(ref mut body) = snap.message {
        body.keys.truncate(1);
        body.spills.clear();
    }
    s.apply_replica_frame(ReplicaId(0), snap);
    assert_eq!(s.live().keys.len(), 1);
    assert!(s.live().spills.is_empty());
    assert_eq!(worker(s.live(), "w0").active, 2);
    assert_eq!(
        s.live().history.len(),
        1,
        "sparkline history survives a snapshot"
    );
}

#[test]
fn tick_upserts_removes_and_appends() {
    let mut s = connected();
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame("tick_spill")),
        None
    );
    let f = s.live();
    assert_eq!(worker(f, "w0").active, 9);
    assert_eq!(
        worker(f, "w2").active,
        1,
        "workers absent from a tick keep their record"
    );
    let key = &f.keys["chat-session-0001"];
    assert_eq!((key.preferred.as_str(), key.current.as_str()), ("w0", "w1"));
    assert_eq!(f.spills.len(), 4);
    assert_eq!(f.spills.back().unwrap().ts_ms, 1_767_268_800_085);
    assert_eq!(f.totals.requests_per_s, 112.5);
    assert_eq!(f.history.len(), 1);

    s.apply_replica_frame(ReplicaId(0), frame("tick_unhealthy"));
    let f = s.live();
    assert!(!worker(f, "w2").healthy);
    assert!(!f.keys.contains_key("summarize-long-context-tenant-42"));
    assert_eq!(f.keys.len(), 7);
    assert_eq!(f.dropped_events, 2);
    assert_eq!(f.history.len(), 2);
}

#[test]
fn bound_uses_healthy_workers_only() {
    let mut s = connected();
    s.apply_replica_frame(ReplicaId(0), frame("tick_spill"));
    let b = s.live().bound().unwrap();
    // Loads [9, 3, 1, 1]: min 1, mean 3.5; gap 2 → 3; skew 1.5 → 5.25.
    assert_eq!(
        (b.load().min_load, b.load().healthy, b.gap_bound()),
        (1, 4, 3)
    );
    assert_eq!(b.skew_bound(), 5.25);
    assert!(b.check(9).should_spill());
    assert!(
        !b.check(5).should_spill(),
        "above min+gap but not above mean×skew"
    );
    s.apply_replica_frame(ReplicaId(0), frame("tick_unhealthy"));
    let b = s.live().bound().unwrap();
    // w2 is down: loads [9, 3, 1].
    assert_eq!((b.load().min_load, b.load().healthy), (1, 3));
    assert!((b.load().mean_load - 13.0 / 3.0).abs() < 1e-9);
}

#[test]
fn bound_agrees_with_the_spill_rule_on_the_fleet_loads() {
    for loads in [
        [0, 0, 0, 0],
        [3, 0, 0, 0],
        [2, 0, 0, 0],
        [9, 3, 1, 1],
        [5, 4, 4, 4],
        [7, 7, 7, 7],
    ] {
        for gap in 0..4 {
            for skew in [1.0, 1.25, 1.5, 2.0] {
                let s = connected_with(|snap| {
                    snap.policy.min_load_gap = gap;
                    snap.policy.max_load_skew = skew;
                    for (w, &load) in snap.workers.iter_mut().zip(&loads) {
                        w.active = load;
                        w.healthy = true;
                    }
                });
                let b = s.live().bound().unwrap();
                // min and mean worked out here, not by the code under test.
                let min = *loads.iter().min().unwrap();
                let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
                let check = BoundCheck {
                    preferred_load: loads[0],
                    min_load: min,
                    mean_load: mean,
                    min_load_gap: gap,
                    max_load_skew: skew,
                };
                let by_hand = loads[0] > min + gap && loads[0] as f64 > mean * skew;
                let over = b.check(loads[0]).should_spill();
                assert_eq!(over, check.should_spill(), "{loads:?} {gap} {skew}");
                assert_eq!(over, by_hand, "{loads:?} {gap} {skew}");
                assert_eq!(b.check(loads[0]), check, "{loads:?} {gap} {skew}");
            }
        }
    }
}

#[test]
fn ring_and_policy_frames_replace_their_part() {
    let mut s = connected();
    s.apply_replica_frame(ReplicaId(0), frame_at("ring", 1));
    assert_eq!(s.live().workers.len(), 5);
    assert_eq!(s.live().ring.as_ref().unwrap().workers.len(), 5);
    assert!(
        (0..1000).any(|i| s.live().owner_at(i as f64 / 1000.0) == Some(4)),
        "the new worker owns part of the ring"
    );
    assert_eq!(
        s.live().keys.len(),
        8,
        "a ring change keeps the tracked keys"
    );

    s.apply_replica_frame(ReplicaId(0), frame_at("policy", 2));
    assert_eq!(s.live().policy.unwrap().min_load_gap, 3);
    assert_eq!(s.live().policy_changed_by, Some(ChangeSource::Http.into()));
    assert!(!s.resyncing());
}

#[test]
fn seq_gap_sends_one_resync_until_the_next_snapshot() {
    let mut s = connected();
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 1)),
        None
    );
    // seq 2 was lost.
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("tick_unhealthy", 3)),
        Some(ClientCommand::Resync { id: None })
    );
    assert!(s.resyncing());
    // The gap is already being repaired: no second resync for the next jump.
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 9)),
        None
    );
    assert!(s.resyncing());
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("snapshot", 10)),
        None
    );
    assert!(!s.resyncing());
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 11)),
        None
    );
    assert!(!s.resyncing());
}

#[test]
fn a_snapshot_after_a_gap_needs_no_resync() {
    // The gateway follows a queue overflow with a fresh snapshot on its own.
    let mut s = connected();
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("snapshot", 5)),
        None
    );
    assert!(!s.resyncing());
}

#[test]
fn a_new_connection_restarts_seq() {
    let mut s = connected();
    s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 1));
    s.apply_replica_event(
        ReplicaId(0),
        common::reconnecting(
            Instant::now() + Duration::from_millis(250),
            1,
            "connection closed",
        ),
    );
    s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("snapshot", 0)),
        None
    );
    assert_eq!(
        s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 1)),
        None
    );
    assert!(!s.resyncing());
}

fn sent(effect: Effect) -> serde_json::Value {
    match effect {
        Effect::Send(cmd) => serde_json::to_value(cmd).unwrap(),
        other => panic!("expected a command, got {other:?}"),
    }
}

#[test]
fn gap_change_goes_pending_then_applied() {
    let mut s = connected();
    let json = sent(s.apply_action(Action::GapUp));
    assert_eq!(
        json,
        serde_json::json!({"type":"set_policy","id":1,"min_load_gap":3})
    );
    assert_eq!(s.last_command().unwrap().state, CommandState::Pending);
    assert_eq!(
        s.live().policy.unwrap().min_load_gap,
        2,
        "nothing changes before the ack"
    );

    s.apply_replica_frame(ReplicaId(0), frame_at("ack", 1));
    assert_eq!(s.last_command().unwrap().state, CommandState::Applied);
    assert_eq!(s.live().policy.unwrap().min_load_gap, 3);
}

#[test]
fn skew_below_one_is_sent_and_the_gateway_error_shown() {
    let mut s = connected_with(|snap| snap.policy.max_load_skew = 1.0);
    let json = sent(s.apply_action(Action::SkewDown));
    assert_eq!(
        json,
        serde_json::json!({"type":"set_policy","id":1,"max_load_skew":0.95})
    );
    s.apply_replica_frame(ReplicaId(0), refusal(1, 1));
    assert_eq!(
        s.last_command().unwrap().state,
        CommandState::Failed("max_load_skew must be a finite number >= 1.0, got 0.95".into())
    );
    // The next press starts from the policy in force again, not from the refused value, and gets
    // the next id.
    let json = sent(s.apply_action(Action::SkewDown));
    assert_eq!(
        json,
        serde_json::json!({"type":"set_policy","id":2,"max_load_skew":0.95})
    );
    s.apply_replica_frame(ReplicaId(0), frame_at("error_skew", 2));
    assert_eq!(
        s.last_command().unwrap().state,
        CommandState::Failed("max_load_skew must be a finite number >= 1.0, got 0.95".into())
    );
    assert_eq!(s.live().policy.unwrap().max_load_skew, 1.0);
}

#[test]
fn quick_presses_build_on_the_pending_value() {
    let mut s = connected();
    assert_eq!(sent(s.apply_action(Action::GapUp))["min_load_gap"], 3);
    assert_eq!(sent(s.apply_action(Action::GapUp))["min_load_gap"], 4);
    assert_eq!(sent(s.apply_action(Action::SkewUp))["max_load_skew"], 1.55);
    assert_eq!(sent(s.apply_action(Action::SkewUp))["max_load_skew"], 1.6);
    assert_eq!(sent(s.apply_action(Action::SkewUp))["max_load_skew"], 1.65);
    assert_eq!(s.commands().len(), 5);
}

#[test]
fn gap_cannot_go_below_zero() {
    let mut s = connected_with(|snap| snap.policy.min_load_gap = 0);
    assert_eq!(s.apply_action(Action::GapDown), Effect::None);
    assert!(s.notice().unwrap().contains("already 0"));
    assert_eq!(s.commands().len(), 0);
}

#[test]
fn no_threshold_change_before_the_policy_is_known() {
    let mut s = State::for_replicas(vec!["ws://x/ws".into()]);
    assert_eq!(s.apply_action(Action::GapUp), Effect::None);
    assert!(s.notice().is_some());
}

#[test]
fn pending_changes_fail_when_the_connection_drops_or_was_down() {
    let mut s = connected();
    let Effect::Send(cmd) = s.apply_action(Action::GapUp) else {
        panic!()
    };
    s.apply_replica_event(
        ReplicaId(0),
        common::reconnecting(Instant::now(), 1, "closed"),
    );
    assert!(
        matches!(s.last_command().unwrap().state, CommandState::Failed(ref m) if m.contains("connection lost"))
    );

    // An ack for it arriving later (cannot happen on a new connection, but must not resurrect it).
    s.apply_replica_event(ReplicaId(0), ConnEvent::NotSent(cmd));
    assert!(matches!(
        s.last_command().unwrap().state,
        CommandState::Failed(_)
    ));

    let Effect::Send(cmd) = s.apply_action(Action::SkewUp) else {
        panic!()
    };
    s.apply_replica_event(ReplicaId(0), ConnEvent::NotSent(cmd));
    assert_eq!(
        s.last_command().unwrap().state,
        CommandState::Failed("not sent: not connected".into())
    );
}

#[test]
fn an_error_without_our_id_becomes_a_notice() {
    let mut s = connected();
    let mut f = frame_at("error_skew", 1);
    if let ServerMessage::Error(ref mut e) = f.message {
        e.id = Some(CommandId::Number(99));
    }
    s.apply_replica_frame(ReplicaId(0), f);
    assert!(s.notice().unwrap().contains("max_load_skew"));
}

#[test]
fn pause_freezes_the_view_while_frames_keep_applying() {
    let mut s = connected();
    s.apply_action(Action::TogglePause);
    assert!(s.paused());
    s.apply_replica_frame(ReplicaId(0), frame_at("tick_spill", 1));
    assert_eq!(worker(s.live(), "w0").active, 9);
    assert_eq!(worker(s.visible(), "w0").active, 2);
    s.apply_action(Action::TogglePause);
    assert_eq!(worker(s.visible(), "w0").active, 9);
}

#[test]
fn spill_log_is_bounded_and_keeps_the_newest() {
    let mut s = connected();
    let template: SpillEvent = s.live().spills[0].clone();
    for seq in 1..=30u64 {
        let mut f = frame_at("tick_spill", seq);
        if let ServerMessage::Tick(ref mut t) = f.message {
            t.spills = (0..10)
                .map(|i| SpillEvent {
                    ts_ms: seq * 100 + i,
                    ..template.clone()
                })
                .collect();
        }
        s.apply_replica_frame(ReplicaId(0), f);
    }
    assert_eq!(s.live().spills.len(), SPILL_LOG_CAP);
    assert_eq!(s.live().spills.back().unwrap().ts_ms, 3009);
    assert_eq!(s.live().spills.front().unwrap().ts_ms, 1100);
}

#[test]
fn key_table_sorts_and_filters() {
    let mut s = connected();
    let labels = |s: &State| {
        s.key_rows()
            .iter()
            .map(|k| k.key.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(labels(&s)[0], "chat-session-0001", "most recent first");
    s.apply_action(Action::CycleSort);
    assert_eq!(s.ui().sort(), SortColumn::Key);
    assert_eq!(labels(&s)[0], "agent-7/code");
    s.apply_action(Action::CycleSort);
    s.apply_action(Action::CycleSort);
    assert_eq!(s.ui().sort(), SortColumn::Requests);
    assert_eq!(labels(&s)[0], "rag-docs-v2");

    s.apply_action(Action::StartFilter);
    for c in "AGENT".chars() {
        s.apply_action(Action::FilterChar(c));
    }
    assert_eq!(
        labels(&s),
        ["agent-7/plan", "agent-7/code"],
        "case-insensitive, live while typing"
    );
    s.apply_action(Action::FilterApply);
    assert!(!s.ui().filter_editing());
    assert_eq!(labels(&s).len(), 2);
    s.apply_action(Action::FilterClear);
    assert_eq!(labels(&s).len(), 8);
}

#[test]
fn scrolling_stays_within_the_focused_panel() {
    let mut s = connected();
    s.apply_action(Action::Scroll(10));
    assert_eq!(s.scroll(Panel::Workers), 3, "clamped to the last worker");
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::ScrollBottom);
    assert_eq!(s.scroll(Panel::Keys), 7);
    s.apply_action(Action::Scroll(-100));
    assert_eq!(s.scroll(Panel::Keys), 0);
    s.apply_action(Action::FocusPrev);
    assert_eq!(s.ui().focus(), Panel::Ring);
}

#[test]
fn scrolling_stops_at_the_last_full_page_once_the_viewport_is_known() {
    let mut s = connected();
    s.apply_action(Action::FocusNext);
    s.apply_action(Action::FocusNext);
    assert_eq!(s.ui().focus(), Panel::Keys);
    s.set_viewports(bch_tui::viewports(
        ratatui::layout::Rect::new(0, 0, 80, 24),
        &s,
    ));
    let shown = s.ui().viewport(Panel::Keys);
    assert!(shown > 0 && shown < 8, "{shown}");
    s.apply_action(Action::ScrollBottom);
    assert_eq!(s.scroll(Panel::Keys), 8 - shown);
    // The arrows move the key selection (the history pane's key): every press moves it, no
    // dead presses past the end, and the view follows once it leaves the page.
    s.apply_action(Action::Scroll(-1));
    assert_eq!(s.selected_key().unwrap().key, s.key_rows()[6].key);
    assert_eq!(s.scroll(Panel::Keys), 8 - shown, "still on the page");
    s.apply_action(Action::Scroll(-(shown as i32 - 1)));
    assert_eq!(s.scroll(Panel::Keys), 8 - shown - 1);
    let screen = common::render(&s, 80, 24, tokio::time::Instant::now());
    assert!(
        screen.contains(&format!("{}–{} of 8", 8 - shown, 7)),
        "{screen}"
    );
}
