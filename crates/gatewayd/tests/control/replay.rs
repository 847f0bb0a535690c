//! A recorded drill replays to the live console: a gateway with simulated workers under a storm
//! that spills, watched by a console that records (`--record`'s code path); the recording is then
//! replayed (`--replay`'s engine) and every state and screen the replay passes through is compared
//! with the one the live console had after the same event. The header alone may differ (it says
//! REPLAY and the recorded time).

use std::time::Duration;

use bch_drill::sim::SimConfig;
use bch_drill::storm::{StormConfig, run_storm};
use bch_drill::worker::{WorkerHandle, spawn_workers};
use bch_tui::{
    App, ConnConfig, ConnEvent, ConnHandle, ConnStatus, FleetPicture, Recorder, Replay, ReplicaId,
    State, screen_text,
};
use gatewayd::config::WorkerConfig;

use crate::common::{start, test_config};

/// The header's rows, the one part of the screen a replay draws differently.
const HEADER_ROWS: usize = 4;
const WIDTH: u16 = 120;
const HEIGHT: u16 = 40;

/// What a console state is, apart from when things happened on its own clock.
#[derive(Debug, PartialEq)]
struct Seen {
    fleet: FleetPicture,
    last_seq: Option<u64>,
    resyncing: bool,
    connected: bool,
    /// The screen below the header.
    panels: String,
    /// The header's first row.
    status: String,
}

fn seen(state: &State, now: tokio::time::Instant) -> Seen {
    let replica = &state.replicas()[0];
    let screen = screen_text(&mut state.clone(), WIDTH, HEIGHT, now);
    let mut rows = screen.lines();
    let status = rows.next().unwrap_or_default().to_owned();
    let panels: Vec<&str> = rows.skip(HEADER_ROWS - 1).collect();
    Seen {
        fleet: state.live().clone(),
        last_seq: replica.last_seq(),
        resyncing: replica.resyncing(),
        connected: *replica.conn() == ConnStatus::Connected,
        panels: panels.join("\n"),
        status,
    }
}

/// The gateway's entry for a simulated worker.
fn worker_config(worker: &WorkerHandle) -> WorkerConfig {
    WorkerConfig {
        name: Some(worker.name().to_owned()),
        url: worker.url(),
        ring_id: None,
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    }
}

/// Whether the recorder writes the event (the rest are the console's own: an attempt starting, a
/// command not sent).
fn recorded(event: &ConnEvent) -> bool {
    !matches!(
        event,
        ConnEvent::Status(ConnStatus::Connecting) | ConnEvent::NotSent(_)
    )
}

