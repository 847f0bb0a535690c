//! The history pane's state ([`History`]: every key's placements, every worker's load trail),
//! fed by every telemetry frame as it applies. It is console state, built from the frames'
//! gateway times only, so a replay of a recording reaches the same history frame by frame as the
//! live run; pausing freezes a copy with the panels.

use bch_core::telemetry::{ServerFrame, ServerMessage, WorkerRecord};

use super::load_trails::LoadTrails;
use super::placements::PlacementHistory;

/// What the history pane shows: every key's placements and every worker's load trail.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Which worker served each key over time.
    pub placements: PlacementHistory,
    /// Each worker's load over the last minutes.
    pub loads: LoadTrails,
}

impl History {
    /// Takes what `frame` says about placements and loads, before it applies to `fleet` (the
    /// live workers). A tick's loads go into the step of its time, each raising its worker's
    /// newest sample; a snapshot's workers are sampled after it applied ([`History::settled`]).
    pub(super) fn observe(&mut self, frame: &ServerFrame, fleet: &[WorkerRecord]) {
        match &frame.message {
            ServerMessage::Snapshot(snap) => {
                self.placements.observe(&snap.spills, &snap.keys, true)
            }
            ServerMessage::Tick(tick) => {
                self.placements.observe(&tick.spills, &tick.keys, false);
                self.loads.advance(tick.ts_ms, fleet);
                self.loads.raise(&tick.workers);
            }
            _ => {}
        }
    }

    /// After `frame` applied: a snapshot's time starts a step with the fleet it described.
    pub(super) fn settled(&mut self, snapshot_ts_ms: Option<u64>, fleet: &[WorkerRecord]) {
        if let Some(ts_ms) = snapshot_ts_ms {
            self.loads.advance(ts_ms, fleet);
        }
    }
}
