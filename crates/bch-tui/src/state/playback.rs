//! Where a replay stands, for the header and its timeline: the recorded time shown, the
//! recording's span, the speed, whether it plays, and the moments worth marking. Set by the
//! replay driver before each draw; a live console has none.

use std::sync::Arc;

/// The replay's position and the recording's landmarks, as the view draws them.
#[derive(Debug, Clone, PartialEq)]
pub struct Playback {
    /// The recorded time on screen, milliseconds since the Unix epoch.
    pub position_ms: u64,
    /// The first event's receive time.
    pub start_ms: u64,
    /// The last event's receive time.
    pub end_ms: u64,
    /// Recorded seconds per wall second (0.25 to 16).
    pub speed: f64,
    /// Whether the replay is paused (space).
    pub paused: bool,
    /// Who wrote the recording (`bch-tui`, `gatewayd`).
    pub recorder: String,
    /// How many files the replay plays: 1, or a gateway's rotated files and the current one.
    pub files: usize,
    /// How many damaged lines the recording held: skipped, each an error moment on the
    /// timeline, and counted after it.
    pub damaged: usize,
    /// Receive times of frames that carried spills, ascending.
    pub spills: Arc<[u64]>,
    /// Receive times of error moments (a refused command, an unreadable frame, a lost
    /// connection), ascending.
    pub errors: Arc<[u64]>,
}