#[tokio::test]
async fn a_recorded_drill_replays_state_by_state_and_screen_by_screen() {
    let workers = spawn_workers(4, 0, SimConfig::default().with_time_scale(0.2))
        .await
        .unwrap();
    let mut config = test_config(&[]);
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    config.policy.min_load_gap = 1;
    config.policy.max_load_skew = 1.2;
    config.workers = workers.iter().map(worker_config).collect();
    let gateway = start(config).await;
    let url = format!("ws://{}/ws", gateway.control_addr);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("drill.jsonl");

    let mut handle = ConnHandle::spawn(ConnConfig::new(url.clone()));
    let mut app = App::with_replicas(
        State::for_replicas(vec![url.clone()]),
        vec![handle.commands.clone()],
    );
    app.record_to(Recorder::create(&file, vec![url.clone()]).unwrap());

    // Same keys from many clients at once: the preferred workers fill and requests spill.
    let storm = StormConfig {
        gateway: format!("http://{}", gateway.data_addr).parse().unwrap(),
        groups: 40,
        siblings: 8,
        keys: 1,
        concurrency: 32,
        prefix_tokens: 64,
        max_tokens: 16,
        progress: false,
        ..StormConfig::default()
    };
    let mut storm = tokio::spawn(async move { run_storm(&storm).await.unwrap() });
    let mut storm_done = false;
    let mut live = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        tokio::select! {
            report = &mut storm, if !storm_done => {
                // Answers may be 503 on a loaded test machine; the drill only needs traffic.
                let report = report.unwrap();
                assert!(report.ok > 0, "{:?} {:?}", report.error_samples, report.status_counts);
                storm_done = true;
            }
            event = handle.events.recv() => {
                let event = event.expect("the connection task runs");
                let keep = recorded(&event);
                app.handle_replica_conn(ReplicaId(0), event);
                if keep {
                    live.push(seen(app.state(), tokio::time::Instant::now()));
                }
                // The drill is over once the storm finished and the console shows every worker
                // idle again.
                let fleet = app.state().live();
                if storm_done && !fleet.workers.is_empty() && fleet.workers.iter().all(|w| w.active == 0) {
                    break;
                }
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "the drill ends");
    }
    drop(app);
    handle.task.abort();
    gateway.shutdown().await;

    let last = live.last().unwrap();
    assert!(
        !last.fleet.spills.is_empty(),
        "the drill spilled (else the test shows nothing): {} states, totals {:?}, policy {:?}",
        live.len(),
        last.fleet.totals,
        last.fleet.policy
    );
    assert!(last.status.contains("CONNECTED"), "{}", last.status);

    let mut replay = Replay::open(&file).unwrap();
    let mut replayed = Vec::new();
    while let Some(event) = replay.step() {
        let at = event.at_ms;
        let now = replay.instant_of(at);
        let playback = replay.playback();
        replay.state_mut().set_playback(Some(playback));
        replayed.push(seen(replay.state(), now));
    }
    assert_eq!(
        replayed.len(),
        live.len(),
        "one replayed state per live event"
    );
    for (index, (live, replayed)) in live.iter().zip(&replayed).enumerate() {
        assert_eq!(live.fleet, replayed.fleet, "state after event {index}");
        assert_eq!(
            (live.last_seq, live.resyncing, live.connected),
            (replayed.last_seq, replayed.resyncing, replayed.connected),
            "connection after event {index}"
        );
        assert_eq!(
            live.panels, replayed.panels,
            "screen after event {index} (header aside)"
        );
        assert!(replayed.status.contains("REPLAY"), "{}", replayed.status);
    }
    assert!(
        live.len() >= 5,
        "a drill of a few frames at least: {}",
        live.len()
    );
    // The replay found the same workers and the same spills.
    let end = replayed.last().unwrap();
    let names = |fleet: &FleetPicture| -> Vec<String> {
        fleet.workers.iter().map(|w| w.name.clone()).collect()
    };
    assert_eq!(
        names(&end.fleet),
        workers
            .iter()
            .map(|w| w.name().to_owned())
            .collect::<Vec<_>>()
    );
    assert_eq!(end.fleet.spills, last.fleet.spills);
}

/// The recording of `path` replayed to its end.
fn replayed_to_the_end(path: &std::path::Path) -> Replay {
    let mut replay = Replay::open(path).unwrap();
    while replay.step().is_some() {}
    replay
}

/// The newest state among `file` and its rotated files: the current file's, unless it was
/// rotated so recently that its snapshot has not arrived yet (then the previous file's).
fn newest_state(file: &std::path::Path) -> Replay {
    let rotated = std::path::PathBuf::from(format!("{}.1", file.display()));
    let current = replayed_to_the_end(file);
    if current.state().live().policy.is_some() {
        current
    } else {
        replayed_to_the_end(&rotated)
    }
}

