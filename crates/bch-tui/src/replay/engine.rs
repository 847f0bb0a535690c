//! The replay's state machine: a recording's events applied in order to a fresh [`State`],
//! exactly as the live console applied them (`App::handle_replica_conn`: the receive time, then
//! the event), so the replay reaches the live console's state event by event. Pure: the recorded
//! time is passed in.

use std::path::Path;
use std::sync::Arc;

use bch_core::recording::{RecordedEvent, RecordedKind, Recording};
use tokio::time::{Duration, Instant};

use crate::conn::{ConnEvent, ConnStatus};
use crate::state::{Playback, ReplicaId, State};

/// The speeds `-` and `+` step through, recorded seconds per wall second.
pub const SPEEDS: [f64; 7] = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0];
/// The speed a replay starts at: as recorded.
const NORMAL_SPEED: usize = 2;
/// Recorded time between two kept states: a seek back applies at most this much again.
const CHECKPOINT_EVERY_MS: u64 = 10_000;

/// A kept state: the console before event `next` was applied.
#[derive(Debug, Clone)]
struct Checkpoint {
    next: usize,
    position_ms: u64,
    state: State,
}

/// A recording being replayed: its events, the console state they have built so far, and where
/// in the recording that state stands.
#[derive(Debug)]
pub struct Replay {
    recorder: String,
    /// How many files the events came from (a rotated recording's files, joined).
    files: usize,
    /// Which of a rotated recording's older files were left out, and why.
    left_out: Option<String>,
    /// How many damaged lines the files held (skipped; marked on the timeline).
    damaged: usize,
    events: Vec<RecordedEvent>,
    state: State,
    /// The next event to apply.
    next: usize,
    /// The recorded time the state shows.
    position_ms: u64,
    /// The console clock's instant of recorded time `start_ms` (receive times become instants
    /// on the console's clock, as they were live).
    origin: Instant,
    checkpoints: Vec<Checkpoint>,
    spills: Arc<[u64]>,
    errors: Arc<[u64]>,
    speed: usize,
    paused: bool,
}

