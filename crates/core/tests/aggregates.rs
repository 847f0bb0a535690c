//! The fleet aggregates the router keeps for the bounded rule (routable count, load sum, minimum)
//! against the plain O(n) computation, and the decisions made with them against decisions made
//! without them.
//!
//! After every step of random interleavings of arrivals, releases (also of requests on workers
//! removed since), health flips, drains, membership changes, policy changes (load source and caps
//! included) and worker samples published, marked stale or cleared through the router, the kept
//! aggregates equal [`FleetLoad::of`] over the routable workers' loads as the rule reads them
//! (local, or [`fleet_load`] of a fresh sample in `worker_metrics` mode), and each routed
//! request's decision — in either mode, with its load signal — equals the one computed over the
//! workers (`explain`, which keeps no aggregates). Concurrent same-key bursts from several threads
//! land exactly like the same requests routed one after another, and the aggregates at quiescence
//! equal the plain computation. Synchronisation is by barriers and joins; nothing sleeps.

use std::sync::Barrier;
use std::thread;

use bch_core::decide::{FleetView, decide};
use bch_core::fleet_load::{LoadSignal, LoadSource, fleet_load};
use bch_core::policy::{FleetLoad, PolicyKind, PolicySettings};
use bch_core::router::{Routed, Router, RoutingTable, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, RoutingKey};
use proptest::prelude::*;

use common::ops::{self, Mix};

mod common;

/// Pool of workers the operations add and remove; the last one has a cap of 3 requests in flight.
const POOL: usize = 7;

fn spec(i: usize) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{i}"),
        url: format!("http://10.1.{}.{}:8000", i / 256, i % 256),
        ring_id: None,
        source: WorkerSource::Static,
        max_in_flight: (i == POOL - 1).then_some(3),
        models: Vec::new(),
    }
}

/// The plain computation: minimum and mean of the routable workers' loads under the table's
/// load source, from the formula itself (not the table's view of it).
fn plain_fleet_load(table: &RoutingTable) -> Option<FleetLoad> {
    FleetLoad::of(
        (0..table.workers().len())
            .filter(|&w| table.routable(w))
            .map(|w| {
                let stats = &table.workers()[w].stats;
                match table.policy().load_source {
                    LoadSource::Local => stats.active(),
                    LoadSource::WorkerMetrics => {
                        fleet_load(stats.active(), stats.fleet_sample().fresh())
                    }
                }
            }),
    )
}

/// The table seen through the trait's defaults only: the `n`-th routable worker counted through
/// the workers, no kept aggregates.
struct Plain<'a>(&'a RoutingTable);

impl FleetView for Plain<'_> {
    fn worker_count(&self) -> usize {
        self.0.worker_count()
    }
    fn routable(&self, worker: usize) -> bool {
        FleetView::routable(self.0, worker)
    }
    fn routable_count(&self) -> usize {
        FleetView::routable_count(self.0)
    }
    fn load(&self, worker: usize) -> u64 {
        self.0.load(worker)
    }
    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        self.0.load_with_signal(worker)
    }
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.0.resolve_target(raw)
    }
    fn limited(&self) -> bool {
        self.0.limited()
    }
    fn capacity(&self, worker: usize) -> Option<u64> {
        FleetView::capacity(self.0, worker)
    }
    fn engine_full(&self, worker: usize) -> bool {
        self.0.engine_full(worker)
    }
}

/// The operations drawn: routes in the one pool, every policy kind, samples ahead of and behind
/// the local count.
const MIX: Mix = Mix {
    workers: POOL as u8,
    models: 1,
    kinds: &[
        (4, PolicyKind::BoundedConsistentHashing),
        (1, PolicyKind::ConsistentHashing),
        (1, PolicyKind::RoundRobin),
        (1, PolicyKind::Random),
    ],
    skew: true,
    wide_samples: true,
};

/// The workers a target route names.
const TARGETS: [&str; 6] = ["w0", "w1", "w2", "w3", "w5", "w6"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn kept_aggregates_and_decisions_equal_the_plain_computation(
        ops in prop::collection::vec(MIX.op(), 1..200),
        entropy in any::<u64>(),
    ) {
        let pool: Vec<WorkerSpec> = (0..POOL).map(spec).collect();
        let policy = PolicySettings { virtual_nodes: 8, min_load_gap: 1, ..PolicySettings::default() };
        let router = Router::new(pool[..5].to_vec(), policy).unwrap();
        let mut held: Vec<Routed> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            let table = router.table();
            if let Some(route) = ops::apply(&router, &table, &pool, &mut held, op) {
                let key = route.routing_key(&TARGETS);
                let predicted = table.explain(&key);
                let routed = router.route(&key);
                let keyed = key.position().is_some() || matches!(key, RoutingKey::Target(_));
                let baseline =
                    matches!(table.policy().kind, PolicyKind::RoundRobin | PolicyKind::Random);
                if keyed && !baseline {
                    prop_assert_eq!(routed.decision, predicted);
                }
                // The keyless pick and the baselines, with the table's list of routable
                // workers and without it, for the same entropy and turn.
                let (e, t) = (entropy.rotate_left(step as u32), step as u64);
                let listed = decide(table.ring(), table.policy(), &key, &*table, e, t);
                let counted = decide(table.ring(), table.policy(), &key, &Plain(&table), e, t);
                prop_assert_eq!(listed, counted);
                if routed.guard.is_some() {
                    held.push(routed);
                }
            }
            let table = router.table();
            prop_assert_eq!(router.fleet_load(), plain_fleet_load(&table), "after step {}", step);
            for n in 0..=table.workers().len() {
                prop_assert_eq!(table.nth_routable(n), Plain(&table).nth_routable(n));
            }
        }
        drop(held);
        let table = router.table();
        prop_assert_eq!(router.fleet_load(), plain_fleet_load(&table));
        prop_assert!(table.workers().iter().all(|w| w.stats.active() == 0));
    }
}