#[tokio::test]
async fn an_unwatched_gateway_records_its_drill_rotating_by_size() {
    let workers = spawn_workers(4, 0, SimConfig::default().with_time_scale(0.05))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.jsonl");
    let mut config = test_config(&[]);
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    config.policy.min_load_gap = 1;
    config.policy.max_load_skew = 1.2;
    config.telemetry.record_file = Some(file.clone());
    config.telemetry.record_max_bytes = 64 * 1024;
    config.workers = workers.iter().map(worker_config).collect();
    let gateway = start(config).await;
    // Many keys, each a whole record in the tick that changed it: enough bytes to rotate.
    let storm = StormConfig {
        gateway: format!("http://{}", gateway.data_addr).parse().unwrap(),
        groups: 200,
        siblings: 4,
        keys: 200,
        concurrency: 32,
        prefix_tokens: 64,
        max_tokens: 16,
        progress: false,
        ..StormConfig::default()
    };
    // A loaded test machine may serve one storm in fewer, larger ticks: storm again until the
    // recording has rotated twice (three files to join), a few rounds at most.
    let twice = dir.path().join("gateway.jsonl.2");
    for _ in 0..6 {
        let report = run_storm(&storm).await.unwrap();
        assert!(
            report.ok > 0,
            "{:?} {:?}",
            report.error_samples,
            report.status_counts
        );
        if twice.exists() {
            break;
        }
    }
    let rotated = dir.path().join("gateway.jsonl.1");
    assert!(
        rotated.exists(),
        "the recording rotated: {:?}",
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    // The last tick of the storm reaches the current file once the aggregator sends it.
    // What a console connecting now is told: the recording's last state must say the same.
    let mut watcher =
        ConnHandle::spawn(ConnConfig::new(format!("ws://{}/ws", gateway.control_addr)));
    let told = loop {
        match watcher
            .events
            .recv()
            .await
            .expect("the connection task runs")
        {
            ConnEvent::Frame(frame) => match frame.message {
                bch_core::telemetry::ServerMessage::Snapshot(snapshot) => break snapshot.totals,
                other => panic!("a snapshot first, got {other:?}"),
            },
            _ => continue,
        }
    };
    watcher.task.abort();
    assert!(told.requests_total > 0);
    eventually!("the recording's last state counts every request", {
        let state = newest_state(&file);
        state.state().live().totals.requests_total == told.requests_total
    });
    let url = format!("ws://{}/ws", gateway.control_addr);
    // Returns once the recorder has closed its file: no rotation can follow the listing.
    gateway.shutdown().await;

    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 2 && files.len() <= 9, "{files:?}");
    for path in &files {
        let recording =
            bch_core::recording::Recording::parse(&std::fs::read(path).unwrap()).unwrap();
        if recording.events.len() < 2 && *path == file {
            // Rotated just before the gateway stopped: the snapshot never came.
            continue;
        }
        assert_eq!(recording.header.recorder, "gatewayd");
        assert_eq!(recording.header.replicas, std::slice::from_ref(&url));
        // Each file replays alone: it opens like a console's connection, with a snapshot.
        match &recording.events[..2] {
            [
                bch_core::recording::RecordedEvent {
                    kind: bch_core::recording::RecordedKind::Connected,
                    ..
                },
                bch_core::recording::RecordedEvent {
                    kind: bch_core::recording::RecordedKind::Frame { frame },
                    ..
                },
            ] => {
                assert_eq!(frame.seq, 0, "{}", path.display());
                assert!(
                    matches!(
                        frame.message,
                        bch_core::telemetry::ServerMessage::Snapshot(_)
                    ),
                    "{}",
                    path.display()
                );
            }
            other => panic!("{}: {other:?}", path.display()),
        }
        let replay = replayed_to_the_end(path);
        let state = replay.state();
        assert!(!state.resyncing(), "{}: no gap", path.display());
        let names: Vec<&str> = state
            .live()
            .workers
            .iter()
            .map(|w| w.name.as_str())
            .collect();
        assert_eq!(
            names,
            workers.iter().map(|w| w.name()).collect::<Vec<_>>(),
            "{}",
            path.display()
        );
    }
    let end = newest_state(&file);
    assert!(
        end.state().live().totals.spills_total > 0,
        "the storm's spills"
    );
    the_rotated_files_replay_as_one(&file, &files);
}

