//! The event loop on paused tokio time with a `TestBackend`: the countdown redraws on its own tick
//! (not only on events), key presses do not restart it, and quitting works from any mode.

mod common;

use std::pin::Pin;
use std::time::Duration;

use bch_tui::{App, ConnEvent, ConnStatus, ReplicaId, State};
use common::{buffer_text, frame};
use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use futures_util::Stream;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tokio::sync::mpsc;
use tokio::time::Instant;

type Keys = Pin<Box<dyn Stream<Item = std::io::Result<Event>> + Send>>;

fn key_stream() -> (mpsc::UnboundedSender<Event>, Keys) {
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let stream =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
        );
    (tx, Box::pin(stream))
}

fn press(c: char) -> Event {
    Event::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

struct Harness {
    keys: mpsc::UnboundedSender<Event>,
    conn: mpsc::UnboundedSender<(ReplicaId, ConnEvent)>,
    commands: mpsc::UnboundedReceiver<bch_core::telemetry::ClientCommand>,
    task: tokio::task::JoinHandle<(anyhow::Result<()>, Terminal<TestBackend>, App)>,
}

fn start() -> Harness {
    let (keys, input) = key_stream();
    let (conn, conn_rx) = mpsc::unbounded_channel();
    let (cmd_tx, commands) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let mut app = App::with_replicas(
            State::for_replicas(vec!["ws://127.0.0.1:9090/ws".into()]),
            vec![cmd_tx],
        );
        let result = bch_tui::run(&mut terminal, input, &mut app, conn_rx).await;
        (result, terminal, app)
    });
    Harness {
        keys,
        conn,
        commands,
        task,
    }
}

// Paused time: `sleep` below advances the virtual clock deterministically (no real waiting), so it
// is the way to say "250 ms pass", not a synchronisation guess.
#[tokio::test(start_paused = true)]
async fn countdown_ticks_without_events_and_keys_do_not_restart_it() {
    let h = start();
    let t0 = Instant::now();
    h.conn
        .send((
            ReplicaId(0),
            common::reconnecting(
                t0 + Duration::from_secs(5),
                3,
                "Connection refused (os error 111)",
            ),
        ))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    h.keys.send(press('?')).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.keys.send(press('?')).unwrap();
    // Nothing but the UI tick happens between here and the quit.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    h.keys.send(press('q')).unwrap();
    let (result, terminal, app) = tokio::time::timeout(Duration::from_secs(60), h.task)
        .await
        .unwrap()
        .unwrap();
    result.unwrap();
    assert!(!app.state().ui().help_open());
    let screen = buffer_text(terminal.backend().buffer());
    // Last tick redraw at 2.5 s: 2.5 s left, shown rounded up.
    assert!(screen.contains("RECONNECTING IN 3s"), "{screen}");
}

#[tokio::test(start_paused = true)]
async fn a_seq_gap_sends_resync_and_ctrl_c_quits_while_typing_a_filter() {
    let mut h = start();
    h.conn
        .send((ReplicaId(0), ConnEvent::Status(ConnStatus::Connected)))
        .unwrap();
    h.conn
        .send((ReplicaId(0), ConnEvent::Frame(Box::new(frame("snapshot")))))
        .unwrap();
    let mut gap = frame("tick_spill");
    gap.seq = 5;
    h.conn
        .send((ReplicaId(0), ConnEvent::Frame(Box::new(gap))))
        .unwrap();
    let cmd = tokio::time::timeout(Duration::from_secs(60), h.commands.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::to_value(cmd).unwrap(),
        serde_json::json!({"type":"resync"})
    );

    // Let one frame budget pass so the throttled redraw happens before the quit.
    tokio::time::sleep(bch_tui::FRAME_BUDGET * 2).await;
    h.keys.send(press('/')).unwrap();
    h.keys.send(press('q')).unwrap();
    h.keys
        .send(Event::Key(KeyEvent::new(
            KeyCode::Char('c'),
            KeyModifiers::CONTROL,
        )))
        .unwrap();
    let (result, terminal, app) = tokio::time::timeout(Duration::from_secs(60), h.task)
        .await
        .unwrap()
        .unwrap();
    result.unwrap();
    assert_eq!(
        app.state().ui().filter(),
        "q",
        "q was typed into the filter, not taken as quit"
    );
    assert!(app.state().resyncing());
    let screen = buffer_text(terminal.backend().buffer());
    assert!(screen.contains("RESYNCING"), "{screen}");
}
