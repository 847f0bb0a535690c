//! Pools by model: each model's workers get their own ring and their own bounded rule.
//!
//! A pool's ring is the ring of a one-model router over only its workers; after every step of
//! random interleavings of requests routed in a pool, releases, health flips, drains, membership
//! changes, policy changes and worker samples (workers in one to three of three models), each
//! pool's kept minimum and mean equal the plain computation over its routable workers, and each
//! keyed decision in a pool equals the decision of a one-model router over that pool's workers
//! with the same loads (a ring built from scratch, the minimum and mean summed over the workers).
//! A fleet in which every worker declares the one same model places exactly like one without
//! models.

use bch_core::admission::Wait;
use bch_core::decide::{Decision, FleetView, decide};
use bch_core::fleet_load::LoadSignal;
use bch_core::policy::{Branch, FleetLoad, PolicyKind, PolicySettings};
use bch_core::ring::Ring;
use bch_core::router::{PoolId, Routed, Router, RoutingTable, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, RoutingKey};
use proptest::prelude::*;

use common::ops::{self, KEYS, Mix};

mod common;

const MODELS: [&str; 3] = ["llama-3.1-8b", "mistral-7b", "qwen-2.5-7b"];
const WORKERS: usize = 6;

/// Worker `i` serving the models whose bits are set in `mask` (1..=7); the last has a cap of 3.
fn spec(i: usize, mask: u8) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{i}"),
        url: format!("http://10.2.0.{i}:8000"),
        ring_id: None,
        source: WorkerSource::Static,
        max_in_flight: (i == WORKERS - 1).then_some(3),
        models: (0..3)
            .filter(|bit| mask & (1 << bit) != 0)
            .map(|bit| MODELS[bit].to_owned())
            .collect(),
    }
}

/// A one-model router's view of `pool`'s workers, computed from the table afresh: the loads the
/// rule reads per worker, no kept aggregates (the rule sums them), targets by name.
struct OneModel {
    names: Vec<String>,
    routable: Vec<bool>,
    loads: Vec<(u64, LoadSignal)>,
    capacity: Vec<Option<u64>>,
    limited: bool,
}

impl OneModel {
    fn of(table: &RoutingTable, workers: &[usize]) -> OneModel {
        OneModel {
            names: (workers.iter())
                .map(|&w| table.workers()[w].spec.name.clone())
                .collect(),
            routable: workers.iter().map(|&w| table.routable(w)).collect(),
            loads: (workers.iter())
                .map(|&w| table.load_with_signal(w))
                .collect(),
            capacity: workers.iter().map(|&w| table.capacity(w)).collect(),
            limited: table.limited(),
        }
    }
}

impl FleetView for OneModel {
    fn worker_count(&self) -> usize {
        self.names.len()
    }
    fn routable(&self, worker: usize) -> bool {
        self.routable[worker]
    }
    fn routable_count(&self) -> usize {
        self.routable.iter().filter(|r| **r).count()
    }
    fn load(&self, worker: usize) -> u64 {
        self.loads[worker].0
    }
    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        self.loads[worker]
    }
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.names.iter().position(|n| n.as_bytes() == raw)
    }
    fn limited(&self) -> bool {
        self.limited
    }
    fn capacity(&self, worker: usize) -> Option<u64> {
        self.capacity[worker]
    }
}

/// The workers of `table` that declare `model`, in configuration order.
fn declaring(table: &RoutingTable, model: &str) -> Vec<usize> {
    (0..table.workers().len())
        .filter(|&w| table.workers()[w].spec.models.iter().any(|m| m == model))
        .collect()
}

/// The one-model router's decision for `key` over `workers`, with its worker indices mapped
/// back to the table's.
fn one_model_decision(table: &RoutingTable, workers: &[usize], key: &RoutingKey<'_>) -> Decision {
    let ids: Vec<&str> = workers
        .iter()
        .map(|&w| table.workers()[w].spec.ring_id())
        .collect();
    let ring = Ring::build(&ids, table.policy().virtual_nodes);
    let view = OneModel::of(table, workers);
    let decision = decide(&ring, table.policy(), key, &view, 0, 0);
    let map = |w: usize| workers[w];
    Decision {
        worker: decision.worker.map(map),
        preferred: decision.preferred.map(map),
        wait: decision.wait.map(|wait| match wait {
            Wait::ForWorker(w) => Wait::ForWorker(map(w)),
            Wait::ForAnyWorker => Wait::ForAnyWorker,
        }),
        ..decision
    }
}

