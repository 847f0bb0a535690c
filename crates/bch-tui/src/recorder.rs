//! `--record FILE`: every connection event the console receives, from every replica, appended to
//! a recording (bch-core's `recording` format, `docs/protocol.md` "Recordings") with its receive
//! time, so `--replay FILE` shows the session again.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use bch_core::recording::{RecordedEvent, RecordedKind, RecordingHeader};

use crate::conn::{ConnEvent, ConnStatus};
use crate::state::ReplicaId;

/// An open recording. Each event is flushed as it is written, so a console that is killed leaves
/// every event it applied on disk (a cut last line is dropped by the reader).
#[derive(Debug)]
pub struct Recorder {
    file: BufWriter<File>,
}

impl Recorder {
    /// Creates (or truncates) `path` and writes the header naming `replicas` (the `--url` list).
    ///
    /// # Errors
    ///
    /// The file cannot be created or written.
    pub fn create(path: &Path, replicas: Vec<String>) -> std::io::Result<Self> {
        let mut file = BufWriter::new(File::create(path)?);
        let header = RecordingHeader::new("bch-tui", now_ms(), replicas);
        file.write_all(header.to_line().as_bytes())?;
        file.flush()?;
        Ok(Self { file })
    }

    /// Appends `event` of `replica`, received now. Events a replay does not need are left out:
    /// a connection attempt starting, and a command that could not be sent (the console's own).
    ///
    /// # Errors
    ///
    /// The write failed (a full disk); the recording stops there.
    pub fn record(&mut self, replica: ReplicaId, event: &ConnEvent) -> std::io::Result<()> {
        let kind = match event {
            ConnEvent::Frame(frame) => RecordedKind::Frame {
                frame: frame.clone(),
            },
            ConnEvent::Status(ConnStatus::Connected) => RecordedKind::Connected,
            ConnEvent::Status(ConnStatus::Reconnecting { reason, .. }) => {
                RecordedKind::Disconnected {
                    reason: reason.clone(),
                }
            }
            ConnEvent::BadFrame(error) => RecordedKind::BadFrame {
                error: error.clone(),
            },
            ConnEvent::Status(ConnStatus::Connecting) | ConnEvent::NotSent(_) => return Ok(()),
        };
        let event = RecordedEvent {
            at_ms: now_ms(),
            replica: replica.0,
            kind,
        };
        self.file.write_all(event.to_line().as_bytes())?;
        self.file.flush()
    }
}

/// The wall clock in milliseconds since the Unix epoch (a clock before 1970 reads 0).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
