//! Telemetry recordings: the one file format a console (`bch-tui --record`) and a gateway
//! (`[telemetry] record_file`) write and `bch-tui --replay` reads. Documented in
//! `docs/protocol.md`, "Recordings".
//!
//! A recording is JSON lines: a [`RecordingHeader`] first, then one [`RecordedEvent`] per line
//! (a frame as the wire carried it, a connection that opened or closed, a frame that did not
//! parse), each with its receive time and its replica. Line-delimited and uncompressed on
//! purpose: a recorder that dies mid-write leaves a file readable up to its last whole line, a
//! running recording can be followed with `tail -f` and `jq`, and rotation by size bounds the
//! disk it takes (a rotated file compresses tenfold with any general compressor, afterwards).
//!
//! Pure: this module encodes lines and parses bytes; opening, appending and rotating files is
//! each binary's (bch-core does no I/O).

use serde::{Deserialize, Serialize};

use crate::telemetry::{ServerFrame, ServerMessage};

/// The `format` every recording's header names.
pub const RECORDING_FORMAT: &str = "bch-recording";

/// The newest recording version this build writes and reads. A reader refuses a newer one
/// ([`RecordingError::NewerVersion`]) rather than replaying it wrong; new optional fields do not
/// bump it.
pub const RECORDING_VERSION: u32 = 1;

/// A recording's first line: what it is, who wrote it, when, and which replicas its events name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordingHeader {
    /// Always [`RECORDING_FORMAT`].
    pub format: String,
    /// [`RECORDING_VERSION`] when written by this build.
    pub version: u32,
    /// Who wrote it: `bch-tui` or `gatewayd`.
    pub recorder: String,
    /// When the recording started, milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// The replicas, by the URL the recorder knew them by (a gateway names its own control
    /// plane's `/ws`); an event's `replica` is an index into this list.
    pub replicas: Vec<String>,
}

impl RecordingHeader {
    /// A header of this build's version for `recorder`, started at `started_ms`, over `replicas`.
    pub fn new(recorder: &str, started_ms: u64, replicas: Vec<String>) -> Self {
        Self {
            format: RECORDING_FORMAT.to_owned(),
            version: RECORDING_VERSION,
            recorder: recorder.to_owned(),
            started_ms,
            replicas,
        }
    }

    /// The header as one line, newline included.
    pub fn to_line(&self) -> String {
        line_of(self)
    }
}

/// One recorded event: when it was received and from which replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    /// Receive time, milliseconds since the Unix epoch (the recorder's clock, not the gateway's
    /// `ts_ms`).
    pub at_ms: u64,
    /// Index into the header's `replicas`.
    pub replica: usize,
    /// What happened.
    #[serde(flatten)]
    pub kind: RecordedKind,
}

/// What a recorded event was, tagged by `event` in snake case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RecordedKind {
    /// A telemetry frame, exactly as the protocol defines it (`{"v":…,"seq":…,"type":…}`).
    Frame {
        /// The frame (boxed: the other events are a few words).
        frame: Box<ServerFrame>,
    },
    /// The connection to the replica opened (its `seq` restarts at 0 with a snapshot).
    Connected,
    /// The connection to the replica was lost, or an attempt failed, and why.
    Disconnected {
        /// Why, in words.
        reason: String,
    },
    /// A text frame arrived that was not a telemetry frame, and why it was refused.
    BadFrame {
        /// The parse error.
        error: String,
    },
}

impl RecordedEvent {
    /// The event as one line, newline included.
    pub fn to_line(&self) -> String {
        line_of(self)
    }

    /// Whether the event is a spill moment (a tick that carried spills), for a replay's timeline.
    pub fn has_spills(&self) -> bool {
        matches!(&self.kind, RecordedKind::Frame { frame } if matches!(&frame.message, ServerMessage::Tick(tick) if !tick.spills.is_empty()))
    }

    /// Whether the event is an error moment (a refused command, an unreadable frame, a lost
    /// connection), for a replay's timeline.
    pub fn is_error(&self) -> bool {
        match &self.kind {
            RecordedKind::Frame { frame } => matches!(frame.message, ServerMessage::Error(_)),
            RecordedKind::Disconnected { .. } | RecordedKind::BadFrame { .. } => true,
            RecordedKind::Connected => false,
        }
    }
}

