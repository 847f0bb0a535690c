//! The routing table's answers within one pool ([`super::pool`]): which pools it has, the walk
//! over a pool's routable workers, and the decision inside a pool. Every worker index taken or
//! returned here is a table index; the pool's own indices stay inside.

use super::pool::{Pool, PoolId, PoolView, to_table_indices};
use super::table::RoutingTable;
use crate::decide::{Decision, FleetView, decide};
use crate::policy::Branch;
use crate::routing_key::RoutingKey;
use crate::telemetry::RingOwnership;

impl RoutingTable {
    /// The pools, in [`PoolId`] order: never empty. One pool of every worker when no worker
    /// declares a model; otherwise one per distinct model name, sorted by name (bytes).
    pub fn pools(&self) -> &[Pool] {
        self.pools.pools()
    }

    /// The pool `pool`; `None` when the table has no such pool.
    #[inline]
    pub fn pool(&self, pool: PoolId) -> Option<&Pool> {
        self.pools.get(pool)
    }

    /// The pool of the workers that serve `model` (exact, case-sensitive name): a binary search
    /// over the pools' names. `None` when no worker serves it, and always when no worker declares
    /// a model (then every request routes in [`PoolId::FIRST`]).
    pub fn pool_of_model(&self, model: &str) -> Option<PoolId> {
        self.pools.of_model(model)
    }

    /// The pools the worker at table index `worker` is in, ascending: usually one; none for a
    /// worker that declares no model in a fleet where others do (or an index that is no worker).
    #[inline]
    pub fn pools_of_worker(&self, worker: usize) -> &[PoolId] {
        self.pools.of_worker(worker)
    }

    /// Whether some worker declares a model (then pools are by model).
    #[inline]
    pub fn has_models(&self) -> bool {
        self.pools.declared()
    }

    /// How many of `pool`'s workers are routable (0 for a pool the table does not have).
    pub fn routable_count_in(&self, pool: PoolId) -> usize {
        self.pool_routable
            .get(pool.index())
            .map_or(0, |routable| routable.len())
    }

    /// [`RoutingTable::routable_from`] within `pool`: its routable workers clockwise from
    /// `position` on the pool's ring, each once, as table indices, leaving out those `skip` names
    /// (table indices). Empty for a pool the table does not have. Allocation-free.
    pub fn routable_from_in<'a>(
        &'a self,
        pool: PoolId,
        position: u64,
        skip: impl Fn(usize) -> bool + 'a,
    ) -> impl Iterator<Item = usize> + 'a {
        let walk = self.pools.get(pool).map(move |pool| {
            let table = move |local: usize| pool.workers()[local];
            pool.ring()
                .workers_clockwise(position, move |local| {
                    self.routable[table(local)] && !skip(table(local))
                })
                .map(table)
        });
        walk.into_iter().flatten()
    }

    /// [`RoutingTable::least_loaded_routable`] within `pool`: the routable worker of the pool with
    /// the fewest requests in flight (ties to the lower index), as a table index, leaving out
    /// those `skip` names. `None` when every one is skipped or the table has no such pool.
    pub fn least_loaded_routable_in(
        &self,
        pool: PoolId,
        skip: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let pool = self.pools.get(pool)?;
        (pool.workers().iter().copied())
            .filter(|&w| self.routable[w] && !skip(w))
            .min_by_key(|&w| self.workers[w].stats.active())
    }

    /// [`crate::decide::decide`] within `pool` over `fleet`, a view indexed like this table that
    /// agrees with it on which workers are routable (the table itself, or one that assumes some
    /// workers full, as `/admin/explain` does): the pool's ring, the bounded rule's minimum and
    /// mean over the pool's routable workers, the keyless pick among them; a target worker
    /// outside the pool is a miss. Every index in the answer is a table index. A pool the table
    /// does not have answers `no_healthy_workers`.
    pub fn decide_in<F: FleetView>(
        &self,
        pool: PoolId,
        key: &RoutingKey<'_>,
        fleet: &F,
        entropy: u64,
        turn: u64,
    ) -> Decision {
        let (Some(members), Some(routable)) =
            (self.pools.get(pool), self.pool_routable.get(pool.index()))
        else {
            return no_pool();
        };
        if members.covers(self.workers.len()) {
            return decide(members.ring(), &self.policy, key, fleet, entropy, turn);
        }
        let view = PoolView {
            fleet,
            pool: members,
            routable,
            kept: None,
        };
        let decision = decide(members.ring(), &self.policy, key, &view, entropy, turn);
        to_table_indices(members, decision)
    }

    /// What a key would get right now in `pool`, without taking load: [`RoutingTable::decide_in`]
    /// over this table.
    pub fn explain_in(&self, key: &RoutingKey<'_>, pool: PoolId) -> Decision {
        self.decide_in(pool, key, self, 0, 0)
    }

    /// Each of `pool`'s workers' share and arcs of the pool's ring, named by worker name (the
    /// whole table's ring for the one pool of a fleet that declares no model). Empty for a pool
    /// the table does not have. One pass over the pool ring's points.
    pub fn ring_ownership(&self, pool: PoolId) -> RingOwnership {
        match self.pools.get(pool) {
            Some(members) => {
                let names: Vec<&str> = (members.workers().iter())
                    .map(|&w| self.workers[w].spec.name.as_str())
                    .collect();
                RingOwnership::of_ring(members.ring(), &names)
            }
            None => RingOwnership {
                virtual_nodes: self.policy.virtual_nodes,
                workers: Vec::new(),
            },
        }
    }
}

/// The answer for a pool the table does not have: no worker, as for a pool with none routable.
pub(super) fn no_pool() -> Decision {
    Decision {
        worker: None,
        preferred: None,
        branch: Branch::NoHealthyWorkers,
        bound: None,
        load_signal: None,
        wait: None,
    }
}
