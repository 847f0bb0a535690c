//! Pools by model: the workers that serve one model, with their own ring, so one gateway routes
//! several models, each with its own bounded rule (the fleet minimum and mean over the pool's
//! workers only) while a worker's load and capacity stay the worker's.
//!
//! A fleet in which no worker declares a model has exactly one pool of every worker whose ring is
//! the table's ring: placement is what it always was. Otherwise there is one pool per distinct
//! model name, in name order (bytes), and a worker is in the pool of each model it declares (a
//! worker that declares none is in no pool). A pool's ring is the ring a router over only its
//! workers builds, derived from the table's ring without hashing ([`Ring::rebuilt`]); its
//! worker `i` is the pool's `i`-th worker, and [`PoolView`] maps those pool indices to table
//! indices and back, so [`crate::decide::decide`] runs unchanged inside a pool.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::admission::Wait;
use crate::decide::{Decision, FleetView};
use crate::fleet_aggregates::FleetAggregates;
use crate::fleet_load::LoadSignal;
use crate::policy::FleetLoad;
use crate::ring::Ring;

/// A pool's index into [`super::RoutingTable::pools`], found by
/// [`super::RoutingTable::pool_of_model`]. Valid for the tables of one membership: a membership
/// change can renumber pools (a new model sorts in), so look it up on the table you route with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PoolId(u32);

impl PoolId {
    /// The first pool: the only one of a fleet that declares no model (and the one
    /// [`super::Router::route`] routes in).
    pub const FIRST: PoolId = PoolId(0);

    /// The pool at `index` of [`super::RoutingTable::pools`].
    ///
    /// # Panics
    /// If `index` exceeds `u32::MAX` (no table has that many pools).
    pub fn new(index: usize) -> PoolId {
        PoolId(u32::try_from(index).expect("a pool index fits in u32"))
    }

    /// Its index into [`super::RoutingTable::pools`].
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The workers of one model (or every worker, when no worker declares a model) and their ring.
#[derive(Debug)]
pub struct Pool {
    model: Option<Arc<str>>,
    ring: Arc<Ring>,
    workers: Vec<usize>,
}

impl Pool {
    /// The model its workers serve; `None` only for the single pool of a fleet that declares no
    /// model.
    pub fn model(&self) -> Option<&Arc<str>> {
        self.model.as_ref()
    }

    /// The ring over this pool's workers only: its worker `i` is [`Pool::workers`]`[i]`. Equal to
    /// `Ring::build` over their ring identities, in configuration order.
    #[inline]
    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// The pool's workers as table indices, ascending (configuration order).
    pub fn workers(&self) -> &[usize] {
        &self.workers
    }

    /// Whether the worker at table index `worker` is in this pool.
    pub fn contains(&self, worker: usize) -> bool {
        self.local(worker).is_some()
    }

    /// The pool index (its ring's worker index) of table index `worker`, if it is in the pool.
    /// A binary search: O(log pool size).
    pub(super) fn local(&self, worker: usize) -> Option<usize> {
        self.workers.binary_search(&worker).ok()
    }

    /// Whether the pool holds every worker of a table of `worker_count`: then pool indices are
    /// table indices and its ring is the table's.
    #[inline]
    pub(super) fn covers(&self, worker_count: usize) -> bool {
        self.workers.len() == worker_count
    }
}

/// A table's pools and, per worker, the pools it is in: what one membership fixes, shared by
/// every table of that membership (health, drain and policy changes reuse it).
#[derive(Debug)]
pub(super) struct PoolSet {
    pools: Vec<Pool>,
    /// With models declared, worker `w`'s pools are `memberships[offsets[w]..offsets[w + 1]]`,
    /// ascending. Both empty without models: every worker is in the one pool, answered without
    /// a lookup (the one-pool hot path reads no membership table).
    offsets: Vec<usize>,
    memberships: Vec<PoolId>,
    worker_count: usize,
    /// Whether some worker declares a model.
    declared: bool,
}

/// The pools of a worker of a fleet without models.
const ONLY_THE_FIRST: &[PoolId] = &[PoolId::FIRST];

impl PoolSet {
    /// The pools of workers whose models are `models[w]` and ring identities `ring_ids[w]`, with
    /// `ring` the ring over all of them: one pool of every worker when no model is declared,
    /// else one per distinct model name in name order. Pool rings are derived from `ring`
    /// (dropping other workers' points, no hashing). Duplicate names in one worker's list count
    /// once.
    pub(super) fn build(models: &[&[String]], ring_ids: &[&str], ring: &Arc<Ring>) -> PoolSet {
        let worker_count = ring_ids.len();
        let mut by_model: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (worker, names) in models.iter().enumerate() {
            for name in names.iter() {
                let workers = by_model.entry(name.as_str()).or_default();
                // Workers come in ascending order: one already listed for this model is the last.
                if workers.last() != Some(&worker) {
                    workers.push(worker);
                }
            }
        }
        if by_model.is_empty() {
            return PoolSet {
                pools: vec![Pool {
                    model: None,
                    ring: Arc::clone(ring),
                    workers: (0..worker_count).collect(),
                }],
                offsets: Vec::new(),
                memberships: Vec::new(),
                worker_count,
                declared: false,
            };
        }
        let pools: Vec<Pool> = (by_model.into_iter())
            .map(|(model, workers)| {
                let ring = if workers.len() == worker_count {
                    Arc::clone(ring)
                } else {
                    let ids: Vec<&str> = workers.iter().map(|&w| ring_ids[w]).collect();
                    Arc::new(ring.rebuilt(ring_ids, &ids))
                };
                Pool {
                    model: Some(Arc::from(model)),
                    ring,
                    workers,
                }
            })
            .collect();
        let mut counts = vec![0usize; worker_count + 1];
        for pool in &pools {
            for &worker in &pool.workers {
                counts[worker + 1] += 1;
            }
        }
        for worker in 0..worker_count {
            counts[worker + 1] += counts[worker];
        }
        let offsets = counts;
        let mut cursor = offsets.clone();
        let mut memberships = vec![PoolId::FIRST; offsets[worker_count]];
        for (index, pool) in pools.iter().enumerate() {
            for &worker in &pool.workers {
                memberships[cursor[worker]] = PoolId::new(index);
                cursor[worker] += 1;
            }
        }
        PoolSet {
            pools,
            offsets,
            memberships,
            worker_count,
            declared: true,
        }
    }

