//! The selection step's state: the table in force and the aggregates of its routable workers'
//! loads, behind the one lock that serialises decisions, load taken and load released, and
//! worker samples published, marked stale or cleared, so the aggregates a decision reads are
//! exactly those of the loads it sees.
//!
//! The load counted per worker is the one the rule reads under the table's load source. In
//! `worker_metrics` mode with a fresh sample that is `local + max(0, reported − local_at_scrape)`
//! (the formula of [`crate::fleet_load`], with the cell's capped fields far from `u64`'s range),
//! so a request taken or released still moves the worker exactly one level, and only a sample
//! change moves it further.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::pool::{PoolId, PoolView, kept_signal, to_table_indices};
use super::pool_table::no_pool;
use super::table::RoutingTable;
use crate::decide::{Decision, FleetView, decide};
use crate::fleet_aggregates::FleetAggregates;
use crate::fleet_load::{LoadSignal, LoadSource, SampleCell};
use crate::load::{LoadGuard, Release, WorkerStats};
use crate::policy::FleetLoad;
use crate::routing_key::RoutingKey;

/// The selection lock and what it guards. Guards hold an `Arc` of it: dropping one lowers the
/// load under the lock.
#[derive(Debug)]
pub(super) struct Selection {
    state: Mutex<SelectionState>,
}

/// The table decisions use and, per pool, the aggregates of its routable workers' loads as the
/// rule reads them. A worker's load change moves it in every pool it is in (usually one).
#[derive(Debug)]
pub(super) struct SelectionState {
    /// The table in force (the same as the router's published one once a publish returns).
    pub(super) table: Arc<RoutingTable>,
    /// Per pool ([`PoolId`] order): the aggregates of its routable workers' loads.
    aggregates: Vec<FleetAggregates>,
    /// Per pool: its routable workers whose counted load came from a fresh sample (always 0 in
    /// `local` mode): with the routable count it gives a decision's [`LoadSignal`] in O(1).
    sampled: Vec<usize>,
}

impl Selection {
    /// The selection state of a router whose first table is `table`.
    pub(super) fn new(table: Arc<RoutingTable>) -> Selection {
        let (aggregates, sampled) = take_slots(None, &table);
        Selection {
            state: Mutex::new(SelectionState {
                table,
                aggregates,
                sampled,
            }),
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
            && let Some(worker) = state.counted(stats)
        {
            let (load, _) = state.counted_load(stats, before);
            let SelectionState {
                table, aggregates, ..
            } = &mut *state;
            if !table.has_models() {
                // One pool of every worker: the one-pool hot path reads no membership table.
                aggregates[0].lower(load);
                return;
            }
            for pool in table.pools_of_worker(worker) {
                aggregates[pool.index()].lower(load);
            }
        }
    }
}

impl SelectionState {
    /// Puts `table` in force for decisions. With the same membership (a health, drain or policy
    /// change: the worker list is shared) only `flipped`, the one worker whose routable flag may
    /// differ from the table in force (`None` when no flag changed), joins or leaves the
    /// aggregates: O(1), whatever the fleet. A new membership or a new load source recounts every
    /// worker (O(n), off the request path) and reads no `flipped`.
    pub(super) fn install(&mut self, table: Arc<RoutingTable>, flipped: Option<usize>) {
        let same_source = self.table.policy.load_source == table.policy.load_source;
        if Arc::ptr_eq(&self.table.workers, &table.workers) && same_source {
            // O(1) check that no other worker flipped: the routable count moves by `flipped` only.
            let moved = flipped.map_or(0, |w| {
                usize::from(table.routable[w]) as isize
                    - usize::from(self.table.routable[w]) as isize
            });
            debug_assert_eq!(
                table.routable_count as isize - self.table.routable_count as isize,
                moved,
                "a routable flag flipped that the caller did not name"
            );
            if let Some(worker) = flipped {
                self.flip(&table, worker);
            }
        } else {
            (self.aggregates, self.sampled) = take_slots(Some(&self.table), &table);
        }
        self.table = table;
    }

    /// Moves `worker` into or out of its pools' aggregates when its routable flag differs between
    /// the table in force and `table` (of the same worker list, so of the same pools).
    fn flip(&mut self, table: &RoutingTable, worker: usize) {
        let joins = match (self.table.routable[worker], table.routable[worker]) {
            (false, true) => true,
            (true, false) => false,
            _ => return,
        };
        let stats = &table.workers[worker].stats;
        let (load, signal) = rule_load(table.policy.load_source, stats, stats.active());
        let sampled = usize::from(signal == LoadSignal::WorkerMetrics);
        for pool in table.pools_of_worker(worker) {
            let pool = pool.index();
            if joins {
                self.aggregates[pool].add(load);
                self.sampled[pool] += sampled;
            } else {
                self.aggregates[pool].remove(load);
                self.sampled[pool] -= sampled;
            }
        }
    }

