//! Every screen at the three sizes an operator meets (80×24, a 120×40 laptop terminal, 200×50),
//! from the recorded frames with realistic names: IP:PORT workers, tenant-prefixed keys and a key
//! in flight on three workers. Items are cut whole (a `worker:n` pair, a name keeping its port, a
//! key keeping both ends), never mid-word by the table. Time is passed in, so every run draws the
//! same screens.

mod common;

use bch_core::telemetry::ServerMessage;
use bch_tui::{Action, ConnEvent, ConnStatus, ReplicaId, State};
use common::{realistic_frame, render};
use insta::assert_snapshot;
use tokio::time::{Duration, Instant};

const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (200, 50)];

const URLS: [&str; 3] = [
    "ws://10.96.0.21:9090/ws",
    "ws://10.96.0.22:9090/ws",
    "ws://10.96.0.23:9090/ws",
];

/// The tick with the storm on `tenant-acme/chat-session-7f3a9c21-0001`, which is also in flight
/// on a third worker.
fn storm_tick(seq: u64) -> bch_core::telemetry::ServerFrame {
    let mut tick = realistic_frame("tick_spill", seq);
    if let ServerMessage::Tick(ref mut t) = tick.message {
        for key in &mut t.keys {
            key.active.insert("10.244.3.121:8000".into(), 1);
        }
    }
    tick
}

/// A console watching `urls`, every replica connected and sent the snapshot and the storm tick.
fn watching(urls: &[&str]) -> State {
    let mut s = State::for_replicas(urls.iter().map(|u| (*u).to_owned()).collect());
    for i in 0..urls.len() {
        s.apply_replica_event(ReplicaId(i), ConnEvent::Status(ConnStatus::Connected));
        s.apply_replica_frame(ReplicaId(i), realistic_frame("snapshot", 0));
        s.apply_replica_frame(ReplicaId(i), storm_tick(1));
    }
    s
}

fn one_replica() -> State {
    watching(&URLS[..1])
}

fn down(s: &mut State, replica: usize, now: Instant) {
    s.apply_replica_event(
        ReplicaId(replica),
        ConnEvent::Status(ConnStatus::Reconnecting {
            retry_at: now + Duration::from_millis(2_000),
            attempt: 3,
            reason: "Connection refused (os error 111)".into(),
        }),
    );
}

/// Snapshots `state` at every size as `NAME_WxH`.
fn at_every_size(name: &str, state: &State, now: Instant) {
    for (width, height) in SIZES {
        let screen = render(state, width, height, now);
        assert_eq!(screen.lines().count(), usize::from(height));
        assert_snapshot!(format!("{name}_{width}x{height}"), screen);
    }
}

#[test]
fn one_replica_spilling() {
    at_every_size("one_replica_spilling", &one_replica(), Instant::now());
}

#[test]
fn one_replica_reconnecting() {
    let now = Instant::now();
    let mut s = one_replica();
    down(&mut s, 0, now);
    at_every_size("one_replica_reconnecting", &s, now);
}

#[test]
fn waiting_for_the_first_connection() {
    let s = State::for_replicas(vec![URLS[0].to_owned()]);
    at_every_size("waiting", &s, Instant::now());
}

#[test]
fn three_replicas() {
    at_every_size("three_replicas", &watching(&URLS), Instant::now());
}

#[test]
fn one_of_three_replicas_down() {
    let now = Instant::now();
    let mut s = watching(&URLS);
    down(&mut s, 1, now);
    at_every_size("one_of_three_down", &s, now);
}

#[test]
fn help_open() {
    let mut s = one_replica();
    s.apply_action(Action::ToggleHelp);
    at_every_size("help_open", &s, Instant::now());
}

#[test]
fn filter_typed() {
    let mut s = one_replica();
    s.apply_action(Action::StartFilter);
    for c in "acme".chars() {
        s.apply_action(Action::FilterChar(c));
    }
    at_every_size("filter_typed", &s, Instant::now());
}

/// The status line with several changes in flight, then the newest one unanswered past the
/// timeout on one of three replicas.
#[test]
fn changes_pending_and_unconfirmed() {
    let now = Instant::now();
    let mut s = watching(&URLS);
    s.apply_action(Action::GapUp);
    s.apply_action(Action::GapUp);
    s.expire_commands(now);
    at_every_size("changes_pending", &s, now);
    let ack = |id: u64, gap: u64| {
        let mut f = realistic_frame("ack", 1 + id);
        if let ServerMessage::Ack(ref mut a) = f.message {
            a.id = Some(bch_core::telemetry::CommandId::Number(id));
            a.policy.min_load_gap = gap;
        }
        f
    };
    for replica in [0, 2] {
        s.apply_replica_frame(ReplicaId(replica), ack(1, 3));
        s.apply_replica_frame(ReplicaId(replica), ack(2, 4));
    }
    s.expire_commands(now + bch_tui::COMMAND_TIMEOUT);
    at_every_size("change_unconfirmed", &s, now + bch_tui::COMMAND_TIMEOUT);
}

/// At 120 columns, the width where the key table shares the screen with the spill log, every item
/// in the key table is whole: names keep their port, in-flight pairs are whole or summed as `+N`,
/// keys are cut with an ellipsis that keeps both ends.
#[test]
fn at_120_columns_the_key_table_cuts_whole_items() {
    let screen = render(&one_replica(), 120, 40, Instant::now());
    let row = screen
        .lines()
        .find(|l| l.contains('↷'))
        .unwrap_or_else(|| panic!("no row of the storm key:\n{screen}"));
    let keys_half: String = row.chars().take(60).collect();
    assert!(
        keys_half.starts_with("│ten") && keys_half.contains("…001 "),
        "the key is cut in the middle with a mark, both ends kept: {keys_half}"
    );
    assert!(
        keys_half.contains("1.17:8000 ↷ ") && keys_half.contains(".2.5:8000 "),
        "both placement names keep their port: {keys_half}"
    );
    assert!(
        keys_half.contains(" 11 on 3 "),
        "no pair fits whole, so the column sums them: {keys_half}"
    );
    assert!(
        keys_half.trim_end_matches('│').ends_with("51      2  96%"),
        "the numbers are whole: {keys_half}"
    );
    // Where one pair fits, it is whole and the rest is summed.
    let screen = render(&one_replica(), 80, 24, Instant::now());
    let row = screen.lines().find(|l| l.contains('↷')).unwrap();
    assert!(row.contains(":8000:8 +3 "), "{row}");
    // The spill log keeps every number of the rule and the ports of both workers.
    let screen = render(&one_replica(), 120, 40, Instant::now());
    let spill = screen
        .lines()
        .find(|l| l.contains("12:00:00 ") && l.contains("9>2+2"))
        .unwrap_or_else(|| panic!("{screen}"));
    assert!(spill.contains(":8000→"), "{spill}");
    assert!(
        spill.trim_end_matches('│').ends_with("9>3.50×1.50"),
        "{spill}"
    );
}
