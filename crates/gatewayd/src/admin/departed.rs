//! Counters of workers that left the membership, kept so that a worker that comes back (the same
//! URL: a pod that DNS dropped for a moment, a worker removed and re-added) continues its request,
//! spill and error counters instead of starting again from zero, which Prometheus would read as a
//! counter reset.
//!
//! The router keeps a departed worker's counters only while something holds them (its in-flight
//! requests' load guards); this holds them on purpose. The memory is bounded: at most
//! [`DEPARTED_CAP`] departed workers are remembered, the longest gone forgotten first (a fleet
//! whose pods get new addresses on every rollout would otherwise grow it forever).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bch_core::load::WorkerStats;
use bch_core::router::RoutingTable;

use crate::per_worker::{TableKeys, WorkerKey};

/// Most departed workers whose counters are kept (about 100 bytes each).
pub const DEPARTED_CAP: usize = 10_000;

/// The counters of departed workers, by worker, with the order they left in.
#[derive(Debug)]
pub struct Departed {
    by_worker: HashMap<WorkerKey, (u64, Arc<WorkerStats>)>,
    by_age: BTreeMap<u64, WorkerKey>,
    next: u64,
    cap: usize,
}

impl Default for Departed {
    fn default() -> Self {
        Self::with_cap(DEPARTED_CAP)
    }
}

impl Departed {
    /// Remembers at most `cap` departed workers.
    pub fn with_cap(cap: usize) -> Self {
        Self {
            by_worker: HashMap::new(),
            by_age: BTreeMap::new(),
            next: 0,
            cap,
        }
    }

    /// After the router went from `before` to `after`: remembers the counters of the workers that
    /// left, and lets go of those of the workers that are back (the new table holds them now).
    pub fn record(&mut self, before: &RoutingTable, after: &RoutingTable) {
        let now = TableKeys::of(after);
        // A key is built only for a worker that left: one per change, not one per worker.
        for worker in before.workers() {
            if !now.contains_url(&worker.spec.url) {
                self.remember(WorkerKey::of_worker(worker), Arc::clone(&worker.stats));
            }
        }
        for worker in after.workers() {
            if let Some((age, _)) = self.by_worker.remove(worker.spec.url.as_str()) {
                self.by_age.remove(&age);
            }
        }
    }

    /// Workers remembered now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_worker.len()
    }

    /// Whether no departed worker is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_worker.is_empty()
    }

    fn remember(&mut self, worker: WorkerKey, stats: Arc<WorkerStats>) {
        let age = self.next;
        self.next += 1;
        if let Some((old, _)) = self.by_worker.insert(worker.clone(), (age, stats)) {
            self.by_age.remove(&old);
        }
        self.by_age.insert(age, worker);
        while self.by_worker.len() > self.cap {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.by_worker.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bch_core::policy::PolicySettings;
    use bch_core::router::{Router, WorkerSource, WorkerSpec};
    use bch_core::routing_key::{ExplicitKey, RoutingKey};

    fn spec(n: u16) -> WorkerSpec {
        WorkerSpec {
            name: format!("w{n}"),
            url: format!("http://127.0.0.1:{n}"),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        }
    }

    #[test]
    fn a_returning_worker_continues_its_counters_and_the_oldest_are_forgotten_first() {
        let router =
            Router::new(vec![spec(1), spec(2), spec(3)], PolicySettings::default()).unwrap();
        for i in 0..60 {
            let key = format!("k{i}");
            drop(router.route(&RoutingKey::Explicit(
                ExplicitKey::parse(key.as_bytes()).unwrap(),
            )));
        }
        let totals: Vec<u64> = router
            .table()
            .workers()
            .iter()
            .map(|w| w.stats.requests_total())
            .collect();
        assert!(
            totals.iter().all(|t| *t > 0),
            "every worker served some keys: {totals:?}"
        );
        let mut departed = Departed::with_cap(1);
        let before = router.table();
        router
            .reconfigure(vec![], PolicySettings::default())
            .unwrap();
        departed.record(&before, &router.table());
        drop(before);
        assert_eq!(departed.len(), 1, "capped at one: w3 left last and is kept");
        let before = router.table();
        router
            .reconfigure(vec![spec(1), spec(3)], PolicySettings::default())
            .unwrap();
        departed.record(&before, &router.table());
        assert!(departed.is_empty(), "w3 is back, w1 was forgotten");
        let table = router.table();
        assert_eq!(
            table.workers()[0].stats.requests_total(),
            0,
            "w1 starts again"
        );
        assert_eq!(
            table.workers()[1].stats.requests_total(),
            totals[2],
            "w3 continues"
        );
    }
}
