//! One worker's health or state flipped: the next table derived from the one in force, not built
//! again. A probe round in which a rack's workers all fail is as many flips as workers, so a flip
//! must not pay for the fleet: everything the membership and the policy fix (workers, ring, pools,
//! names, capacities) is shared, and the routable lists change by the one worker. What is still
//! copied per flip is the per-worker flags and the routable lists of the fleet and of the worker's
//! pools (plain memory copies, a few bytes per worker), so every table stays an immutable
//! snapshot that readers hold without a lock.

use std::sync::Arc;

use super::table::RoutingTable;
use crate::telemetry::WorkerState;

impl RoutingTable {
    /// This table with the worker at index `worker` set to `healthy` and `state`: the same
    /// membership, ring, pools, capacities, policy and membership generation, equal field by field
    /// to [`RoutingTable::with_flags`] with the flags changed that way (a property test holds them
    /// equal). A worker whose routable flag flips is inserted into or removed from the routable
    /// list of the fleet and of each of its pools (a binary search and memory copies of the list);
    /// the other pools' lists are shared.
    ///
    /// # Panics
    /// If `worker` is no index of this table.
    pub(super) fn with_worker_flags(
        &self,
        worker: usize,
        healthy: bool,
        state: WorkerState,
    ) -> RoutingTable {
        let mut healthy_flags = self.healthy.clone();
        healthy_flags[worker] = healthy;
        let mut states = self.states.clone();
        states[worker] = state;
        let now = healthy && state == WorkerState::Active;
        let mut routable = self.routable.clone();
        routable[worker] = now;
        let mut routable_indices = Arc::clone(&self.routable_indices);
        let mut pool_routable = self.pool_routable.clone();
        if self.routable[worker] != now {
            routable_indices = toggled(&self.routable_indices, worker, now);
            for &pool in self.pools_of_worker(worker) {
                let members = &self.pools()[pool.index()];
                let list = &mut pool_routable[pool.index()];
                *list = if members.covers(self.workers.len()) {
                    // A pool of every worker lists table indices: the fleet's list, shared.
                    Arc::clone(&routable_indices)
                } else {
                    let local = members.local(worker).expect("a worker is in its own pools");
                    toggled(list, local, now)
                };
            }
        }
        RoutingTable {
            workers: Arc::clone(&self.workers),
            ring: Arc::clone(&self.ring),
            healthy: healthy_flags,
            states,
            routable,
            routable_count: routable_indices.len(),
            routable_indices,
            capacity: Arc::clone(&self.capacity),
            limited: self.limited,
            policy: self.policy,
            membership_generation: self.membership_generation,
            pools: Arc::clone(&self.pools),
            pool_routable,
            by_name: Arc::clone(&self.by_name),
        }
    }
}

/// `list` (ascending, without repeats) with `item` in it when `present`, else without it: one
/// binary search and memory copies (collecting a chain of iterators instead copies element by
/// element, several times slower at 10,000 workers).
fn toggled(list: &[usize], item: usize, present: bool) -> Arc<[usize]> {
    let at = list.partition_point(|&listed| listed < item);
    let listed = list.get(at) == Some(&item);
    let (before, after) = list.split_at(at);
    let after = if listed { &after[1..] } else { after };
    let mut toggled = Vec::with_capacity(list.len() + 1);
    toggled.extend_from_slice(before);
    toggled.extend(present.then_some(item));
    toggled.extend_from_slice(after);
    Arc::from(toggled)
}