/// The plain minimum and mean over `workers`' routable ones, as the rule reads their loads.
fn plain_fleet_load(table: &RoutingTable, workers: &[usize]) -> Option<FleetLoad> {
    FleetLoad::of(
        (workers.iter().copied())
            .filter(|&w| table.routable(w))
            .map(|w| table.load(w)),
    )
}

/// Every pool of `table` against the models its workers declare: the pools are the distinct
/// models in name order, each pool's workers are those declaring it, its ring equals a fresh
/// build over them, `pools_of_worker` agrees, and the router's kept aggregates equal the plain
/// computation.
fn check_pools(router: &Router, table: &RoutingTable) -> Result<(), TestCaseError> {
    let mut models: Vec<&str> = (table.workers().iter())
        .flat_map(|w| w.spec.models.iter().map(String::as_str))
        .collect();
    models.sort_unstable();
    models.dedup();
    let named: Vec<Option<&str>> = table
        .pools()
        .iter()
        .map(|p| p.model().map(|m| &**m))
        .collect();
    if models.is_empty() {
        // No worker declares a model (every one was removed): the one pool of every worker.
        prop_assert_eq!(named, vec![None]);
        prop_assert_eq!(table.pools()[0].workers().len(), table.workers().len());
        prop_assert!(!table.has_models());
    } else {
        prop_assert_eq!(named, models.iter().map(|&m| Some(m)).collect::<Vec<_>>());
    }
    for (index, model) in models.iter().enumerate() {
        let id = PoolId::new(index);
        prop_assert_eq!(table.pool_of_model(model), Some(id));
        let pool = table.pool(id).unwrap();
        let workers = declaring(table, model);
        prop_assert_eq!(pool.workers(), workers.as_slice());
        let ids: Vec<&str> = (workers.iter())
            .map(|&w| table.workers()[w].spec.ring_id())
            .collect();
        prop_assert_eq!(
            &**pool.ring(),
            &Ring::build(&ids, table.policy().virtual_nodes)
        );
        for &w in &workers {
            prop_assert!(table.pools_of_worker(w).contains(&id));
        }
        prop_assert_eq!(router.fleet_load_in(id), plain_fleet_load(table, &workers));
        prop_assert_eq!(
            table.routable_count_in(id),
            workers.iter().filter(|&&w| table.routable(w)).count()
        );
    }
    prop_assert_eq!(table.pool_of_model("no-such-model"), None);
    Ok(())
}

/// The operations drawn: routes in each model's pool, no random policy, small samples.
const MIX: Mix = Mix {
    workers: WORKERS as u8,
    models: MODELS.len() as u8,
    kinds: &[
        (4, PolicyKind::BoundedConsistentHashing),
        (1, PolicyKind::ConsistentHashing),
        (1, PolicyKind::RoundRobin),
    ],
    skew: false,
    wide_samples: false,
};

/// The workers a target route names.
const TARGETS: [&str; 6] = ["w0", "w1", "w2", "w3", "w4", "w5"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn each_pool_keeps_its_own_aggregates_and_decides_like_a_one_model_router(
        masks in prop::collection::vec(1u8..8, WORKERS),
        ops in prop::collection::vec(MIX.op(), 1..160),
    ) {
        let specs: Vec<WorkerSpec> = (0..WORKERS).map(|i| spec(i, masks[i])).collect();
        let policy = PolicySettings { virtual_nodes: 8, min_load_gap: 1, ..PolicySettings::default() };
        let router = Router::new(specs[..4].to_vec(), policy).unwrap();
        check_pools(&router, &router.table())?;
        let mut held: Vec<Routed> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            let table = router.table();
            if let Some(route) = ops::apply(&router, &table, &specs, &mut held, op) {
                let Some(pool) = table.pool_of_model(MODELS[usize::from(route.model)]) else {
                    continue;
                };
                let key = route.routing_key(&TARGETS);
                let members = table.pool(pool).unwrap().workers().to_vec();
                let expected = one_model_decision(&table, &members, &key);
                prop_assert_eq!(table.explain_in(&key, pool), expected);
                let routed = router.route_in(&key, pool);
                let keyed = key.position().is_some() || matches!(key, RoutingKey::Target(_));
                if keyed && table.policy().kind != PolicyKind::RoundRobin {
                    prop_assert_eq!(routed.decision, expected, "step {}", step);
                }
                if let Some(w) = routed.decision.worker {
                    prop_assert!(members.contains(&w), "a worker of the pool");
                }
                if routed.guard.is_some() {
                    held.push(routed);
                }
            }
            check_pools(&router, &router.table())?;
        }
        drop(held);
        let table = router.table();
        check_pools(&router, &table)?;
        prop_assert!(table.workers().iter().all(|w| w.stats.active() == 0));
    }
}