/// `--replay FILE` plays `FILE.8` … `FILE.1`, `FILE` as one recording: every event of every file
/// in time order, the timeline spanning them all, and a seek anywhere (into an older file, back
/// across a join) reaching the state that playing straight through had then.
fn the_rotated_files_replay_as_one(file: &std::path::Path, files: &[std::path::PathBuf]) {
    // Oldest first: `FILE.8` … `FILE.1`, then `FILE`.
    let mut order: Vec<&std::path::PathBuf> = files.iter().filter(|p| *p != file).collect();
    order.sort_by_key(|p| {
        std::cmp::Reverse(
            p.extension()
                .and_then(|e| e.to_str())
                .and_then(|e| e.parse::<u32>().ok()),
        )
    });
    let recordings: Vec<bch_core::recording::Recording> = order
        .iter()
        .map(|p| p.as_path())
        .chain([file])
        .map(|p| bch_core::recording::Recording::parse(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    let all: Vec<u64> = recordings
        .iter()
        .flat_map(|r| r.events.iter().map(|e| e.at_ms))
        .collect();
    assert!(all.is_sorted(), "the files follow one another in time");

    let mut replay = Replay::open(file).unwrap();
    assert_eq!(replay.files(), files.len(), "every file is played");
    assert_eq!(replay.start_ms(), all[0], "from the oldest file's start");
    assert_eq!(replay.end_ms(), *all.last().unwrap(), "to the newest's end");
    let spills: Vec<u64> = recordings
        .iter()
        .flat_map(|r| r.events.iter().filter(|e| e.has_spills()).map(|e| e.at_ms))
        .collect();
    assert_eq!(
        *replay.playback().spills,
        *spills,
        "every file's spills are on the timeline"
    );
    let mut states = Vec::new();
    while let Some(event) = replay.step() {
        let at = event.at_ms;
        states.push((
            at,
            replay.state().live().clone(),
            replay.state().resyncing(),
        ));
    }
    assert_eq!(states.len(), all.len(), "one state per event of every file");
    assert!(
        states.iter().all(|(_, _, resyncing)| !resyncing),
        "each join opens like a reconnection: no seq gap"
    );
    let expected = |at_ms: u64| {
        &states
            .iter()
            .rev()
            .find(|(at, ..)| *at <= at_ms)
            .expect("a state at or before")
            .1
    };
    // Into each file (its snapshot, and halfway through it) from the end, backwards across the
    // joins, then forwards again.
    let mut targets: Vec<u64> = recordings
        .iter()
        .flat_map(|r| {
            let first = r.events[r.events.len().min(2) - 1].at_ms;
            let last = r.events.last().unwrap().at_ms;
            [first, first.midpoint(last)]
        })
        .collect();
    targets.reverse();
    targets.extend(targets.clone().into_iter().rev());
    for at in targets {
        replay.seek(at);
        assert_eq!(replay.position_ms(), at);
        assert_eq!(replay.state().live(), expected(at), "after a seek to {at}");
    }
}

/// The files this process has open under `dir` (from `/proc/self/fd`).
#[cfg(target_os = "linux")]
fn open_files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// Once `shutdown` returns the recording is final: the recorder wrote the aggregator's last frame
/// and closed the file, so what is on disk is what an operator (or a test) replays, and no
/// rotation is left half done when the process exits.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_stopped_gateway_has_closed_its_recording() {
    let workers = spawn_workers(2, 0, SimConfig::default().with_time_scale(0.05))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.jsonl");
    let mut config = test_config(&[]);
    config.telemetry.record_file = Some(file.clone());
    config.workers = workers.iter().map(worker_config).collect();
    let gateway = start(config).await;
    assert_eq!(
        open_files_under(dir.path()),
        std::slice::from_ref(&file),
        "recording"
    );
    // Traffic, so the recorder has frames to write as the gateway stops.
    let storm = StormConfig {
        gateway: format!("http://{}", gateway.data_addr).parse().unwrap(),
        groups: 20,
        siblings: 2,
        keys: 20,
        concurrency: 8,
        prefix_tokens: 16,
        max_tokens: 4,
        progress: false,
        ..StormConfig::default()
    };
    let report = run_storm(&storm).await.unwrap();
    assert!(report.ok > 0, "{:?}", report.status_counts);
    gateway.shutdown().await;
    assert_eq!(
        open_files_under(dir.path()),
        Vec::<std::path::PathBuf>::new(),
        "the recording is closed once the gateway has stopped"
    );
    let recording = bch_core::recording::Recording::parse(&std::fs::read(&file).unwrap()).unwrap();
    assert!(recording.events.len() >= 2, "a connection and its snapshot");
}

#[tokio::test]
async fn a_recording_that_cannot_be_created_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(&[]);
    config.telemetry.record_file = Some(dir.path().join("missing-dir").join("t.jsonl"));
    let error = gatewayd::start(gatewayd::StartOptions::new(config))
        .await
        .err()
        .expect("refused");
    let message = error.to_string();
    assert!(
        message.contains("record_file") && message.contains("missing-dir"),
        "{message}"
    );
}