impl Replay {
    /// Reads and parses the recording at `path`, with the files it was rotated into
    /// (`FILE.8` … `FILE.1` before it, where they exist; see `chain`).
    ///
    /// # Errors
    ///
    /// `path` cannot be read, is no recording or is of a newer version, or the files hold no
    /// event.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let chain = super::chain::read_chain(path)?;
        anyhow::ensure!(
            !chain.recording.events.is_empty(),
            "--replay {}: the recording holds no event",
            path.display()
        );
        let mut replay = Self::new(chain.recording, Instant::now());
        replay.files = chain.files;
        if let Some(left_out) = &chain.left_out {
            // Said where the replay starts; the notice gives way to the timeline at the next.
            replay.state.set_notice(format!("replay: {left_out}"));
        }
        replay.left_out = chain.left_out;
        Ok(replay)
    }

    /// A replay of `recording` before its first event, with recorded start time at `origin` on
    /// the console's clock.
    pub fn new(recording: Recording, origin: Instant) -> Self {
        let events = recording.events;
        let start_ms = events.first().map_or(0, |e| e.at_ms);
        let moments = |keep: fn(&RecordedEvent) -> bool| -> Arc<[u64]> {
            events.iter().filter(|e| keep(e)).map(|e| e.at_ms).collect()
        };
        let spills = moments(RecordedEvent::has_spills);
        // A damaged line is an error moment too, at the event before it (the first event's
        // time for one before every event).
        let damaged_at = recording
            .damaged
            .iter()
            .filter_map(|&before| events.get(before.saturating_sub(1)).map(|e| e.at_ms));
        let mut errors: Vec<u64> = events
            .iter()
            .filter(|e| e.is_error())
            .map(|e| e.at_ms)
            .chain(damaged_at)
            .collect();
        errors.sort_unstable();
        let errors: Arc<[u64]> = errors.into();
        let state = State::for_replicas(recording.header.replicas);
        Self {
            recorder: recording.header.recorder,
            files: 1,
            left_out: None,
            damaged: recording.damaged.len(),
            checkpoints: vec![Checkpoint {
                next: 0,
                position_ms: start_ms,
                state: state.clone(),
            }],
            events,
            state,
            next: 0,
            position_ms: start_ms,
            origin,
            spills,
            errors,
            speed: NORMAL_SPEED,
            paused: false,
        }
    }

    /// The console state at the current position.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The console state, for the operator's view actions and the viewports.
    pub fn state_mut(&mut self) -> &mut State {
        &mut self.state
    }

    /// How many files the replay plays (more than 1 for a gateway's rotated recording).
    pub fn files(&self) -> usize {
        self.files
    }

    /// Which of a rotated recording's older files were left out and why, in words; `None` when
    /// every file found plays.
    pub fn left_out(&self) -> Option<&str> {
        self.left_out.as_deref()
    }

    /// The first event's receive time.
    pub fn start_ms(&self) -> u64 {
        self.events.first().map_or(0, |e| e.at_ms)
    }

    /// The last event's receive time.
    pub fn end_ms(&self) -> u64 {
        self.events.last().map_or(0, |e| e.at_ms)
    }

    /// The recorded time the state shows.
    pub fn position_ms(&self) -> u64 {
        self.position_ms
    }

    /// The instant on the console's clock that stands for recorded time `at_ms`.
    pub fn instant_of(&self, at_ms: u64) -> Instant {
        self.origin + Duration::from_millis(at_ms.saturating_sub(self.start_ms()))
    }

    /// The next event's receive time; `None` at the end.
    pub fn next_at_ms(&self) -> Option<u64> {
        self.events.get(self.next).map(|e| e.at_ms)
    }

    /// Applies the next event and moves the position to its receive time; returns it, or `None`
    /// at the end.
    pub fn step(&mut self) -> Option<&RecordedEvent> {
        let index = self.next;
        let at_ms = self.events.get(index)?.at_ms;
        let last = self.checkpoints.last().map_or(0, |c| c.position_ms);
        if index > self.checkpoints.last().map_or(0, |c| c.next)
            && at_ms >= last + CHECKPOINT_EVERY_MS
        {
            self.checkpoints.push(Checkpoint {
                next: index,
                position_ms: self.position_ms,
                state: self.state.clone(),
            });
        }
        let at = self.instant_of(at_ms);
        apply(&mut self.state, at, &self.events[index]);
        self.next += 1;
        self.position_ms = self.position_ms.max(at_ms);
        self.events.get(index)
    }

    /// Plays forward to recorded time `at_ms` (at most the end): every event received by then.
    pub fn advance_to(&mut self, at_ms: u64) {
        while self.next_at_ms().is_some_and(|next| next <= at_ms) {
            self.step();
        }
        self.position_ms = self.position_ms.max(at_ms.min(self.end_ms()));
    }

    /// Moves to recorded time `at_ms` (clamped to the recording), backwards from the last kept
    /// state before it. The operator's view (focus, scroll, filter) stays.
    pub fn seek(&mut self, at_ms: u64) {
        let at_ms = at_ms.clamp(self.start_ms(), self.end_ms());
        if at_ms < self.position_ms {
            let checkpoint = self
                .checkpoints
                .iter()
                .rev()
                .find(|c| c.position_ms <= at_ms)
                .unwrap_or(&self.checkpoints[0])
                .clone();
            let mut state = checkpoint.state;
            state.keep_view_of(&self.state);
            self.state = state;
            self.next = checkpoint.next;
            self.position_ms = checkpoint.position_ms;
        }
        self.advance_to(at_ms);
    }

    /// The first spill moment after the position (`forward`) or the last one before it.
    pub fn spill_from_here(&self, forward: bool) -> Option<u64> {
        let here = self.position_ms;
        if forward {
            self.spills.iter().copied().find(|&at| at > here)
        } else {
            self.spills.iter().rev().copied().find(|&at| at < here)
        }
    }

    /// The current speed, recorded seconds per wall second.
    pub fn speed(&self) -> f64 {
        SPEEDS[self.speed]
    }

    /// One step faster (`true`) or slower along [`SPEEDS`], stopping at either end.
    pub fn change_speed(&mut self, faster: bool) {
        self.speed = if faster {
            (self.speed + 1).min(SPEEDS.len() - 1)
        } else {
            self.speed.saturating_sub(1)
        };
    }

    /// Whether playing is paused.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Pauses or resumes playing.
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    /// Where the replay stands, for the header.
    pub fn playback(&self) -> Playback {
        Playback {
            position_ms: self.position_ms,
            start_ms: self.start_ms(),
            end_ms: self.end_ms(),
            speed: self.speed(),
            paused: self.paused,
            recorder: self.recorder.clone(),
            files: self.files,
            damaged: self.damaged,
            spills: Arc::clone(&self.spills),
            errors: Arc::clone(&self.errors),
        }
    }
}

/// Applies one recorded event as the live console applied it: a frame's receive time first, then
/// the event. An event naming a replica the header does not list is skipped (a damaged file must
/// not stop the replay). The `resync` the state may ask for is not sent: the recording already
/// holds the snapshot that answered it live.
fn apply(state: &mut State, at: Instant, event: &RecordedEvent) {
    if event.replica >= state.replicas().len() {
        return;
    }
    let replica = ReplicaId(event.replica);
    let event = match &event.kind {
        RecordedKind::Frame { frame } => {
            state.frame_received_on(replica, at);
            ConnEvent::Frame(frame.clone())
        }
        RecordedKind::Connected => ConnEvent::Status(ConnStatus::Connected),
        RecordedKind::Disconnected { reason } => ConnEvent::Status(ConnStatus::Reconnecting {
            retry_at: at,
            attempt: 1,
            reason: reason.clone(),
        }),
        RecordedKind::BadFrame { error } => ConnEvent::BadFrame(error.clone()),
    };
    let _ = state.apply_replica_event(replica, event);
}