fn specs(n: usize) -> Vec<WorkerSpec> {
    (0..n)
        .map(spec)
        .map(|s| WorkerSpec {
            max_in_flight: None,
            ..s
        })
        .collect()
}

fn loads(router: &Router) -> Vec<u64> {
    router
        .table()
        .workers()
        .iter()
        .map(|w| w.stats.active())
        .collect()
}

/// Several threads route one key at once on a 100-worker fleet, holding every request: the final
/// loads equal those of the same requests routed one after another (each decision and its load
/// increment are one step, so a burst splits as sequentially), and the kept aggregates equal the
/// plain computation once the threads are done, and again after they all released concurrently.
#[test]
fn concurrent_bursts_split_like_sequential_ones_and_leave_exact_aggregates() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 150;
    const ROUNDS: usize = 20;
    let policy = PolicySettings {
        virtual_nodes: 40,
        ..PolicySettings::default()
    };
    let key = RoutingKey::Explicit(ExplicitKey::parse(b"burst-across-a-fleet").unwrap());
    let sequential = {
        let router = Router::new(specs(100), policy).unwrap();
        let held: Vec<Routed> = (0..THREADS * PER_THREAD)
            .map(|_| router.route(&key))
            .collect();
        let loads = loads(&router);
        drop(held);
        loads
    };
    assert!(
        sequential.iter().filter(|&&load| load > 0).count() > 2,
        "the burst spills over several workers: {sequential:?}"
    );
    let router = Router::new(specs(100), policy).unwrap();
    for round in 0..ROUNDS {
        let start = Barrier::new(THREADS);
        let landed = Barrier::new(THREADS + 1);
        let release = Barrier::new(THREADS + 1);
        let mut at_quiescence = None;
        thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    start.wait();
                    let held: Vec<Routed> = (0..PER_THREAD).map(|_| router.route(&key)).collect();
                    landed.wait();
                    release.wait();
                    drop(held);
                });
            }
            landed.wait();
            // Recorded, not asserted here: a panic would leave the threads on the barrier.
            let table = router.table();
            at_quiescence = Some((
                loads(&router),
                router.fleet_load(),
                plain_fleet_load(&table),
            ));
            release.wait();
        });
        let (loaded, kept, plain) = at_quiescence.unwrap();
        assert_eq!(loaded, sequential, "round {round}");
        assert_eq!(kept, plain, "round {round}");
        assert_eq!(router.fleet_load(), plain_fleet_load(&router.table()));
        assert_eq!(router.fleet_load().unwrap().mean_load, 0.0);
    }
}

/// Guards outlive tables: requests held on a worker while it is removed, re-added and removed
/// again are released afterwards without disturbing the aggregates of the table in force.
#[test]
fn releases_on_removed_workers_leave_the_current_aggregates_alone() {
    let router = Router::new(specs(3), PolicySettings::default()).unwrap();
    let held: Vec<Routed> = (0..5)
        .map(|_| router.route(&RoutingKey::Target(b"w1")))
        .collect();
    let other = router.route(&RoutingKey::Target(b"w0"));
    let removed = router.remove_worker("w1").unwrap();
    assert_eq!(router.fleet_load(), plain_fleet_load(&router.table()));
    let mut held = held.into_iter();
    drop(held.next());
    assert_eq!(router.fleet_load(), plain_fleet_load(&router.table()));
    router.add_worker(removed).unwrap();
    // Re-added with the same URL: its counters come back with the 4 requests still in flight.
    let kept = router.fleet_load().unwrap();
    assert_eq!(kept, plain_fleet_load(&router.table()).unwrap());
    assert_eq!((kept.min_load, kept.mean_load), (0, 5.0 / 3.0));
    drop(held.next());
    router.remove_worker("w1").unwrap();
    drop(held);
    drop(other);
    assert_eq!(router.fleet_load(), plain_fleet_load(&router.table()));
    assert_eq!(router.fleet_load().unwrap().mean_load, 0.0);
}
