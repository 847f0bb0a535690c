//! The binary's `--record`, `--snapshot` and `--replay` together, against a tiny fake gateway on
//! 127.0.0.1:0: one screen printed as text at the size asked, the session recorded, the recording
//! printed again as a replay's screen; a recording from a newer build refused with a clear error;
//! `--model` starting a replay on one model's pool.

mod common;

use std::process::{Command, Output};

use bch_core::recording::{RecordedEvent, RecordedKind, Recording, RecordingHeader};
use bch_core::telemetry::ServerFrame;
use common::frame_at;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

fn text(frame: &ServerFrame) -> Message {
    Message::text(serde_json::to_string(frame).unwrap())
}

/// Runs the console binary with `args` (off the runtime: it blocks).
async fn console(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_bch-tui"))
            .args(args)
            // A URL in the environment is the live console's default; a replay ignores it.
            .env("BCH_TUI_URL", "ws://not-used.invalid:1/ws")
            .env_remove("BCH_TOKEN_FILE")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The screen's rows: exactly `height`, none wider than `width`.
fn rows(output: &Output, width: usize, height: usize) -> Vec<String> {
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let rows: Vec<String> = stdout.lines().map(str::to_owned).collect();
    assert_eq!(rows.len(), height, "{stdout}");
    for row in &rows {
        assert!(row.chars().count() <= width, "{row:?} in\n{stdout}");
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_prints_one_screen_and_a_recording_replays_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        ws.send(text(&frame_at("snapshot", 0))).await.unwrap();
        ws.send(text(&frame_at("tick_spill", 1))).await.unwrap();
        // Held open until the console leaves.
        while let Some(Ok(_)) = ws.next().await {}
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("session.jsonl");
    let args = |extra: &[&str]| extra.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    let live = console(args(&[
        "--url",
        &url,
        "--record",
        file.to_str().unwrap(),
        "--snapshot",
        "1",
        "--width",
        "80",
        "--height",
        "24",
    ]))
    .await;
    assert!(live.status.success(), "{live:?}");
    let screen = rows(&live, 80, 24).join("\n");
    assert!(screen.contains("CONNECTED"), "{screen}");
    assert!(
        screen.contains("w0") && screen.contains("chat-session-0001"),
        "{screen}"
    );
    server.await.unwrap();

    let recording = Recording::parse(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(recording.header.replicas, std::slice::from_ref(&url));
    let kinds: Vec<&str> = recording
        .events
        .iter()
        .map(|e| match &e.kind {
            RecordedKind::Connected => "connected",
            RecordedKind::Frame { .. } => "frame",
            RecordedKind::Disconnected { .. } => "disconnected",
            RecordedKind::BadFrame { .. } => "bad frame",
        })
        .collect();
    assert_eq!(kinds, ["connected", "frame", "frame"]);

    let replayed = console(args(&[
        "--replay",
        file.to_str().unwrap(),
        "--snapshot",
        "10",
    ]))
    .await;
    assert!(replayed.status.success(), "{replayed:?}");
    let replay_screen = rows(&replayed, 120, 40).join("\n");
    assert!(replay_screen.contains("REPLAY"), "{replay_screen}");
    assert!(
        replay_screen.contains("w0") && replay_screen.contains("chat-session-0001"),
        "{replay_screen}"
    );

    // A recording from a newer build: refused, saying so.
    let newer = dir.path().join("newer.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&newer, text.replacen("\"version\":1", "\"version\":99", 1)).unwrap();
    let refused = console(args(&[
        "--replay",
        newer.to_str().unwrap(),
        "--snapshot",
        "1",
    ]))
    .await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("version 99 is newer"), "{stderr}");
}

/// `--model` with `--replay`: the screen is the pool's from the recording's first snapshot on,
/// and the header names the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_starts_on_the_model_given() {
    const START_MS: u64 = 1_767_268_800_000;
    let snapshot = common::snapshot_with(|snap| {
        let models: [&[&str]; 4] = [&["llama"], &["llama", "qwen"], &["qwen"], &["qwen"]];
        for (worker, models) in snap.workers.iter_mut().zip(models) {
            worker.models = models.iter().map(|m| (*m).to_owned()).collect();
        }
    });
    let event = |at_ms, kind| RecordedEvent {
        at_ms,
        replica: 0,
        kind,
    };
    let mut text = RecordingHeader::new("bch-tui", START_MS, vec!["ws://gw/ws".into()]).to_line();
    text.push_str(&event(START_MS, RecordedKind::Connected).to_line());
    let frame = RecordedKind::Frame {
        frame: Box::new(snapshot),
    };
    text.push_str(&event(START_MS + 5, frame).to_line());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two-models.jsonl");
    std::fs::write(&file, text).unwrap();
    let args = [
        "--replay",
        file.to_str().unwrap(),
        "--snapshot",
        "1",
        "--model",
        "qwen",
        "--width",
        "80",
        "--height",
        "24",
    ];
    let replayed = console(args.iter().map(|s| (*s).to_owned()).collect()).await;
    assert!(replayed.status.success(), "{replayed:?}");
    let screen = rows(&replayed, 80, 24);
    assert!(screen[0].contains("model qwen"), "{}", screen.join("\n"));
    assert!(
        screen.iter().any(|row| row.contains("Workers 3/3 healthy")),
        "{}",
        screen.join("\n")
    );
}
