//! Each worker's load over the last minutes, for the history pane's sparkline: one sample per
//! [`TRAIL_STEP_MS`] of gateway time, the highest load the rule read for the worker in that step
//! (a spike between two samples is not lost), [`TRAIL_LEN`] samples.
//!
//! Kept for every worker of the fleet, so selecting one shows its past at once (and a replay
//! shows the same trail whatever was selected while recording), and kept compact for that: a
//! fixed ring of `u16` per worker sharing one write position, about 250 bytes a worker with its
//! name (2.5 MB at 10,000 workers; the paused copy and each replay checkpoint hold one). Workers
//! that leave the fleet lose their trail.

use std::collections::{BTreeMap, HashSet};

use bch_core::telemetry::WorkerRecord;

/// Gateway time one sample covers, ms.
pub const TRAIL_STEP_MS: u64 = 2_000;
/// Samples kept per worker: three minutes.
pub const TRAIL_LEN: usize = 90;
/// A slot with no sample (before the worker was seen).
const NONE: u16 = u16::MAX;

/// Every worker's load trail.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadTrails {
    /// Per worker name, a ring of [`TRAIL_LEN`] samples; `head` is the newest.
    trails: BTreeMap<String, Box<[u16; TRAIL_LEN]>>,
    head: usize,
    /// The step (gateway time / [`TRAIL_STEP_MS`]) the newest samples belong to; `None` before
    /// the first.
    step: Option<u64>,
}

impl LoadTrails {
    /// `worker`'s samples, oldest first, the newest last; `None` where the worker was not yet
    /// seen. `None` for a worker without a trail.
    pub fn trail(&self, worker: &str) -> Option<Vec<Option<u64>>> {
        let ring = self.trails.get(worker)?;
        Some(
            (1..=TRAIL_LEN)
                .map(|i| ring[(self.head + i) % TRAIL_LEN])
                .map(|v| (v != NONE).then_some(u64::from(v)))
                .collect(),
        )
    }

    /// How many workers have a trail.
    pub fn len(&self) -> usize {
        self.trails.len()
    }

    /// Whether no worker has a trail yet.
    pub fn is_empty(&self) -> bool {
        self.trails.is_empty()
    }

    /// Moves to the step of gateway time `ts_ms` when it is a later one: every worker of
    /// `fleet` (the fleet after the frame) gets a new sample at its load now, one per step
    /// passed (at most [`TRAIL_LEN`]); trails of workers no longer in it go. A frame of an earlier
    /// step (another replica's clock) adds to the newest step.
    pub(super) fn advance(&mut self, ts_ms: u64, fleet: &[WorkerRecord]) {
        let step = ts_ms / TRAIL_STEP_MS;
        let steps = match self.step {
            Some(newest) if step <= newest => return,
            Some(newest) => (step - newest).min(TRAIL_LEN as u64) as usize,
            None => 1,
        };
        self.step = Some(step);
        for worker in fleet {
            if !self.trails.contains_key(&worker.name) {
                self.trails
                    .insert(worker.name.clone(), Box::new([NONE; TRAIL_LEN]));
            }
            let Some(ring) = self.trails.get_mut(&worker.name) else {
                continue;
            };
            let load = sample(worker);
            for i in 1..=steps {
                ring[(self.head + i) % TRAIL_LEN] = load;
            }
        }
        // Every worker of the fleet has a trail now: any more are of workers that left.
        if self.trails.len() != fleet.len() {
            let names: HashSet<&str> = fleet.iter().map(|w| w.name.as_str()).collect();
            self.trails.retain(|name, _| names.contains(name.as_str()));
        }
        self.head = (self.head + steps) % TRAIL_LEN;
    }

    /// The loads a tick reported: each raises its worker's newest sample to it.
    pub(super) fn raise(&mut self, workers: &[WorkerRecord]) {
        for worker in workers {
            if let Some(ring) = self.trails.get_mut(super::caps::cut_str(&worker.name)) {
                let slot = &mut ring[self.head];
                let load = sample(worker);
                if *slot == NONE || load > *slot {
                    *slot = load;
                }
            }
        }
    }
}

/// A worker's load as one sample: the rule's load, at most one below [`NONE`].
fn sample(worker: &WorkerRecord) -> u16 {
    u16::try_from(worker.rule_load())
        .unwrap_or(NONE - 1)
        .min(NONE - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory the trails of a 10,000-worker fleet hold once full: each worker's ring, its
    /// name and its map entry (the key and the box pointer, in B-tree nodes of up to 11 entries
    /// with their overhead, about 1.3 times the entries).
    #[test]
    fn ten_thousand_workers_cost_about_two_and_a_half_megabytes() {
        let fleet: Vec<WorkerRecord> = (0..10_000u64)
            .map(|i| {
                serde_json::from_value(serde_json::json!({
                    "name": format!("10.244.{}.{}:8000", i / 256, i % 256),
                    "url": format!("http://10.244.{}.{}:8000", i / 256, i % 256),
                    "healthy": true, "active": i % 50, "requests_total": 0,
                    "spilled_in_total": 0, "spilled_out_total": 0, "errors_total": 0,
                }))
                .unwrap()
            })
            .collect();
        let mut trails = LoadTrails::default();
        for step in 0..=TRAIL_LEN as u64 {
            trails.advance(step * TRAIL_STEP_MS, &fleet);
        }
        assert_eq!(trails.len(), 10_000);
        let entry = (size_of::<String>() + size_of::<Box<[u16; TRAIL_LEN]>>()) * 13 / 10;
        let bytes: usize = trails
            .trails
            .keys()
            .map(|name| name.capacity() + size_of::<[u16; TRAIL_LEN]>() + entry)
            .sum();
        assert!(bytes < 2_500_000, "{bytes} bytes");
        assert!(bytes / 10_000 < 250, "{} bytes a worker", bytes / 10_000);
    }
}
