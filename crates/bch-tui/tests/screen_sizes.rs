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
        common::reconnecting(
            now + Duration::from_millis(2_000),
            3,
            "Connection refused (os error 111)",
        ),
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

/// At 120 columns the key table sits above the spill log, not beside it: side by side, IP:PORT
/// names and tenant keys got half the width and were cut to stubs (`ten…001`, `….2.5:8000`).
/// Every item in the key table is whole or cut whole: names keep their port, in-flight pairs are
/// whole or summed as `+N`, keys are cut with an ellipsis that keeps both ends.
#[test]
fn at_120_columns_the_key_table_cuts_whole_items() {
    let screen = render(&one_replica(), 120, 40, Instant::now());
    let row = screen
        .lines()
        .find(|l| l.contains('↷'))
        .unwrap_or_else(|| panic!("no row of the storm key:\n{screen}"));
    assert!(
        row.starts_with("│tenant-acme/chat-session-7f3a9c21-0001 "),
        "the key is whole: {row}"
    );
    assert!(
        row.contains(" 10.244.1.17:8000  ↷ 10.244.2.5:8000 "),
        "both placement names are whole: {row}"
    );
    assert!(
        row.contains(" 10.244.1.17:8000:8 +3 "),
        "one whole pair, the rest summed: {row}"
    );
    assert!(
        row.trim_end_matches('│')
            .trim_end()
            .ends_with("51      2  96%"),
        "the numbers are whole: {row}"
    );
    // At 80 columns the key keeps a readable part and names their ports; the pairs are summed.
    let screen = render(&one_replica(), 80, 24, Instant::now());
    let row = screen.lines().find(|l| l.contains('↷')).unwrap();
    assert!(row.starts_with("│tenant-acme/"), "{row}");
    assert!(
        row.contains("1.17:8000 ↷ ") && row.contains(" 11 on 3 "),
        "{row}"
    );
    // The spill log keeps every number of the rule and the ports of both workers.
    let screen = render(&one_replica(), 120, 40, Instant::now());
    let spill = screen
        .lines()
        .find(|l| l.contains("12:00:00 ") && l.contains("9>2+2"))
        .unwrap_or_else(|| panic!("{screen}"));
    assert!(spill.contains(":8000→"), "{spill}");
    assert!(
        spill
            .trim_end_matches('│')
            .trim_end()
            .ends_with("9>3.50×1.50"),
        "{spill}"
    );
}

/// The rows of the panel titled `title`: the lines below its title up to its bottom border, each
/// cut to the panel's columns.
fn panel_rows(screen: &str, title: &str) -> Vec<String> {
    let lines: Vec<&str> = screen.lines().collect();
    let top = lines
        .iter()
        .position(|l| l.contains(title))
        .unwrap_or_else(|| panic!("no panel {title:?}:\n{screen}"));
    // The title follows the corner and a space; the panel ends at the next corner.
    let at = lines[top].find(title).unwrap_or(0);
    let left = lines[top][..at].chars().count().saturating_sub(2);
    let width = lines[top]
        .chars()
        .skip(left + 1)
        .position(|c| c == '┐' || c == '╗')
        .map_or(usize::MAX, |p| p + 2);
    let mut rows = Vec::new();
    for line in &lines[top + 1..] {
        let part: String = line.chars().skip(left).take(width).collect();
        if part.starts_with('└') || part.starts_with('╚') {
            break;
        }
        rows.push(part);
    }
    rows
}

/// Whether one of `rows` shows `name` as a whole word.
fn shows_name(rows: &[String], name: &str) -> bool {
    rows.iter().any(|r| {
        r.split(|c: char| c.is_whitespace() || "▸║│".contains(c))
            .any(|word| word == name)
    })
}

/// Whether `cell` shows `key` whole, or cut once in the middle keeping at least `kept` of it.
fn shows_key(cell: &str, key: &str, kept: usize) -> bool {
    if cell == key {
        return true;
    }
    let Some((head, tail)) = cell.split_once('…') else {
        return false;
    };
    !tail.contains('…')
        && head.chars().count() + tail.chars().count() >= kept
        && key.starts_with(head)
        && key.ends_with(tail)
}

/// What an operator needs to read at 120×40 and more, with IP:PORT workers and tenant keys: every
/// worker name whole in the workers and ring panels and in the key table's placement, every key
/// whole or cut once in its middle keeping at least 24 characters; at 200×50 every key and every
/// in-flight pair whole.
#[test]
fn names_and_keys_keep_their_width_from_120_columns() {
    for (state, width, height) in [
        (one_replica(), 120, 40),
        (watching(&URLS), 120, 40),
        (one_replica(), 200, 50),
        (watching(&URLS), 200, 50),
    ] {
        let screen = render(&state, width, height, Instant::now());
        let fleet = state.visible();
        let workers = panel_rows(&screen, "Workers ");
        let ring = panel_rows(&screen, "Ring ");
        for w in &fleet.workers {
            assert!(
                shows_name(&workers, &w.name),
                "{} not whole in the workers panel at {width}:\n{screen}",
                w.name
            );
            assert!(
                shows_name(&ring, &w.name),
                "{} not whole in the ring panel at {width}:\n{screen}",
                w.name
            );
        }
        let keys = panel_rows(&screen, "Keys ");
        let kept = if width >= 200 { usize::MAX } else { 24 };
        for k in fleet.keys.values() {
            let row = keys
                .iter()
                .find(|r| {
                    let cell: String = r.chars().skip(1).take_while(|c| *c != ' ').collect();
                    shows_key(&cell, &k.key, kept.min(k.key.chars().count()))
                })
                .unwrap_or_else(|| panic!("{} not readable at {width}:\n{screen}", k.key));
            let arrow = if k.preferred == k.current {
                '→'
            } else {
                '↷'
            };
            let placement = format!(" {} ", k.preferred);
            assert!(
                row.contains(&placement) && row.contains(&format!("{arrow} {} ", k.current)),
                "placement names cut at {width}: {row}"
            );
            if width >= 200 {
                for (worker, n) in &k.active {
                    let pair = format!("{worker}:{n}");
                    assert!(
                        shows_name(std::slice::from_ref(row), &pair),
                        "{pair}: {row}"
                    );
                }
            }
        }
    }
}

