//! The live router: an immutable [`RoutingTable`] (ring + workers + health + policy) swapped
//! atomically, and the selection step that decides and takes load in one go.
//!
//! Readers never lock the table: they load an `Arc` from an [`ArcSwap`]. Writers (membership, health,
//! policy changes — rare, off the data path) build a new table and swap it in; only a membership or
//! `virtual_nodes` change rebuilds the ring, health and threshold changes reuse the same `Arc<Ring>`.
//!
//! Selection and the load increment are one atomic step with respect to other selections: a short
//! `std::sync::Mutex` (the selection lock) serialises them, so a burst of same-key requests sees
//! each other's load (the 6:2 burst vectors depend on it). Under the same lock the router keeps
//! the fleet aggregates of the table in force — routable count, sum and minimum of the routable
//! workers' loads as the rule reads them ([`crate::fleet_aggregates`]), and how many came from a
//! fresh worker sample — so a bounded decision reads them in O(1) instead of summing the fleet:
//! every change to a load goes through the lock (a release, on guard drop, takes it too; a
//! sample published, marked stale or cleared through [`Router::publish_sample`] and its
//! siblings), and so does every table put in force (a health or drain flip updates its one
//! worker, a policy change none; a new membership or load source recounts, O(n), off the
//! request path). The lock is held only for the pure, allocation-free decision and O(1) counter
//! and aggregate steps — never across an `.await` or I/O — so no slow task can hold it. A guard
//! released after its worker left the table in force lowers the counter and leaves the
//! aggregates alone (they no longer count that worker).
//!
//! A configuration change is two steps: [`Router::prepare`] takes every fallible one (checks, the
//! new ring) and changes nothing, [`Router::commit`] swaps and cannot fail, so a caller that
//! prepares more between the two never has anything to roll back. Files: `table` (the snapshot,
//! its walk over routable workers and how it is built), `flip` (the next table after one worker's
//! health or state flipped, derived from the one in force), `selection` (the selection lock's
//! state: the table decisions use and its aggregates), `tests`.

mod flip;
mod pool;
mod pool_table;
mod selection;
mod table;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use arc_swap::ArcSwap;

use crate::decide::Decision;
use crate::fleet_load::{FleetSample, SampleCell};
use crate::load::{LoadGuard, WorkerStats};
use crate::policy::{FleetLoad, PolicyError, PolicyPatch, PolicySettings};
use crate::ring::Ring;
use crate::routing_key::RoutingKey;
pub use crate::telemetry::WorkerSource;
use crate::telemetry::WorkerState;
pub use pool::{Pool, PoolId};
use selection::Selection;
use table::{CounterRegistry, build_ring, build_table, same_workers};
pub use table::{
    MembershipError, RoutingTable, Worker, WorkerSpec, resolve_target, validate_membership,
};

/// A routed request: the table it was decided on, the decision, and the load guard when a worker
/// was chosen. Keep the guard alive until the response body ends.
#[derive(Debug)]
pub struct Routed {
    /// Snapshot the decision used (resolve `decision.worker` against it).
    pub table: Arc<RoutingTable>,
    /// Where the request goes and why.
    pub decision: Decision,
    /// Load on the chosen worker; `None` when no worker was chosen.
    pub guard: Option<LoadGuard>,
    /// The pool of `table` the decision was taken in (its model names the decision's pool in
    /// per-model counters).
    pub pool: PoolId,
}

/// The router: current table plus the selection step.
#[derive(Debug)]
pub struct Router {
    table: ArcSwap<RoutingTable>,
    selection: Arc<Selection>,
    writer: Mutex<CounterRegistry>,
    turn: AtomicU64,
    entropy: AtomicU64,
    observer: OnceLock<Observer>,
}

/// What [`Router::observe`] calls with every table put in force.
type TableObserver = Box<dyn Fn(&RoutingTable) + Send + Sync>;

/// The observer, behind a `Debug` that names it (closures have none).
struct Observer(TableObserver);

impl std::fmt::Debug for Observer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Observer")
    }
}

impl Router {
    /// A router over `workers` (all healthy at start) with `policy`.
    pub fn new(workers: Vec<WorkerSpec>, policy: PolicySettings) -> Result<Router, RouterError> {
        Router::with_initial_health(workers, policy, true)
    }

