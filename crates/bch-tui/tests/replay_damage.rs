//! The binary's `--replay` on damaged recordings, as an operator meets them: a damaged line is
//! marked on the timeline and counted, a rotated recording whose older files cannot join says
//! which were left out and why (on stderr before the screen, and as the replay's first notice),
//! random bytes are refused as no recording, and an 80-column header keeps `REPLAY` and the
//! file count.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use bch_core::recording::{RecordedEvent, RecordedKind, RecordingHeader};
use common::frame_at;

const START_MS: u64 = 1_767_268_800_000;

/// A recording by `recorder` started at `start_ms`: connected, a snapshot, then `ticks` ticks
/// `tick_ms` apart (no spills, no errors: a clean timeline).
fn recording(recorder: &str, start_ms: u64, ticks: u64, tick_ms: u64) -> String {
    let event = |at_ms, kind| RecordedEvent {
        at_ms,
        replica: 0,
        kind,
    };
    let frame = |name, seq| RecordedKind::Frame {
        frame: Box::new(frame_at(name, seq)),
    };
    let mut text = RecordingHeader::new(recorder, start_ms, vec!["ws://gw/ws".into()]).to_line();
    text.push_str(&event(start_ms, RecordedKind::Connected).to_line());
    text.push_str(&event(start_ms + 1, frame("snapshot", 0)).to_line());
    for seq in 1..=ticks {
        let tick = frame("tick_unhealthy", seq);
        text.push_str(&event(start_ms + seq * tick_ms, tick).to_line());
    }
    text
}

/// Runs the console binary on `file` with `--snapshot 5` at `width`×`height`.
fn replay(file: &Path, width: u16, height: u16) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bch-tui"))
        .args(["--replay", file.to_str().unwrap(), "--snapshot", "5"])
        .args([
            "--width",
            &width.to_string(),
            "--height",
            &height.to_string(),
        ])
        .env_remove("BCH_TUI_URL")
        .env_remove("BCH_TOKEN_FILE")
        .output()
        .unwrap()
}

fn screen(output: &Output) -> String {
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The header's fourth row: the timeline (or the notice in its place).
fn timeline_row(screen: &str) -> &str {
    screen.lines().nth(3).unwrap()
}

#[test]
fn a_damaged_line_is_marked_on_the_timeline_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let clean = dir.path().join("clean.jsonl");
    std::fs::write(&clean, recording("bch-tui", START_MS, 10, 1000)).unwrap();
    let clean_screen = screen(&replay(&clean, 120, 40));
    assert!(!timeline_row(&clean_screen).contains('!'), "{clean_screen}");

    let damaged = dir.path().join("damaged.jsonl");
    let mut lines: Vec<String> = recording("bch-tui", START_MS, 10, 1000)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.insert(3, "GARBAGE LINE {{{".to_owned());
    std::fs::write(&damaged, lines.join("\n") + "\n").unwrap();
    let screen = screen(&replay(&damaged, 120, 40));
    let timeline = timeline_row(&screen);
    assert!(timeline.contains("! 1 damaged line"), "{screen}");
    // Marked at its place: after the snapshot, in the first cells, not at the end.
    let marks: String = timeline.split(" ! 1 damaged").next().unwrap().to_owned();
    let mark = marks.chars().position(|c| c == '!');
    assert!(mark.is_some_and(|at| at < 5), "{timeline}");
}

#[test]
fn a_rotated_file_that_is_no_recording_says_which_files_were_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rec.jsonl");
    let rotated = |n: u32| dir.path().join(format!("rec.jsonl.{n}"));
    std::fs::write(&file, recording("gatewayd", START_MS + 40_000, 10, 1000)).unwrap();
    std::fs::write(
        rotated(1),
        recording("gatewayd", START_MS + 30_000, 9, 1000),
    )
    .unwrap();
    std::fs::write(rotated(2), "GARBAGE\n").unwrap();
    for n in 3..=5 {
        let started = START_MS + 30_000 - u64::from(n) * 10_000;
        std::fs::write(rotated(n), recording("gatewayd", started, 9, 1000)).unwrap();
    }
    let output = replay(&file, 120, 40);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let said = "rec.jsonl.2 … rec.jsonl.5 left out: rec.jsonl.2 is not a bch recording";
    assert!(stderr.contains(said), "{stderr}");
    let screen = screen(&output);
    assert!(
        screen.lines().next().unwrap().contains("2 files"),
        "{screen}"
    );
    assert!(timeline_row(&screen).contains(said), "{screen}");
}

#[test]
fn a_missing_rotated_file_says_the_older_ones_were_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rec.jsonl");
    let rotated = |n: u32| dir.path().join(format!("rec.jsonl.{n}"));
    std::fs::write(&file, recording("gatewayd", START_MS + 40_000, 10, 1000)).unwrap();
    for n in [1, 2, 3, 5, 6, 7, 8] {
        let started = START_MS + 40_000 - u64::from(n) * 10_000;
        std::fs::write(rotated(n), recording("gatewayd", started, 9, 1000)).unwrap();
    }
    let output = replay(&file, 120, 40);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let said = "rec.jsonl.5 … rec.jsonl.8 left out: rec.jsonl.4 is missing";
    assert!(stderr.contains(said), "{stderr}");
    let screen = screen(&output);
    assert!(
        screen.lines().next().unwrap().contains("4 files"),
        "{screen}"
    );
}

#[test]
fn random_bytes_are_not_a_recording() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("random.jsonl");
    // 300 scrambled bytes without a newline, as `head -c 300 /dev/urandom` often gives.
    let bytes: Vec<u8> = (0u32..300)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .filter(|&b| b != b'\n')
        .collect();
    std::fs::write(&file, bytes).unwrap();
    let output = replay(&file, 80, 24);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a bch recording"), "{stderr}");
    assert!(!stderr.contains("empty"), "{stderr}");
}

#[test]
fn an_80_column_header_keeps_replay_and_the_file_count() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rec.jsonl");
    for n in 0..=8u32 {
        let path = match n {
            0 => file.clone(),
            n => dir.path().join(format!("rec.jsonl.{n}")),
        };
        // Ten minutes a file: the header's span takes `h:mm:ss`, its longest.
        let started = START_MS + 5_400_000 - u64::from(n) * 600_000;
        std::fs::write(path, recording("gatewayd", started, 10, 59_000)).unwrap();
    }
    let screen = screen(&replay(&file, 80, 24));
    let status = screen.lines().next().unwrap();
    assert!(status.contains("REPLAY"), "{screen}");
    assert!(status.contains("9 files"), "{screen}");
}
