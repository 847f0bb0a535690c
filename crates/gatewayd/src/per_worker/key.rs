//! [`WorkerKey`]: the one key of every per-worker map in gatewayd.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use bch_core::router::{RoutingTable, Worker, WorkerSpec};

/// A worker's identity in every per-worker map (probe streaks, scrape tracks and connections,
/// scrape and probe counters, pending removals, announced drains): its base URL exactly as
/// configured, which is its ring identity unless `ring_id` overrides it. The URL, not the
/// override: a probe, a kept-alive connection and a streak belong to an address, so a worker whose
/// URL changed under the same `ring_id` starts afresh instead of inheriting the old address's
/// connection. Unique in a membership (the router refuses two workers with one URL). A name is
/// for display only: look it up in the table ([`WorkerKey::index_in`]).
///
/// Cheap to clone (a shared string); `Borrow<str>` lets a map keyed by it be queried with a URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerKey(Arc<str>);

impl WorkerKey {
    /// The key of the worker configured as `spec`.
    pub fn of(spec: &WorkerSpec) -> Self {
        WorkerKey(Arc::from(spec.url.as_str()))
    }

    /// The key of a worker of a routing table.
    pub fn of_worker(worker: &Worker) -> Self {
        Self::of(&worker.spec)
    }

    /// Whether this is the key of the worker configured as `spec`.
    pub fn is(&self, spec: &WorkerSpec) -> bool {
        *self.0 == *spec.url
    }

    /// The index of this worker in `table`, `None` when it is not (or no longer) a member.
    pub fn index_in(&self, table: &RoutingTable) -> Option<usize> {
        table.workers().iter().position(|w| self.is(&w.spec))
    }
}

impl Borrow<str> for WorkerKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The keys of one routing table's workers, to forget the per-worker state of workers that left
/// (`map.retain(|key, _| keys.contains(key))`) in one pass rather than a walk of the table per key.
pub struct TableKeys<'t>(HashSet<&'t str>);

impl<'t> TableKeys<'t> {
    /// The keys of `table`'s workers.
    pub fn of(table: &'t RoutingTable) -> Self {
        TableKeys(
            table
                .workers()
                .iter()
                .map(|w| w.spec.url.as_str())
                .collect(),
        )
    }

    /// Whether `key` is one of a worker of the table.
    pub fn contains(&self, key: &WorkerKey) -> bool {
        self.0.contains(&*key.0)
    }

    /// Whether the table has a worker at `url` (a worker's ring identity): no key is built, so a
    /// whole-table pass asks without allocating.
    pub fn contains_url(&self, url: &str) -> bool {
        self.0.contains(url)
    }
}