    /// A router over `workers` with `policy`, where every worker, at start and when added later,
    /// begins `healthy` or not (a gateway that waits for a worker's first probe before sending it
    /// traffic starts them unhealthy).
    pub fn with_initial_health(
        workers: Vec<WorkerSpec>,
        policy: PolicySettings,
        healthy: bool,
    ) -> Result<Router, RouterError> {
        policy.validate()?;
        validate_membership(&workers)?;
        let mut registry = CounterRegistry {
            new_workers_unhealthy: !healthy,
            ..CounterRegistry::default()
        };
        let table = Arc::new(build_table(&mut registry, workers, policy, None, 0, None));
        Ok(Router {
            selection: Arc::new(Selection::new(Arc::clone(&table))),
            table: ArcSwap::new(table),
            writer: Mutex::new(registry),
            turn: AtomicU64::new(0),
            entropy: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
            observer: OnceLock::new(),
        })
    }

    /// Has `observer` called with the table in force now and then with every table swapped in
    /// afterwards (health, state, policy and membership changes), in the order they are put in
    /// force: one signal for everything that reacts to routing changes (a health service's
    /// readiness), where polling would lag. It runs with the writer's lock held, never on
    /// [`Router::route`]'s path, so it must be quick and must not change the router. One observer
    /// per router: `false` (and `observer` dropped) when one is already set.
    pub fn observe(&self, observer: impl Fn(&RoutingTable) + Send + Sync + 'static) -> bool {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if self.observer.set(Observer(Box::new(observer))).is_err() {
            return false;
        }
        if let Some(Observer(observer)) = self.observer.get() {
            observer(&self.table.load());
        }
        true
    }

    /// Puts `table` in force — for decisions, with the fleet aggregates brought up to date (the
    /// worker whose routable flag may have flipped, `flipped`, or a recount on a new membership),
    /// and for readers — and tells the observer; callers hold the writer's lock, so observers see
    /// tables in the order they were put in force. Every table goes in force through here.
    fn publish(&self, table: Arc<RoutingTable>, flipped: Option<usize>) {
        {
            let mut selection = self.selection.lock();
            selection.install(Arc::clone(&table), flipped);
            self.table.store(Arc::clone(&table));
        }
        if let Some(Observer(observer)) = self.observer.get() {
            observer(&table);
        }
    }

    /// The table in force now: one lock-free load (an `Arc` clone).
    pub fn table(&self) -> Arc<RoutingTable> {
        self.table.load_full()
    }

    /// Decides and takes load on the chosen worker, as one step relative to other selections: a
    /// worker's capacity is compared with its load inside the step, so concurrent routes never
    /// take a worker past its cap through this replica's load. A decision without a worker and
    /// with [`Decision::wait`] set found every worker it may use full: the caller queues the
    /// request (or sheds it) and calls `route` again when a slot may have freed.
    ///
    /// Routes in [`PoolId::FIRST`]: the one pool of a fleet that declares no model. With several
    /// pools that is the first model by name; a caller that routes by model uses
    /// [`Router::route_in`].
    #[inline]
    pub fn route(&self, key: &RoutingKey<'_>) -> Routed {
        self.route_in(key, PoolId::FIRST)
    }

    /// [`Router::route`] within `pool` (from [`RoutingTable::pool_of_model`] on the table in
    /// force): the pool's ring, the bounded rule over the pool's routable workers' loads (its own
    /// kept minimum and mean), the keyless pick among them; a target worker outside the pool is a
    /// miss. The decision names workers by table index. A pool the table in force does not have
    /// (a membership change renumbered them) gets no worker (`no_healthy_workers`).
    pub fn route_in(&self, key: &RoutingKey<'_>, pool: PoolId) -> Routed {
        let entropy = self.next_entropy();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let (table, decision, guard) = {
            let mut selection = self.selection.lock();
            let table = Arc::clone(&selection.table);
            let decision = selection.decide_in(pool, key, entropy, turn);
            let guard = decision
                .worker
                .map(|w| selection.acquire(&table.workers[w].stats, &self.selection));
            (table, decision, guard)
        };
        if decision.branch.moved()
            && let (Some(from), Some(to)) = (decision.preferred, decision.worker)
        {
            table.workers[from].stats.record_spill_out();
            table.workers[to].stats.record_spill_in();
        }
        Routed {
            table,
            decision,
            guard,
            pool,
        }
    }

    /// The retry pick after a connection to `failed` could not be made: the next routable worker
    /// clockwise from the key (skipping `failed`), or for keyless requests the least loaded other
    /// routable worker; full workers are skipped like `failed`. Takes load like
    /// [`Router::route`]. `None` when no other routable worker with room exists. Within
    /// [`PoolId::FIRST`], like [`Router::route`].
    pub fn route_retry(
        &self,
        table: &Arc<RoutingTable>,
        key: &RoutingKey<'_>,
        failed: usize,
    ) -> Option<(usize, LoadGuard)> {
        self.route_retry_in(table, key, failed, PoolId::FIRST)
    }

    /// [`Router::route_retry`] within `pool` of `table`: the walk on the pool's ring, or the least
    /// loaded of the pool's other routable workers. Table indices in and out.
    pub fn route_retry_in(
        &self,
        table: &Arc<RoutingTable>,
        key: &RoutingKey<'_>,
        failed: usize,
        pool: PoolId,
    ) -> Option<(usize, LoadGuard)> {
        let mut selection = self.selection.lock();
        let skip = |w: usize| w == failed || table.full(w);
        let next = match key.position() {
            Some(position) => table.routable_from_in(pool, position, skip).next(),
            None => table.least_loaded_routable_in(pool, skip),
        }?;
        let guard = selection.acquire(&table.workers[next].stats, &self.selection);
        Some((next, guard))
    }

    /// Takes load on `worker` of `table`, a worker chosen outside the router: the fallback an
    /// external proxy (Envoy, with gatewayd as its endpoint picker) served a request from after
    /// the chosen worker failed. An increment inside the selection step like every other, so
    /// concurrent selections see it. `None` when `worker` is not an index of `table`.
    pub fn reserve(&self, table: &RoutingTable, worker: usize) -> Option<LoadGuard> {
        let stats = &table.workers.get(worker)?.stats;
        let mut selection = self.selection.lock();
        Some(selection.acquire(stats, &self.selection))
    }

    /// The minimum and mean load the bounded rule reads (this process's own in-flight requests in
    /// `local` mode, [`crate::fleet_load::fleet_load`] in `worker_metrics` mode) over the routable
    /// workers of the table in force, as the router keeps them: always equal to [`FleetLoad::of`]
    /// over those loads. `None` when no worker is routable. Takes the selection lock; O(1). In
    /// [`PoolId::FIRST`], like [`Router::route`].
    pub fn fleet_load(&self) -> Option<FleetLoad> {
        self.fleet_load_in(PoolId::FIRST)
    }

    /// [`Router::fleet_load`] over `pool`'s routable workers: the minimum and mean its bounded rule
    /// reads. `None` when none is routable or the table in force has no such pool. O(1).
    pub fn fleet_load_in(&self, pool: PoolId) -> Option<FleetLoad> {
        self.selection.lock().fleet_load(pool)
    }

    /// Publishes a good scrape of the worker whose counters are `stats`, taken at `scraped_at_ms`
    /// (wall clock, ms): [`SampleCell::publish`] under the selection lock, which moves the worker
    /// to its new load level in the kept aggregates when it is routable in the table in force and
    /// the policy reads `worker_metrics`. The one way a scraper publishes, so decisions never read
    /// aggregates behind the cells. O(1) but for a search over load levels when the worker was
    /// the last at the minimum.
    pub fn publish_sample(&self, stats: &WorkerStats, sample: FleetSample, scraped_at_ms: u64) {
        self.selection
            .lock()
            .change_sample(stats, |cell| cell.publish(sample, scraped_at_ms));
    }

    /// [`SampleCell::mark_stale`] for `stats`'s worker, under the selection lock like
    /// [`Router::publish_sample`]: the rule falls back to its local load.
    pub fn mark_sample_stale(&self, stats: &WorkerStats) {
        self.selection
            .lock()
            .change_sample(stats, SampleCell::mark_stale);
    }

    /// [`SampleCell::clear`] for `stats`'s worker, under the selection lock like
    /// [`Router::publish_sample`]: as if it had never been scraped.
    pub fn clear_sample(&self, stats: &WorkerStats) {
        self.selection
            .lock()
            .change_sample(stats, SampleCell::clear);
    }

    /// Marks a worker healthy or unhealthy by name. Reuses the ring and everything else the
    /// membership fixes; the cost is the flip's, not the fleet's: a binary search for the name,
    /// copies of the per-worker flags and routable lists, one worker moved in the aggregates.
    /// Returns `true` if the health changed, `false` if it was already so or the worker is
    /// unknown.
    pub fn set_health(&self, name: &str, healthy: bool) -> bool {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let Some(index) = current.index_of(name) else {
            return false;
        };
        if current.healthy[index] == healthy {
            return false;
        }
        current.workers[index].stats.record_health_change();
        let table = current.with_worker_flags(index, healthy, current.states[index]);
        self.publish(Arc::new(table), Some(index));
        true
    }

    /// Sets a worker's operator state by name (`draining` takes it out of routing like an
    /// unhealthy worker, without touching its health). Reuses the ring and costs the flip, like
    /// [`Router::set_health`]. `None` when no worker has this name; otherwise whether the state
    /// changed.
    pub fn set_state(&self, name: &str, state: WorkerState) -> Option<bool> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let index = current.index_of(name)?;
        if current.states[index] == state {
            return Some(false);
        }
        let table = current.with_worker_flags(index, current.healthy[index], state);
        self.publish(Arc::new(table), Some(index));
        Some(true)
    }

    /// Applies a policy patch atomically; a refused patch changes nothing. Thresholds and kind reuse
    /// the ring; a new `virtual_nodes` rebuilds it.
    pub fn set_policy(&self, patch: &PolicyPatch) -> Result<PolicySettings, PolicyError> {
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let policy = current.policy.patched(patch)?;
        let table = if policy.virtual_nodes != current.policy.virtual_nodes {
            let specs = current.workers.iter().map(|w| w.spec.clone()).collect();
            build_table(
                &mut registry,
                specs,
                policy,
                Some(&current),
                current.membership_generation + 1,
                None,
            )
        } else {
            current.with_flags(current.healthy.clone(), current.states.clone(), policy)
        };
        self.publish(Arc::new(table), None);
        Ok(policy)
    }

    /// Adds a worker (active, and healthy unless new workers start unhealthy). Derives the new
    /// ring from the one in force: only the new worker's points are hashed.
    pub fn add_worker(&self, spec: WorkerSpec) -> Result<(), MembershipError> {
        self.change_membership(|specs| {
            specs.push(spec);
            Ok(())
        })
    }

    /// Removes the worker called `name` and returns its spec. Requests already routed to it keep
    /// their guards; no new request is routed to it once this returns.
    pub fn remove_worker(&self, name: &str) -> Result<WorkerSpec, MembershipError> {
        let mut removed = None;
        self.change_membership(|specs| {
            let index = specs
                .iter()
                .position(|s| s.name == name)
                .ok_or_else(|| MembershipError::UnknownWorker(name.to_owned()))?;
            removed = Some(specs.remove(index));
            Ok(())
        })?;
        Ok(removed.expect("set on success"))
    }

    /// Replaces the worker list and the whole policy in one swap (configuration reload): readers see
    /// either the old table or the new one, never new workers with the old thresholds. Both are
    /// validated first; on error nothing changes. Workers that stay keep their counters and health.
    pub fn reconfigure(
        &self,
        workers: Vec<WorkerSpec>,
        policy: PolicySettings,
    ) -> Result<(), RouterError> {
        policy.validate()?;
        validate_membership(&workers)?;
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let table = build_table(
            &mut registry,
            workers,
            policy,
            Some(&current),
            current.membership_generation + 1,
            None,
        );
        self.publish(Arc::new(table), None);
        Ok(())
    }

    /// Takes every fallible step of a configuration change ahead of [`Router::commit`]: checks
    /// `policy` and the worker list (as [`Router::reconfigure`] does) and builds the new ring when
    /// the workers or `virtual_nodes` differ from the table in force. Changes nothing: a caller
    /// with more to check or prepare (endpoints, say) does it between the two steps, and drops the
    /// prepared table if something else fails. `initial_health` is how workers that join start.
    pub fn prepare(
        &self,
        workers: Vec<WorkerSpec>,
        policy: PolicySettings,
        initial_health: bool,
    ) -> Result<PreparedTable, RouterError> {
        policy.validate()?;
        validate_membership(&workers)?;
        let current = self.table.load_full();
        let keeps_workers = same_workers(&current, &workers);
        let keeps_ring = keeps_workers && current.policy.virtual_nodes == policy.virtual_nodes;
        let ring =
            (!keeps_ring).then(|| build_ring(&workers, policy.virtual_nodes, Some(&current)));
        Ok(PreparedTable {
            workers,
            policy,
            initial_health,
            keeps_workers,
            ring,
        })
    }

    /// Puts a prepared change in force in one swap, and from now on starts joining workers with
    /// its initial health. Cannot fail. Workers that stay (same URL) keep their counters, health
    /// and state. When the worker list is the one in force (same specs, same order) and so is
    /// `virtual_nodes`, the ring and the membership generation are kept (a threshold or kind
    /// change), and a change that changes nothing swaps nothing; otherwise the membership
    /// generation increases by one. Returns the table in force afterwards.
    pub fn commit(&self, prepared: PreparedTable) -> Arc<RoutingTable> {
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        registry.new_workers_unhealthy = !prepared.initial_health;
        let current = self.table.load_full();
        let PreparedTable {
            workers,
            policy,
            ring,
            ..
        } = prepared;
        let table = if same_workers(&current, &workers)
            && current.policy.virtual_nodes == policy.virtual_nodes
        {
            if current.policy == policy {
                return current;
            }
            current.with_flags(current.healthy.clone(), current.states.clone(), policy)
        } else {
            build_table(
                &mut registry,
                workers,
                policy,
                Some(&current),
                current.membership_generation + 1,
                ring,
            )
        };
        let table = Arc::new(table);
        self.publish(Arc::clone(&table), None);
        table
    }

    fn change_membership(
        &self,
        edit: impl FnOnce(&mut Vec<WorkerSpec>) -> Result<(), MembershipError>,
    ) -> Result<(), MembershipError> {
        let mut registry = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.table.load_full();
        let mut specs: Vec<WorkerSpec> = current.workers.iter().map(|w| w.spec.clone()).collect();
        edit(&mut specs)?;
        validate_membership(&specs)?;
        let table = build_table(
            &mut registry,
            specs,
            current.policy,
            Some(&current),
            current.membership_generation + 1,
            None,
        );
        self.publish(Arc::new(table), None);
        Ok(())
    }

    /// SplitMix64 over an atomic state: cheap, lock-free, good enough for load-balancing picks (no
    /// security role).
    fn next_entropy(&self) -> u64 {
        let mut z = self
            .entropy
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A worker list and policy that passed every check of [`Router::prepare`], with the ring it
/// needs built ahead; [`Router::commit`] puts it in force.
#[derive(Debug)]
pub struct PreparedTable {
    workers: Vec<WorkerSpec>,
    policy: PolicySettings,
    initial_health: bool,
    /// Whether the table in force at preparation had exactly these workers, in this order.
    keeps_workers: bool,
    /// The new ring; `None` when the one in force is reused (same workers and `virtual_nodes`).
    ring: Option<Arc<Ring>>,
}

impl PreparedTable {
    /// The policy the change puts in force.
    pub fn policy(&self) -> &PolicySettings {
        &self.policy
    }

    /// Whether the table in force when this was prepared had exactly these workers, in this order:
    /// the change is one of policy only, and needs no new endpoints.
    pub fn keeps_workers(&self) -> bool {
        self.keeps_workers
    }
}

/// Errors from [`Router::new`], [`Router::reconfigure`] and [`Router::prepare`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouterError {
    /// The policy settings are out of range.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The worker list breaks a uniqueness rule or has an empty field.
    #[error(transparent)]
    Membership(#[from] MembershipError),
}