fn plain_spec(i: usize, models: &[&str]) -> WorkerSpec {
    WorkerSpec {
        max_in_flight: None,
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..spec(i, 1)
    }
}

/// Every worker declaring the one same model places exactly like no models at all: same ring,
/// same decisions for a same-key burst held in flight.
#[test]
fn one_declared_model_places_like_no_models() {
    let policy = PolicySettings::default();
    let bare = Router::new((0..5).map(|i| plain_spec(i, &[])).collect(), policy).unwrap();
    let one = Router::new((0..5).map(|i| plain_spec(i, &["m"])).collect(), policy).unwrap();
    let pool = one.table().pool_of_model("m").unwrap();
    assert_eq!(bare.table().pools().len(), 1);
    assert_eq!(bare.table().pools()[0].model(), None);
    assert_eq!(bare.table().pool_of_model("m"), None, "no model declared");
    assert_eq!(one.table().pool(pool).unwrap().ring(), bare.table().ring());
    let mut held = Vec::new();
    for n in 0..40 {
        let key = RoutingKey::Explicit(ExplicitKey::parse(KEYS[n % 3].as_bytes()).unwrap());
        let a = bare.route(&key);
        let b = one.route_in(&key, pool);
        assert_eq!(a.decision, b.decision, "request {n}");
        held.push((a, b));
    }
    assert_eq!(bare.fleet_load(), one.fleet_load_in(pool));
}

/// Two models on disjoint workers: a key routes only among its model's workers, its bound reads
/// its pool's loads (the other pool's burst does not move it), a target outside the pool is a
/// miss, retries stay in the pool, and a worker that declares no model is in no pool.
#[test]
fn two_models_route_apart() {
    let specs = vec![
        plain_spec(0, &["a"]),
        plain_spec(1, &["a"]),
        plain_spec(2, &["b"]),
        plain_spec(3, &["b"]),
        plain_spec(4, &[]),
    ];
    let router = Router::new(specs, PolicySettings::default()).unwrap();
    let table = router.table();
    let (a, b) = (
        table.pool_of_model("a").unwrap(),
        table.pool_of_model("b").unwrap(),
    );
    assert_eq!((a, b), (PoolId::new(0), PoolId::new(1)));
    assert!(table.has_models());
    assert!(table.pools_of_worker(4).is_empty());
    assert_eq!(table.pools_of_worker(2), &[b]);
    let key = RoutingKey::Explicit(ExplicitKey::parse(b"session-a").unwrap());
    // A burst in pool b only: 2 workers, 6:2 like the one-pool 6:2 burst.
    let held_b: Vec<Routed> = (0..8).map(|_| router.route_in(&key, b)).collect();
    assert!(
        held_b
            .iter()
            .all(|r| matches!(r.decision.worker, Some(2 | 3)))
    );
    assert_eq!(router.fleet_load_in(b).unwrap().mean_load, 4.0);
    assert_eq!(router.fleet_load_in(a).unwrap().mean_load, 0.0);
    // Pool a is idle: its decision reads its own loads, not pool b's.
    let in_a = router.route_in(&key, a);
    assert_eq!(in_a.decision.branch, Branch::ExplicitRoutingKeyHit);
    assert!(matches!(in_a.decision.worker, Some(0 | 1)));
    let miss = router.route_in(&RoutingKey::Target(b"w2"), a);
    assert_eq!(miss.decision.branch, Branch::TargetWorkerMiss);
    let hit = router.route_in(&RoutingKey::Target(b"w2"), b);
    assert_eq!(hit.decision.worker, Some(2));
    let failed = in_a.decision.worker.unwrap();
    let (retry, _guard) = router.route_retry_in(&table, &key, failed, a).unwrap();
    assert_eq!(retry, 1 - failed, "the other worker of pool a");
    assert!(
        router
            .route_retry_in(&table, &RoutingKey::None, 2, b)
            .map(|r| r.0)
            == Some(3)
    );
    let ownership = table.ring_ownership(b);
    let names: Vec<&str> = ownership.workers.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["w2", "w3"]);
    let shares: f64 = ownership.workers.iter().map(|w| w.share).sum();
    assert!((shares - 1.0).abs() < 1e-9);
    // A pool the table does not have gets no worker.
    let none = router.route_in(&key, PoolId::new(7));
    assert_eq!(
        (none.decision.worker, none.decision.branch),
        (None, Branch::NoHealthyWorkers)
    );
    assert_eq!(router.fleet_load_in(PoolId::new(7)), None);
}