/// Who changed the policy is said whole or not at all: at 80 columns the policy line ended in
/// `spill/s 1.8  (changed`, a parenthesis cut open in the middle of the phrase.
#[test]
fn the_policy_line_says_who_changed_it_whole_or_not_at_all() {
    use bch_core::telemetry::{ChangeSource, PolicyUpdate, ServerFrame};
    for (width, height) in SIZES {
        let mut s = State::for_replicas(vec!["ws://127.0.0.1:29390/ws".into()]);
        s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
        s.apply_replica_frame(ReplicaId(0), realistic_frame("snapshot", 0));
        let mut policy = s.live().policy.unwrap();
        policy.min_load_gap = 3;
        s.apply_replica_frame(
            ReplicaId(0),
            ServerFrame::new(
                1,
                ServerMessage::Policy(PolicyUpdate {
                    ts_ms: 1_767_268_800_000,
                    policy: policy.into(),
                    changed_by: ChangeSource::Ws.into(),
                    client: Some("127.0.0.1:55426".into()),
                }),
            ),
        );
        let screen = render(&s, width, height, Instant::now());
        let line = screen.lines().nth(1).unwrap();
        assert!(line.contains("gap 3"), "{line}");
        assert_eq!(
            line.contains('('),
            line.contains(')'),
            "at {width}×{height}, cut open: {line:?}"
        );
        assert!(
            line.contains("lost on reload") || width < 120,
            "at {width} columns there is room to say it: {line:?}"
        );
    }
}

/// A gateway whose DNS resolver is dead: the workers panel is empty, and the warning must say
/// which source fails and why. At 80 columns the border showed `⚠ DNS dns:llm-workers…` (not even
/// `failing`) beside an empty panel, and at 120 the error was cut mid-word.
#[test]
fn a_dead_resolver_is_said_whole_where_the_workers_panel_has_room() {
    let failing = common::failing_dns(0);
    for (width, height) in SIZES {
        // No worker found yet: the panel's rows are free for the whole warning.
        let mut s = State::for_replicas(vec!["ws://127.0.0.1:29290/ws".into()]);
        s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
        let mut snapshot = realistic_frame("snapshot", 0);
        let ServerMessage::Snapshot(snap) = &mut snapshot.message else {
            unreachable!()
        };
        snap.workers.clear();
        snap.discovery = vec![failing.clone()];
        s.apply_replica_frame(ReplicaId(0), snapshot);
        let screen = render(&s, width, height, Instant::now());
        // The workers panel's rows (focused: double border), read as one text.
        let flat: String = screen
            .lines()
            .filter_map(|l| l.strip_prefix('║'))
            .map(|l| l.split('║').next().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            flat.contains("⚠ DNS dns:llm-workers.test failing: no answer within timeout_ms 2000"),
            "at {width}×{height}:\n{screen}"
        );
        // A panel full of workers: the border keeps the source and its state, the error gives way.
        let mut s = State::for_replicas(vec!["ws://127.0.0.1:29290/ws".into()]);
        s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
        let mut snapshot = realistic_frame("snapshot", 0);
        let ServerMessage::Snapshot(snap) = &mut snapshot.message else {
            unreachable!()
        };
        let template = snap.workers[0].clone();
        snap.workers = (0..40)
            .map(|i| bch_core::telemetry::WorkerRecord {
                name: format!("10.244.{i}.17:8000"),
                ..template.clone()
            })
            .collect();
        snap.discovery = vec![failing.clone()];
        s.apply_replica_frame(ReplicaId(0), snapshot);
        let screen = render(&s, width, height, Instant::now());
        let border = screen
            .lines()
            .find(|l| l.contains("⚠ DNS"))
            .unwrap_or_default();
        assert!(
            border.contains("⚠ DNS dns:") && border.contains("failing"),
            "at {width}×{height}:\n{screen}"
        );
        assert!(
            width < 120 || border.contains("⚠ DNS dns:llm-workers.test failing: no answer"),
            "at {width}×{height}:\n{screen}"
        );
    }
}

/// An empty spill log says so in words that fit: beside the key table at 120 columns it read
/// `no spills: every explicit key stayed on its pr`.
#[test]
fn an_empty_spill_log_is_said_in_words_that_fit() {
    for (width, height) in SIZES {
        let mut s = State::for_replicas(vec!["ws://127.0.0.1:29390/ws".into()]);
        s.apply_replica_event(ReplicaId(0), ConnEvent::Status(ConnStatus::Connected));
        s.apply_replica_frame(
            ReplicaId(0),
            // No key tracked yet either (a fresh gateway): the table fits beside the log.
            common::snapshot_with(|snap| {
                snap.spills.clear();
                snap.keys.clear();
            }),
        );
        let screen = render(&s, width, height, Instant::now());
        let line = screen.lines().find(|l| l.contains("no spills")).unwrap();
        let said = line[line.find("no spills").unwrap()..]
            .split('│')
            .next()
            .unwrap()
            .trim_end();
        assert!(
            said == "no spills: every explicit key stayed on its preferred worker"
                || said == "no spills: every key stayed home"
                || said == "no spills",
            "at {width}×{height}: {said:?}\n{screen}"
        );
    }
}
