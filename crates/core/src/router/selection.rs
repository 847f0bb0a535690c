//! The selection step's state: the table in force and the aggregates of its routable workers'
//! loads, behind the one lock that serialises decisions, load taken and load released, so the
//! aggregates a decision reads are exactly those of the loads it sees.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::table::RoutingTable;
use crate::decide::FleetView;
use crate::fleet_aggregates::FleetAggregates;
use crate::fleet_load::LoadSignal;
use crate::load::{LoadGuard, Release, WorkerStats};
use crate::policy::FleetLoad;

/// The selection lock and what it guards. Guards hold an `Arc` of it: dropping one lowers the
/// load under the lock.
#[derive(Debug)]
pub(super) struct Selection {
    state: Mutex<SelectionState>,
}

/// The table decisions use and the aggregates of its routable workers' local loads.
#[derive(Debug)]
pub(super) struct SelectionState {
    /// The table in force (the same as the router's published one once a publish returns).
    pub(super) table: Arc<RoutingTable>,
    aggregates: FleetAggregates,
}

impl Selection {
    /// The selection state of a router whose first table is `table`.
    pub(super) fn new(table: Arc<RoutingTable>) -> Selection {
        let aggregates = take_slots(None, &table);
        Selection {
            state: Mutex::new(SelectionState { table, aggregates }),
        }
    }

    /// Takes the selection lock. Held only for pure, allocation-free work (a decision, a counter
    /// step, an O(1) aggregate update) or for a writer's install of a new table.
    pub(super) fn lock(&self) -> MutexGuard<'_, SelectionState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Release for Selection {
    fn release(&self, stats: &WorkerStats) {
        let mut state = self.lock();
        if let Some(before) = stats.release()
            && state.counted(stats)
        {
            state.aggregates.lower(before);
        }
    }
}

impl SelectionState {
    /// Puts `table` in force for decisions. With the same membership (a health, drain or policy
    /// change: the worker list is shared) only the workers whose routable flag flipped join or
    /// leave the aggregates; a new membership recounts every worker (O(n), off the request path).
    pub(super) fn install(&mut self, table: Arc<RoutingTable>) {
        if Arc::ptr_eq(&self.table.workers, &table.workers) {
            for (worker, entry) in table.workers.iter().enumerate() {
                let load = entry.stats.active();
                match (self.table.routable[worker], table.routable[worker]) {
                    (false, true) => self.aggregates.add(load),
                    (true, false) => self.aggregates.remove(load),
                    _ => {}
                }
            }
        } else {
            self.aggregates = take_slots(Some(&self.table), &table);
        }
        self.table = table;
    }

    /// Takes one unit of load on `stats` (a worker of the table in force or of an older one) and
    /// moves it up one level in the aggregates when it is counted; `release` lowers it on drop.
    pub(super) fn acquire(
        &mut self,
        stats: &Arc<WorkerStats>,
        release: &Arc<Selection>,
    ) -> LoadGuard {
        let release: Arc<dyn Release> = Arc::clone(release) as Arc<dyn Release>;
        let (guard, before) = stats.acquire(Some(release));
        if self.counted(stats) {
            self.aggregates.raise(before);
        }
        guard
    }

    /// The view a decision reads: the table in force with its kept aggregates.
    pub(super) fn view(&self) -> LiveView<'_> {
        LiveView {
            table: &self.table,
            aggregates: &self.aggregates,
        }
    }

    /// The kept minimum and mean of the routable workers' local loads; `None` when none is
    /// routable.
    pub(super) fn fleet_load(&self) -> Option<FleetLoad> {
        self.aggregates.fleet_load()
    }

    /// Whether `stats` is a routable worker of the table in force (its load is in the aggregates).
    /// A removed worker's guards outlive its table; their releases change nothing here.
    fn counted(&self, stats: &WorkerStats) -> bool {
        stats.slot().is_some_and(|slot| {
            self.table
                .workers
                .get(slot)
                .is_some_and(|worker| std::ptr::eq(&*worker.stats, stats))
                && self.table.routable[slot]
        })
    }
}

/// Records each worker's index in `table` (clearing those of `previous` first, so a removed
/// worker has none) and counts the routable workers' loads.
fn take_slots(previous: Option<&RoutingTable>, table: &RoutingTable) -> FleetAggregates {
    for worker in previous.iter().flat_map(|table| table.workers.iter()) {
        worker.stats.set_slot(None);
    }
    for (index, worker) in table.workers.iter().enumerate() {
        worker.stats.set_slot(Some(index));
    }
    FleetAggregates::of(
        table
            .routable_indices
            .iter()
            .map(|&worker| table.workers[worker].stats.active()),
    )
}

/// The table in force with its kept aggregates: what [`super::Router::route`] decides on. Every
/// answer but [`FleetView::kept_fleet_load`] is the table's.
pub(super) struct LiveView<'a> {
    table: &'a RoutingTable,
    aggregates: &'a FleetAggregates,
}

impl FleetView for LiveView<'_> {
    fn worker_count(&self) -> usize {
        self.table.worker_count()
    }
    fn routable(&self, worker: usize) -> bool {
        FleetView::routable(self.table, worker)
    }
    fn routable_count(&self) -> usize {
        FleetView::routable_count(self.table)
    }
    fn nth_routable(&self, n: usize) -> Option<usize> {
        self.table.nth_routable(n)
    }
    fn kept_fleet_load(&self) -> Option<FleetLoad> {
        self.aggregates.fleet_load()
    }
    fn load(&self, worker: usize) -> u64 {
        self.table.load(worker)
    }
    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        self.table.load_with_signal(worker)
    }
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.table.resolve_target(raw)
    }
    fn limited(&self) -> bool {
        self.table.limited()
    }
    fn capacity(&self, worker: usize) -> Option<u64> {
        FleetView::capacity(self.table, worker)
    }
    fn engine_full(&self, worker: usize) -> bool {
        self.table.engine_full(worker)
    }
}
