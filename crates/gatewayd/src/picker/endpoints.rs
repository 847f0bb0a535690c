//! Workers as Envoy knows them: by address. The `IP:PORT` of every worker of a membership
//! generation, taken from each member's parsed URL once when the generation is first seen (never
//! per request), and the answer's endpoint list: the chosen worker, then its fallbacks.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use bch_core::generation_cache::{GenerationCache, PerGeneration};
use bch_core::policy::Branch;
use bch_core::router::RoutingTable;

use crate::config::{MAX_PICKER_FALLBACKS, Member, SharedMembers, WorkerUrl};
use crate::per_worker::WorkerKey;
use crate::routing::Choice;

/// One worker's address and the header value naming it.
#[derive(Debug)]
pub struct WorkerAddress {
    /// `IP:PORT`, parsed.
    pub addr: SocketAddr,
    /// The address as Envoy writes a host's address (`10.0.0.7:8000`, `[::1]:8000`).
    pub text: String,
}

/// The addresses of one membership generation, indexed like the table's workers; `None` for a
/// worker whose URL is no `http(s)://IP:PORT` (start-up and the admin owner refuse those while the
/// picker runs, so only a table built before a picker existed could hold one).
#[derive(Debug)]
pub struct Addresses {
    generation: u64,
    workers: Vec<Option<WorkerAddress>>,
}

impl PerGeneration for Addresses {
    fn generation(&self) -> u64 {
        self.generation
    }
}

impl Addresses {
    /// The addresses of `table`'s workers, from each worker's parsed URL in `members` (the admin
    /// owner stores the membership before the router's table, so every worker of a table has its
    /// member); a worker that left the membership since is parsed from its spec.
    fn of(table: &RoutingTable, members: &[Member]) -> Self {
        let by_worker: HashMap<WorkerKey, &WorkerUrl> = members
            .iter()
            .map(|member| (WorkerKey::of(&member.spec), &member.url))
            .collect();
        let workers = table
            .workers()
            .iter()
            .map(|worker| {
                let addr = match by_worker.get(worker.spec.url.as_str()) {
                    Some(url) => url.picker_endpoint(),
                    None => WorkerUrl::parse(&worker.spec.url).ok()?.picker_endpoint(),
                }
                .ok()?;
                Some(WorkerAddress {
                    addr,
                    text: addr.to_string(),
                })
            })
            .collect();
        Self {
            generation: table.membership_generation(),
            workers,
        }
    }

    /// Worker `index`'s address, when it has one.
    pub fn get(&self, index: usize) -> Option<&WorkerAddress> {
        self.workers.get(index)?.as_ref()
    }

    /// The worker at `addr`, as an index into the table these addresses were built from.
    pub fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.workers
            .iter()
            .position(|w| w.as_ref().is_some_and(|w| w.addr == addr))
    }
}

/// The workers' addresses of the latest membership generation seen, rebuilt when the generation
/// changes, from the membership in force.
pub struct AddressBook {
    members: SharedMembers,
    cache: GenerationCache<Addresses>,
}

impl AddressBook {
    /// An empty book over the membership in force `members`.
    pub fn new(members: SharedMembers) -> Self {
        Self {
            members,
            cache: GenerationCache::default(),
        }
    }

    /// The addresses of `table`'s workers: a lock-free load, and a rebuild once per membership
    /// generation. A table older than the cached one gets its own (uncached) addresses.
    pub fn for_table(&self, table: &RoutingTable) -> Arc<Addresses> {
        self.cache
            .for_table(table, |table| Addresses::of(table, &self.members.load()))
    }
}

/// Writes the answer's endpoint list into `out`: the chosen worker's `IP:PORT`, then up to
/// `fallbacks` other routable workers (healthy, not draining, not full), comma-separated. The fallbacks
/// are the workers the data plane's retry would go to, from core's one walk within the
/// decision's pool: keyed requests in the pool's ring order from the key
/// ([`RoutingTable::routable_from_in`]), keyless ones the pool's least loaded others
/// ([`RoutingTable::least_loaded_routable_in`]); target-worker requests never move. Returns
/// the workers listed (so the response can tell a fallback Envoy was given from an endpoint it
/// picked itself), or `None` when the chosen worker has no address. Allocates nothing but
/// `out`'s growth: the listed workers are kept in a fixed array.
pub fn endpoint_list(
    table: &RoutingTable,
    addresses: &Addresses,
    choice: &Choice,
    fallbacks: usize,
    out: &mut String,
) -> Option<Listed> {
    let chosen = addresses.get(choice.worker)?;
    out.push_str(&chosen.text);
    let mut listed = Listed::new(choice.worker);
    // A full worker is no fallback: the data plane's retry skips it too.
    let listable = |w: usize| w != choice.worker && addresses.get(w).is_some() && !table.full(w);
    // Fallbacks come from the decision's pool only: another model's worker cannot serve the
    // request. Capped by the pool's workers, so a walk for more fallbacks than exist ends early
    // instead of turning the whole ring.
    let pool = choice.pool;
    let others = (table.pool(pool).map_or(&[][..], |p| p.workers()).iter())
        .filter(|&&w| table.routable(w) && listable(w))
        .count();
    let wanted = fallbacks.min(MAX_PICKER_FALLBACKS).min(others);
    if wanted == 0 || choice.branch == Branch::TargetWorkerHit {
        return Some(listed);
    }
    match choice.position {
        Some(position) => {
            for worker in table
                .routable_from_in(pool, position, |w| !listable(w))
                .take(wanted)
            {
                listed.add(worker, addresses, out);
            }
        }
        None => {
            while listed.fallbacks() < wanted {
                let next =
                    table.least_loaded_routable_in(pool, |w| !listable(w) || listed.contains(w));
                match next {
                    Some(worker) => listed.add(worker, addresses, out),
                    None => break,
                }
            }
        }
    }
    Some(listed)
}