/// A frame event's line from a frame already serialised (`frame_json`, a whole
/// `{"v":…,"seq":…,…}` object), without parsing it again: what a gateway writes, having encoded
/// the frame for its clients anyway. Newline included.
pub fn frame_line(at_ms: u64, replica: usize, frame_json: &str) -> String {
    format!(
        "{{\"at_ms\":{at_ms},\"replica\":{replica},\"event\":\"frame\",\"frame\":{frame_json}}}\n"
    )
}

fn line_of(value: &impl Serialize) -> String {
    let mut line = serde_json::to_string(value).expect("recording records always serialise");
    line.push('\n');
    line
}

/// A recording read back: its header and its events in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    /// The first line.
    pub header: RecordingHeader,
    /// Every whole, readable event line, in file order.
    pub events: Vec<RecordedEvent>,
    /// Where whole lines that were not events this build can read were skipped: for each such
    /// line, how many events came before it (its place in `events`), ascending, so a replay can
    /// mark it on its timeline. Its length is the number of damaged lines.
    pub damaged: Vec<usize>,
    /// Whether the file ended in a partial line (a recorder stopped mid-write): dropped.
    pub truncated: bool,
}

/// Why bytes are no readable recording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordingError {
    /// Nothing in it but white space.
    #[error("the file is empty (no header line)")]
    Empty,
    /// The first line is not a recording header.
    #[error("not a bch recording: the first line is not a `{RECORDING_FORMAT}` header ({0})")]
    NotARecording(String),
    /// Written by a newer build, in a version this one cannot replay faithfully.
    #[error(
        "recording version {found} is newer than this build reads (up to {RECORDING_VERSION}); \
         replay it with a newer bch-tui"
    )]
    NewerVersion {
        /// The header's version.
        found: u32,
    },
}

impl Recording {
    /// Parses a recording's bytes: the header, then every whole line. A last line without its
    /// newline is a write cut short and is dropped ([`Recording::truncated`]); a whole line that
    /// is not a readable event is skipped, its place kept ([`Recording::damaged`]), so one damaged
    /// line loses one event.
    ///
    /// # Errors
    ///
    /// No header line, a first line that is not a header, or a newer version.
    pub fn parse(bytes: &[u8]) -> Result<Recording, RecordingError> {
        let (whole, truncated) = match bytes.iter().rposition(|&b| b == b'\n') {
            Some(last) => (&bytes[..=last], last + 1 < bytes.len()),
            None => (&bytes[..0], !bytes.is_empty()),
        };
        let mut lines = whole
            .split(|&b| b == b'\n')
            .filter(|line| !line.iter().all(u8::is_ascii_whitespace));
        let Some(first) = lines.next() else {
            // No whole line: a header cut short (JSON that ends too soon) holds nothing to
            // replay, but other bytes without a newline (random bytes, another file) are no
            // recording and say so.
            return match serde_json::from_slice::<serde_json::Value>(bytes) {
                Err(error) if !error.is_eof() => Err(RecordingError::NotARecording(format!(
                    "no header line ({error})"
                ))),
                _ => Err(RecordingError::Empty),
            };
        };
        let header = parse_header(first)?;
        let mut events = Vec::new();
        let mut damaged = Vec::new();
        for line in lines {
            match serde_json::from_slice::<RecordedEvent>(line) {
                Ok(event) => events.push(event),
                Err(_) => damaged.push(events.len()),
            }
        }
        Ok(Recording {
            header,
            events,
            damaged,
            truncated,
        })
    }
}

/// The header line, checked: the format's name first (so any other JSON file is refused as not
/// a recording), then the version (so a newer file says so even if its header grew fields).
fn parse_header(line: &[u8]) -> Result<RecordingHeader, RecordingError> {
    let value: serde_json::Value = serde_json::from_slice(line)
        .map_err(|error| RecordingError::NotARecording(error.to_string()))?;
    if value.get("format").and_then(serde_json::Value::as_str) != Some(RECORDING_FORMAT) {
        return Err(RecordingError::NotARecording(
            "no \"format\":\"bch-recording\"".to_owned(),
        ));
    }
    let version = value
        .get("version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| RecordingError::NotARecording("no version".to_owned()))?;
    if version > u64::from(RECORDING_VERSION) {
        return Err(RecordingError::NewerVersion {
            found: u32::try_from(version).unwrap_or(u32::MAX),
        });
    }
    serde_json::from_value(value).map_err(|error| RecordingError::NotARecording(error.to_string()))
}

#[cfg(test)]
mod tests;
