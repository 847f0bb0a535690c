//! `--replay`'s engine and keys over a synthetic recording a minute long: a seek, back or forward,
//! reaches the state that playing straight through had at that time; the replay's keys move it;
//! threshold and drain keys do nothing and say why. The replay's screens are pinned in
//! `snapshot_matrix`, drawn by the replay loop itself.

mod common;

use bch_core::recording::{RecordedEvent, RecordedKind, Recording, RecordingHeader};
use bch_core::telemetry::{ServerFrame, ServerMessage};
use bch_tui::{FleetPicture, Replay, run_replay};
use common::frame;
use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tokio::time::Instant;

const START_MS: u64 = 1_767_268_800_000;

/// A tick fixture at `seq`, with the first worker's load `active`; every tenth carries spills.
fn tick(seq: u64, active: u64) -> ServerFrame {
    let mut f = frame(if seq.is_multiple_of(10) {
        "tick_spill"
    } else {
        "tick_unhealthy"
    });
    f.seq = seq;
    if let ServerMessage::Tick(tick) = &mut f.message {
        tick.workers[0].active = active;
        tick.ts_ms = START_MS + seq * 500;
        if !seq.is_multiple_of(10) {
            tick.spills.clear();
        }
    }
    f
}

/// A minute of one gateway: connected, a snapshot, then a tick every 500 ms.
fn recording() -> Recording {
    let event = |at_ms, kind| RecordedEvent {
        at_ms,
        replica: 0,
        kind,
    };
    let mut events = vec![
        event(START_MS, RecordedKind::Connected),
        event(
            START_MS + 5,
            RecordedKind::Frame {
                frame: Box::new(frame("snapshot")),
            },
        ),
    ];
    for seq in 1..=120 {
        events.push(event(
            START_MS + seq * 500,
            RecordedKind::Frame {
                frame: Box::new(tick(seq, seq % 7)),
            },
        ));
    }
    Recording {
        header: RecordingHeader::new("gatewayd", START_MS, vec!["ws://gw/ws".into()]),
        events,
        damaged: Vec::new(),
        truncated: false,
    }
}

/// Every state playing straight through passes, with the receive time of its event.
fn played_through() -> Vec<(u64, FleetPicture)> {
    let mut replay = Replay::new(recording(), Instant::now());
    let mut states = Vec::new();
    while let Some(event) = replay.step() {
        let at = event.at_ms;
        states.push((at, replay.state().live().clone()));
    }
    states
}

#[test]
fn a_seek_reaches_the_state_playing_through_had_then() {
    let states = played_through();
    let expected = |at_ms: u64| {
        &states
            .iter()
            .rev()
            .find(|(at, _)| *at <= at_ms)
            .expect("a state at or before")
            .1
    };
    let mut replay = Replay::new(recording(), Instant::now());
    // Forward, far back (before several checkpoints), a little back, to the end, to the start.
    for offset_ms in [
        45_000, 5_250, 12_300, 11_900, 60_000, 59_999, 0, 30_000, 29_000,
    ] {
        replay.seek(START_MS + offset_ms);
        assert_eq!(replay.position_ms(), START_MS + offset_ms);
        assert_eq!(
            replay.state().live(),
            expected(START_MS + offset_ms),
            "after a seek to +{offset_ms} ms"
        );
    }
    // The spills: the ticks every five seconds.
    replay.seek(START_MS + 12_000);
    assert_eq!(replay.spill_from_here(true), Some(START_MS + 15_000));
    assert_eq!(replay.spill_from_here(false), Some(START_MS + 10_000));
}

fn key(code: KeyCode) -> std::io::Result<Event> {
    Ok(Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
}

/// Plays `keys` (then `q`) against a replay of [`recording`] on an 80×24 screen.
async fn with_keys(replay: &mut Replay, keys: Vec<KeyCode>) -> String {
    let mut terminal = Terminal::new(TestBackend::new(100, 24)).unwrap();
    let events: Vec<_> = keys
        .into_iter()
        .chain([KeyCode::Char('q')])
        .map(key)
        .collect();
    run_replay(&mut terminal, futures_util::stream::iter(events), replay)
        .await
        .unwrap();
    let buffer = terminal.backend().buffer().clone();
    (0..buffer.area.height)
        .map(|y| {
            (0..buffer.area.width)
                .map(|x| buffer[(x, y)].symbol())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(start_paused = true)]
async fn the_replay_keys_seek_pause_and_refuse_writes() {
    let mut replay = Replay::new(recording(), Instant::now());
    with_keys(&mut replay, vec![KeyCode::Char('>')]).await;
    assert_eq!(replay.position_ms(), replay.end_ms(), "> goes to the end");
    with_keys(&mut replay, vec![KeyCode::Left, KeyCode::Left]).await;
    assert_eq!(replay.position_ms(), replay.end_ms() - 20_000, "← twice");
    with_keys(&mut replay, vec![KeyCode::Char('[')]).await;
    assert_eq!(
        replay.position_ms(),
        START_MS + 35_000,
        "[ the previous spill"
    );
    with_keys(&mut replay, vec![KeyCode::Char('<'), KeyCode::Right]).await;
    assert_eq!(replay.position_ms(), START_MS + 10_000, "< then →");
    with_keys(&mut replay, vec![KeyCode::Char('+'), KeyCode::Char('+')]).await;
    assert_eq!(replay.speed(), 4.0);
    with_keys(&mut replay, vec![KeyCode::Char('-'); 9]).await;
    assert_eq!(replay.speed(), 0.25, "the slowest speed stops there");
    let paused_before = replay.paused();
    with_keys(&mut replay, vec![KeyCode::Char(' ')]).await;
    assert_eq!(replay.paused(), !paused_before, "space pauses or plays");

    let screen = with_keys(&mut replay, vec![KeyCode::Char('G'), KeyCode::Char('d')]).await;
    assert_eq!(
        replay.state().commands().len(),
        0,
        "nothing was asked of a gateway"
    );
    assert!(
        replay.state().notice().unwrap().contains("do nothing"),
        "{:?}",
        replay.state().notice()
    );
    assert!(screen.contains("REPLAY"), "{screen}");
    assert!(screen.contains("do nothing"), "{screen}");
}
