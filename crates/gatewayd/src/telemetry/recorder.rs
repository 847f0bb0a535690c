//! `[telemetry] record_file`: the gateway records its own telemetry, so a drill nobody watched
//! can be replayed (`bch-tui --replay`). The recorder is one more telemetry client (protocol
//! version 2, the console's): it gets the frames a console would, in the recording format of
//! bch-core (`docs/protocol.md`, "Recordings"), with a snapshot at the start of every file and
//! every [`SNAPSHOT_EVERY`], so any file, and any point after a snapshot, can be replayed alone.
//!
//! It writes on a thread of its own (file writes block), and like any client it never slows the
//! aggregator: when the disk falls behind its queue fills, frames are dropped (counted in the
//! next tick's `dropped_events`) and a fresh snapshot follows.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bch_core::recording::{RecordedEvent, RecordedKind, RecordingHeader, frame_line};
use bch_core::telemetry::PROTOCOL_VERSION;
use tokio::sync::mpsc::Receiver;

use super::wire::envelope;
use crate::clock::now_ms;
use crate::config::TelemetryConfig;

/// Time between two snapshots in a recording, so a seek or a rotated file needs at most this much
/// of the recording before it.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(30);
/// Rotated files kept besides the current one: `FILE.1` (newest) to `FILE.8`.
pub const ROTATED_FILES_KEPT: u32 = 8;

/// Where a gateway records and when it rotates.
#[derive(Debug, Clone)]
pub struct RecordingTarget {
    /// The current file; rotated ones get `.1`, `.2`, … appended.
    pub path: PathBuf,
    /// Size past which the file is rotated.
    pub max_bytes: u64,
    /// What the header names the replica by: the control plane's `/ws` URL.
    pub url: String,
}

impl RecordingTarget {
    /// The target `config` asks for (`None` without `record_file`), naming the control plane at
    /// `control_addr` (`wss://` when `control_tls`) as the replica.
    pub fn of(
        config: &TelemetryConfig,
        control_addr: SocketAddr,
        control_tls: bool,
    ) -> Option<Self> {
        let scheme = if control_tls { "wss" } else { "ws" };
        config.record_file.clone().map(|path| Self {
            path,
            max_bytes: config.record_max_bytes,
            url: format!("{scheme}://{control_addr}/ws"),
        })
    }
}

/// The open file and how much is in it.
pub(super) struct RecordingFile {
    target: RecordingTarget,
    file: BufWriter<File>,
    written: u64,
}

impl RecordingFile {
    /// Creates the target's file with its header, replacing the one there. The header is written
    /// to `FILE.partial` first and that is renamed over `FILE`, so whoever reads `FILE` (a replay
    /// of a live recording, `tail -f`) always finds a whole header, never an empty file.
    fn create(target: RecordingTarget) -> std::io::Result<Self> {
        let partial = suffixed_path(&target.path, "partial");
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&partial)?;
        let mut this = Self {
            target,
            file: BufWriter::new(file),
            written: 0,
        };
        let header = RecordingHeader::new("gatewayd", now_ms(), vec![this.target.url.clone()]);
        this.write(&header.to_line())?;
        // Each file is one connection of a console's: it opens, then a snapshot at seq 0.
        let opened = RecordedEvent {
            at_ms: now_ms(),
            replica: 0,
            kind: RecordedKind::Connected,
        };
        this.write(&opened.to_line())?;
        this.file.flush()?;
        std::fs::rename(&partial, &this.target.path)?;
        Ok(this)
    }

    fn write(&mut self, line: &str) -> std::io::Result<()> {
        self.file.write_all(line.as_bytes())?;
        self.written += line.len() as u64;
        Ok(())
    }

    /// Moves `FILE` to `FILE.1` (and each older one up, the oldest deleted), then starts a fresh
    /// `FILE`. `FILE` never goes missing: `FILE.1` is made a second name of it (a hard link; a
    /// rename where the file system has none) before the fresh file is renamed over it.
    fn rotate(self) -> std::io::Result<Self> {
        let Self { target, file, .. } = self;
        drop(file.into_inner().map_err(|e| e.into_error())?);
        let numbered = |n: u32| rotated_path(&target.path, n);
        let _ = std::fs::remove_file(numbered(ROTATED_FILES_KEPT));
        for n in (1..ROTATED_FILES_KEPT).rev() {
            let from = numbered(n);
            if from.exists() {
                std::fs::rename(&from, numbered(n + 1))?;
            }
        }
        if std::fs::hard_link(&target.path, numbered(1)).is_err() {
            std::fs::rename(&target.path, numbered(1))?;
        }
        Self::create(target)
    }
}

