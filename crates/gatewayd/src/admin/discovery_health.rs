//! The admin owner's side of discovery health: each source's task reports its resolutions here,
//! and the control plane and telemetry read the records (the board is in `discovery_status`).

use bch_core::telemetry::DiscoverySource;

use super::Admin;
use super::discovery_status::{ResolutionOutcome, StateChange};
use crate::config::DiscoveryConfig;

impl Admin {
    /// A source's task started (at start-up, or restarted by a reload): its state is `pending`
    /// until its first resolution.
    pub fn discovery_started(&self, source: &DiscoveryConfig) {
        self.health_board.start(source);
        self.publish_discovery();
    }

    /// Records one resolution of `source` at `now_ms` (ms since the Unix epoch), after its set (if
    /// any) was applied, and tells telemetry. Answers the state change, for the task to log once.
    /// A resolution of an entry no longer in force (a reload changed or removed it while it ran)
    /// is not recorded: a changed entry's new task reports the source's state.
    pub fn record_resolution(
        &self,
        source: &DiscoveryConfig,
        outcome: ResolutionOutcome,
        now_ms: u64,
    ) -> Option<StateChange> {
        let change = {
            // Checked and recorded while the list in force is borrowed: a reload waits to change
            // it until the record is made, and the restarted task's `pending` comes after both.
            let in_force = self.sources.borrow();
            if !in_force.contains(source) {
                return None;
            }
            self.health_board.record(source, outcome, now_ms)
        };
        self.publish_discovery();
        change
    }

    /// Every source in force, in configuration order, as seen at `now_ms` (ms since the Unix
    /// epoch).
    pub fn discovery_health(&self, now_ms: u64) -> Vec<DiscoverySource> {
        self.discovery_records()
            .into_iter()
            .map(|source| source.at(now_ms))
            .collect()
    }

    /// Every source in force without ages (telemetry adds them to each frame, and compares
    /// records without them).
    fn discovery_records(&self) -> Vec<DiscoverySource> {
        let sources = self.sources.borrow().clone();
        self.health_board.records(&sources, &self.router.table())
    }

    /// Hands the sources' records to telemetry (which sends them on when they changed).
    pub(super) fn publish_discovery(&self) {
        self.telemetry.discovery_changed(self.discovery_records());
    }
}