/// The workers of an endpoint list, chosen first, in a fixed array (no allocation per request).
#[derive(Debug, Clone, Copy)]
pub struct Listed {
    workers: [usize; MAX_PICKER_FALLBACKS + 1],
    count: usize,
}

impl Listed {
    fn new(chosen: usize) -> Self {
        Self {
            workers: [chosen; MAX_PICKER_FALLBACKS + 1],
            count: 1,
        }
    }

    /// Whether `worker` is in the list (the chosen worker or a fallback).
    pub fn contains(&self, worker: usize) -> bool {
        self.workers[..self.count].contains(&worker)
    }

    /// Fallbacks listed so far (the chosen worker is not one).
    fn fallbacks(&self) -> usize {
        self.count - 1
    }

    /// Appends `worker` to the list and to `out`, unless it is listed already, has no address or
    /// the list is full.
    fn add(&mut self, worker: usize, addresses: &Addresses, out: &mut String) {
        if self.contains(worker) || self.count == self.workers.len() {
            return;
        }
        if let Some(address) = addresses.get(worker) {
            self.workers[self.count] = worker;
            self.count += 1;
            let _ = write!(out, ",{}", address.text);
        }
    }
}

#[cfg(test)]
mod tests {
    use bch_core::policy::PolicySettings;
    use bch_core::ring::hash_position;
    use bch_core::router::{PoolId, Router, WorkerSource, WorkerSpec};
    use bch_core::telemetry::WorkerState;

    use super::*;

    fn router(workers: u16) -> Router {
        router_with(workers, PolicySettings::default())
    }

    fn router_with(workers: u16, policy: PolicySettings) -> Router {
        let specs = (1..=workers)
            .map(|n| WorkerSpec {
                name: format!("w{n}"),
                url: format!("http://127.0.0.1:{}", 9000 + n),
                ring_id: None,
                source: WorkerSource::Static,
                max_in_flight: None,
                models: Vec::new(),
            })
            .collect();
        Router::new(specs, policy).unwrap()
    }

    /// Envoy retries a failed connect on the listed fallbacks: a draining worker must never be one,
    /// as it is never a pick (docs/envoy.md), for keyed and keyless requests alike.
    #[test]
    fn a_draining_worker_is_never_listed_as_a_fallback() {
        for drained in 0..3 {
            for key in ["a", "b", "c", "session-7", "user-42", ""] {
                let router = router(3);
                let name = format!("w{}", drained + 1);
                router.set_state(&name, WorkerState::Draining).unwrap();
                let table = router.table();
                let position = (!key.is_empty()).then(|| hash_position(key.as_bytes()));
                let chosen = (0..3).find(|&w| w != drained).unwrap();
                let choice = Choice {
                    table: Arc::clone(&table),
                    worker: chosen,
                    branch: if position.is_some() {
                        Branch::ExplicitRoutingKeyHit
                    } else {
                        Branch::Keyless
                    },
                    position,
                    pool: PoolId::FIRST,
                };
                let addresses = Addresses::of(&table, &[]);
                let mut out = String::new();
                let listed = endpoint_list(&table, &addresses, &choice, 2, &mut out).unwrap();
                let drained_address = &addresses.get(drained).unwrap().text;
                assert!(
                    !listed.contains(drained) && !out.contains(drained_address.as_str()),
                    "chosen w{} drained {name} endpoints {out}",
                    chosen + 1
                );
                assert_eq!(
                    listed.fallbacks(),
                    1,
                    "the one other routable worker: {out}"
                );
            }
        }
    }

    #[test]
    fn a_full_worker_is_never_listed_as_a_fallback() {
        let mut policy = PolicySettings::default();
        policy.admission.max_in_flight_per_worker = 1;
        let router = router_with(3, policy);
        let full = router.route(&bch_core::routing_key::RoutingKey::Target(b"w2"));
        assert_eq!(full.decision.worker, Some(1));
        let table = router.table();
        for key in ["a", "b", "c", "session-7", "user-42", ""] {
            let position = (!key.is_empty()).then(|| hash_position(key.as_bytes()));
            let choice = Choice {
                table: Arc::clone(&table),
                worker: 0,
                branch: Branch::ExplicitRoutingKeyHit,
                position,
                pool: PoolId::FIRST,
            };
            let addresses = Addresses::of(&table, &[]);
            let mut out = String::new();
            let listed = endpoint_list(&table, &addresses, &choice, 2, &mut out).unwrap();
            assert!(!listed.contains(1), "the full w2 listed: {out}");
            assert_eq!(listed.fallbacks(), 1, "only w3 has room: {out}");
        }
        drop(full);
    }
}