/// `FILE.n`.
fn rotated_path(path: &Path, n: u32) -> PathBuf {
    suffixed_path(path, &n.to_string())
}

/// `FILE.suffix`.
fn suffixed_path(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// Creates `target`'s file (so a path that cannot be written fails the start), naming the file
/// in the error.
pub(super) fn create(target: RecordingTarget) -> std::io::Result<RecordingFile> {
    let path = target.path.clone();
    RecordingFile::create(target)
        .map_err(|error| std::io::Error::new(error.kind(), format!("{}: {error}", path.display())))
}

/// Writes the client's `frames` into `file` on a thread of its own until the queue closes (the
/// aggregator stopped); `resync` asks for a snapshot, `done` unregisters the client. A write that
/// fails is logged once and ends the recording; the gateway goes on.
///
/// Returns a future that completes once the thread has written its last frame and closed the
/// file (a rotation it began is then finished), so a gateway that stops can wait for a whole
/// recording before it exits.
pub(super) fn spawn(
    file: RecordingFile,
    frames: Receiver<Arc<str>>,
    resync: impl Fn() + Send + 'static,
    done: impl FnOnce() + Send + 'static,
) -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    // Dropped when the thread ends, however it ends (a panic unwinds past it too).
    let (finished, written) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("telemetry-recorder".into())
        .spawn(move || {
            let _finished = finished;
            let path = file.target.path.clone();
            if let Err(error) = write_frames(file, frames, &resync) {
                tracing::warn!(file = %path.display(), %error, "telemetry recording stopped");
            }
            done();
        })?;
    Ok(async move {
        // Only the sender's drop ever answers: the error is the signal.
        let _ = written.await;
    })
}

/// Writes every frame until the queue closes, rotating by size and asking for a snapshot
/// (`resync`) after each rotation and every [`SNAPSHOT_EVERY`].
fn write_frames(
    mut file: RecordingFile,
    mut frames: Receiver<Arc<str>>,
    resync: &impl Fn(),
) -> std::io::Result<()> {
    let mut seq: u64 = 0;
    // A fresh file waits for its snapshot: frames before it describe changes the snapshot holds.
    let mut waiting_for_snapshot = true;
    let mut last_snapshot = Instant::now();
    while let Some(body) = frames.blocking_recv() {
        let snapshot = body.starts_with("{\"type\":\"snapshot\"");
        if waiting_for_snapshot && !snapshot {
            continue;
        }
        waiting_for_snapshot = false;
        let frame = envelope(PROTOCOL_VERSION, seq, &body);
        seq += 1;
        file.write(&frame_line(now_ms(), 0, &frame))?;
        // Whole lines on disk before waiting again: a gateway that is killed loses at most the
        // frame being written.
        file.file.flush()?;
        if snapshot {
            last_snapshot = Instant::now();
        } else if last_snapshot.elapsed() >= SNAPSHOT_EVERY {
            resync();
            last_snapshot = Instant::now();
        }
        if file.written >= file.target.max_bytes {
            file = file.rotate()?;
            seq = 0;
            waiting_for_snapshot = true;
            resync();
            last_snapshot = Instant::now();
        }
    }
    file.file.flush()
}