    /// Changes `stats`'s sample cell with `change` (publish, mark stale or clear) and, when the
    /// worker is counted, moves it to its new load level in the aggregates: one worker, O(1)
    /// except when it leaves the minimum's level last (a search over load levels, not workers).
    pub(super) fn change_sample(&mut self, stats: &WorkerStats, change: impl FnOnce(&SampleCell)) {
        let counted = self.counted(stats);
        let local = stats.active();
        let before = self.counted_load(stats, local);
        change(stats.fleet_sample());
        let Some(worker) = counted else {
            return;
        };
        let after = self.counted_load(stats, local);
        for pool in self.table.pools_of_worker(worker) {
            let pool = pool.index();
            if before.0 != after.0 {
                self.aggregates[pool].remove(before.0);
                self.aggregates[pool].add(after.0);
            }
            match (before.1, after.1) {
                (LoadSignal::WorkerMetrics, LoadSignal::WorkerMetrics) => {}
                (LoadSignal::WorkerMetrics, _) => self.sampled[pool] -= 1,
                (_, LoadSignal::WorkerMetrics) => self.sampled[pool] += 1,
                _ => {}
            }
        }
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
        if let Some(worker) = self.counted(stats) {
            let (load, _) = self.counted_load(stats, before);
            if !self.table.has_models() {
                // One pool of every worker: the one-pool hot path reads no membership table.
                self.aggregates[0].raise(load);
                return guard;
            }
            for pool in self.table.pools_of_worker(worker) {
                self.aggregates[pool.index()].raise(load);
            }
        }
        guard
    }

    /// The decision in `pool` on the table in force, reading the pool's kept aggregates. A pool
    /// that holds every worker decides on the table itself (its indices are the table's, its ring
    /// the table's): exactly the one-pool decision. A pool the table does not have gets no worker.
    #[inline]
    pub(super) fn decide_in(
        &self,
        pool: PoolId,
        key: &RoutingKey<'_>,
        entropy: u64,
        turn: u64,
    ) -> Decision {
        let table = &*self.table;
        if pool == PoolId::FIRST && !table.has_models() {
            // The one pool of a fleet without models: exactly the one-pool decision, with no
            // pool lookup on the hot path.
            let view = LiveView {
                table,
                aggregates: &self.aggregates[0],
                sampled: self.sampled[0],
            };
            return decide(&table.ring, &table.policy, key, &view, entropy, turn);
        }
        let index = pool.index();
        let (Some(members), Some(aggregates)) = (table.pool(pool), self.aggregates.get(index))
        else {
            return no_pool();
        };
        let sampled = self.sampled[index];
        if members.covers(table.workers.len()) {
            let view = LiveView {
                table,
                aggregates,
                sampled,
            };
            return decide(members.ring(), &table.policy, key, &view, entropy, turn);
        }
        let view = PoolView {
            fleet: table,
            pool: members,
            routable: &table.pool_routable[index],
            kept: Some((aggregates, sampled)),
        };
        let decision = decide(members.ring(), &table.policy, key, &view, entropy, turn);
        to_table_indices(members, decision)
    }

    /// The kept minimum and mean of `pool`'s routable workers' loads as the rule reads them;
    /// `None` when none is routable or the table has no such pool.
    pub(super) fn fleet_load(&self, pool: PoolId) -> Option<FleetLoad> {
        self.aggregates.get(pool.index())?.fleet_load()
    }

    /// The load the rule reads for `stats` when this replica has `local` requests on it, and its
    /// signal, under the load source in force.
    fn counted_load(&self, stats: &WorkerStats, local: u64) -> (u64, LoadSignal) {
        rule_load(self.table.policy.load_source, stats, local)
    }

    /// The table index of `stats`'s worker when it is a routable worker of the table in force
    /// (its load is in the aggregates of its pools). A removed worker's guards outlive its table;
    /// their releases change nothing here.
    fn counted(&self, stats: &WorkerStats) -> Option<usize> {
        let slot = stats.slot()?;
        let worker = self.table.workers.get(slot)?;
        (std::ptr::eq(&*worker.stats, stats) && self.table.routable[slot]).then_some(slot)
    }
}

/// The load the rule reads under `source` for a worker with `local` requests from this replica,
/// and which signal it came from: the same numbers as the table's [`FleetView::load_with_signal`].
fn rule_load(source: LoadSource, stats: &WorkerStats, local: u64) -> (u64, LoadSignal) {
    match source {
        LoadSource::Local => (local, LoadSignal::Local),
        LoadSource::WorkerMetrics => match stats.fleet_sample().fresh() {
            Some(sample) => (sample.load(local), LoadSignal::WorkerMetrics),
            None => (local, LoadSignal::Local),
        },
    }
}

/// Records each worker's index in `table` (clearing those of `previous` first, so a removed
/// worker has none) and counts, per pool, the routable workers' loads and how many came from a
/// fresh sample.
fn take_slots(
    previous: Option<&RoutingTable>,
    table: &RoutingTable,
) -> (Vec<FleetAggregates>, Vec<usize>) {
    for worker in previous.iter().flat_map(|table| table.workers.iter()) {
        worker.stats.set_slot(None);
    }
    for (index, worker) in table.workers.iter().enumerate() {
        worker.stats.set_slot(Some(index));
    }
    let source = table.policy.load_source;
    (table.pools().iter().zip(&table.pool_routable))
        .map(|(pool, routable)| {
            let mut sampled = 0;
            let aggregates = FleetAggregates::of(routable.iter().map(|&local| {
                let stats = &table.workers[pool.workers()[local]].stats;
                let (load, signal) = rule_load(source, stats, stats.active());
                sampled += usize::from(signal == LoadSignal::WorkerMetrics);
                load
            }));
            (aggregates, sampled)
        })
        .unzip()
}

/// The table in force with the kept aggregates of a pool of every worker: what
/// [`super::Router::route`] decides on in a fleet without models. Every
/// answer but [`FleetView::kept_fleet_load`] and [`FleetView::kept_load_signal`] is the table's.
pub(super) struct LiveView<'a> {
    table: &'a RoutingTable,
    aggregates: &'a FleetAggregates,
    sampled: usize,
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
    fn kept_load_signal(&self) -> Option<LoadSignal> {
        Some(kept_signal(self.aggregates, self.sampled))
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