    /// Every pool, in [`PoolId`] order.
    pub(super) fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The pool `pool`, if the table has it.
    #[inline]
    pub(super) fn get(&self, pool: PoolId) -> Option<&Pool> {
        self.pools.get(pool.index())
    }

    /// The pool of `model`: a binary search over the pools' names. `None` when no pool serves it,
    /// and always when no worker declares a model.
    pub(super) fn of_model(&self, model: &str) -> Option<PoolId> {
        if !self.declared {
            return None;
        }
        self.pools
            .binary_search_by(|pool| pool.model.as_deref().unwrap_or("").cmp(model))
            .ok()
            .map(PoolId::new)
    }

    /// The pools the worker at table index `worker` is in, ascending (empty for an index that is
    /// no worker).
    #[inline]
    pub(super) fn of_worker(&self, worker: usize) -> &[PoolId] {
        if !self.declared {
            return if worker < self.worker_count {
                ONLY_THE_FIRST
            } else {
                &[]
            };
        }
        match (self.offsets.get(worker), self.offsets.get(worker + 1)) {
            (Some(&start), Some(&end)) => &self.memberships[start..end],
            _ => &[],
        }
    }

    /// Whether some worker declares a model.
    #[inline]
    pub(super) fn declared(&self) -> bool {
        self.declared
    }
}

/// A table-indexed view seen through one pool: pool indices (the pool ring's worker indices) in,
/// table indices asked of `fleet`. What [`crate::decide::decide`] reads inside a pool.
pub(super) struct PoolView<'a, F> {
    pub(super) fleet: &'a F,
    pub(super) pool: &'a Pool,
    /// The pool indices of its routable workers, ascending.
    pub(super) routable: &'a [usize],
    /// The pool's kept aggregates and how many of its routable workers' loads came from a fresh
    /// sample; `None`: the rule computes them over the pool's workers.
    pub(super) kept: Option<(&'a FleetAggregates, usize)>,
}

impl<F: FleetView> FleetView for PoolView<'_, F> {
    fn worker_count(&self) -> usize {
        self.pool.workers.len()
    }
    fn routable(&self, worker: usize) -> bool {
        self.fleet.routable(self.pool.workers[worker])
    }
    fn routable_count(&self) -> usize {
        self.routable.len()
    }
    fn nth_routable(&self, n: usize) -> Option<usize> {
        self.routable.get(n).copied()
    }
    fn kept_fleet_load(&self) -> Option<FleetLoad> {
        self.kept
            .and_then(|(aggregates, _)| aggregates.fleet_load())
    }
    fn kept_load_signal(&self) -> Option<LoadSignal> {
        let (aggregates, sampled) = self.kept?;
        Some(kept_signal(aggregates, sampled))
    }
    fn load(&self, worker: usize) -> u64 {
        self.fleet.load(self.pool.workers[worker])
    }
    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        self.fleet.load_with_signal(self.pool.workers[worker])
    }
    /// A target worker outside the pool does not serve the model: a miss.
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.pool.local(self.fleet.resolve_target(raw)?)
    }
    fn limited(&self) -> bool {
        self.fleet.limited()
    }
    fn capacity(&self, worker: usize) -> Option<u64> {
        self.fleet.capacity(self.pool.workers[worker])
    }
    fn engine_full(&self, worker: usize) -> bool {
        self.fleet.engine_full(self.pool.workers[worker])
    }
}

/// The signal of a set of routable workers of which `sampled` read a fresh sample.
pub(super) fn kept_signal(aggregates: &FleetAggregates, sampled: usize) -> LoadSignal {
    if sampled == 0 {
        LoadSignal::Local
    } else if sampled == aggregates.routable() {
        LoadSignal::WorkerMetrics
    } else {
        LoadSignal::Mixed
    }
}

/// `decision`, taken over `pool`'s indices, with every worker named by its table index.
pub(super) fn to_table_indices(pool: &Pool, decision: Decision) -> Decision {
    let table = |worker: usize| pool.workers[worker];
    Decision {
        worker: decision.worker.map(table),
        preferred: decision.preferred.map(table),
        wait: decision.wait.map(|wait| match wait {
            Wait::ForWorker(worker) => Wait::ForWorker(table(worker)),
            Wait::ForAnyWorker => Wait::ForAnyWorker,
        }),
        ..decision
    }
}
