//! Routing hot-path benchmarks.
//!
//! * `decide/16_workers_idle`: one bounded decision including hashing a 32-byte key
//!   (`ExplicitKey::parse` + `Router::route` + dropping the guard) on 16 idle workers. Target: median
//!   ≤ 250 ns.
//! * `decide/64_workers_worst_walk`: the same on 64 workers where 63 are loaded over `mean × skew`
//!   and the key's preferred worker must spill. The only eligible worker is the *last* distinct
//!   worker on the key's clockwise walk, so the spill search visits the longest stretch of points it
//!   can for that key. Target: median ≤ 400 ns.
//! * `decide/64_workers_worst_of_1000_keys`: as above, for the key (of 1000 candidates) whose walk to
//!   its last distinct worker is longest: an adversarial upper bound, reported for information.
//! * `ring/build_64x150`: `Ring::build` for 64 workers × 150 virtual nodes. Target: ≤ 2 ms.
//! * `scale/{16,1000,10000,100000}_workers/{idle,loaded,worst_walk}`: route plus release (so the
//!   upkeep of the fleet aggregates is counted) of explicit keys on large fleets, 150 virtual
//!   nodes each. `idle`: every worker idle, 1024 keys in turn (all hits). `loaded`: worker `w`
//!   holds `w mod 5` requests (mean 2, minimum 0), the same keys: hits, and spills of the keys
//!   whose worker holds 4 to a nearby worker under the bound. `worst_walk`: every worker but the
//!   last distinct one clockwise from the key holds 4 requests (skew 1.0, gap 2), so the spill
//!   search walks the ring to that one worker: O(ring points) by construction, reported for
//!   information. `idle_one_key`: one key over and over, as `decide/16_workers_idle` (its ring
//!   points and worker stay in the CPU's caches, which 1024 keys over a 10,000-worker ring do not).
//!   Goal: `10000_workers/idle_one_key` ≤ 1.5 × `16_workers/idle_one_key`.
//! * `scale/10000_workers/worker_metrics`: the `loaded` case with `load_source = worker_metrics`
//!   and a fresh sample on every worker (the rule reads the kept aggregates here too);
//!   `scale/10000_workers/publish_sample`: one scrape published through the router (the upkeep
//!   of the aggregates per scrape).
//! * `threads/{1,2}x/{16,10000}_workers`: route plus release of the `idle` keys from 1 or 2
//!   threads at once on one router (each thread does `iters / threads`), time per decision: the
//!   selection lock's cost under contention. The time reported is wall time divided by all the
//!   threads' decisions, so decisions per second of the router = 1 / that time.
//!
//! * `pools/{16,10000}_workers_two_models/{idle_one_key,loaded}`: the same fleets with even
//!   workers serving one model and odd workers another; keys routed in the first model's pool
//!   (`Router::route_in`): the cost of a decision inside a pool of half the fleet (its own ring,
//!   its own aggregates, pool indices mapped to table indices), next to the one-pool cases.
//!
//! Run: `cargo bench -p bch-core -- --warm-up-time 1 --measurement-time 3` (add a filter, e.g.
//! `scale/`, for one group; the 100,000-worker router takes seconds to build).

use std::hint::black_box;
use std::time::{Duration, Instant};

use bch_core::fleet_load::{FleetSample, LoadSignal, LoadSource};
use bch_core::load::LoadGuard;
use bch_core::policy::{Branch, PolicySettings};
use bch_core::ring::Ring;
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, RoutingKey};
use criterion::{Criterion, criterion_group, criterion_main};

fn urls(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("http://10.0.{}.{}:8000", i / 200, 10 + i % 200))
        .collect()
}

fn router(n: usize, policy: PolicySettings) -> Router {
    router_serving(n, policy, |_| Vec::new())
}

/// A router over `n` workers, worker `i` serving `models(i)`.
fn router_serving(
    n: usize,
    policy: PolicySettings,
    models: impl Fn(usize) -> Vec<String>,
) -> Router {
    let specs = urls(n)
        .into_iter()
        .enumerate()
        .map(|(i, url)| WorkerSpec {
            name: format!("w{i}"),
            url,
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: models(i),
        })
        .collect();
    Router::new(specs, policy).unwrap()
}

/// A 32-byte routing key.
fn key32(i: usize) -> [u8; 32] {
    let mut raw = [b'.'; 32];
    let text = format!("session-{i:08}-tenant-bench");
    raw[..text.len()].copy_from_slice(text.as_bytes());
    raw
}

/// The benchmarked step: parse (hash) the key, route it, drop the guard.
fn route_once(router: &Router, raw: &[u8; 32]) -> Branch {
    let key = ExplicitKey::parse(black_box(raw)).unwrap();
    let routed = router.route(&RoutingKey::Explicit(key));
    let branch = routed.decision.branch;
    drop(black_box(routed));
    branch
}

/// Points the spill search walks for `raw` before reaching the last distinct worker clockwise.
fn walk_to_last(ring: &Ring, raw: &[u8; 32]) -> (usize, usize) {
    let position = ExplicitKey::parse(raw).unwrap().position();
    let last = *ring.workers_from(position).last().unwrap();
    let steps = ring.points_from(position).position(|w| w == last).unwrap() + 1;
    (last, steps)
}

/// Holds 4 requests on every worker but `eligible`: with skew 1.0 the mean is 252/64 = 3.94, so all
/// 63 loaded workers are over the bound (4 > 3.94, and 4 − 0 > gap 2) and only `eligible` may take a
/// spilled request.
fn load_all_but(router: &Router, eligible: usize) -> Vec<LoadGuard> {
    let mut held = Vec::new();
    for w in 0..router.table().workers().len() {
        if w != eligible {
            for _ in 0..4 {
                let name = format!("w{w}");
                let routed = router.route(&RoutingKey::Target(name.as_bytes()));
                held.push(routed.guard.unwrap());
            }
        }
    }
    held
}

fn worst_walk(c: &mut Criterion, name: &str, raw: [u8; 32]) {
    let router = router(
        64,
        PolicySettings {
            min_load_gap: 2,
            max_load_skew: 1.0,
            ..PolicySettings::default()
        },
    );
    let table = router.table();
    let (last, steps) = walk_to_last(table.ring(), &raw);
    let _held = load_all_but(&router, last);
    let key = RoutingKey::Explicit(ExplicitKey::parse(&raw).unwrap());
    let decision = router.route(&key).decision;
    assert_eq!(decision.branch, Branch::ExplicitRoutingKeySpillover);
    assert_eq!(decision.worker, Some(last));
    eprintln!(
        "{name}: spill search walks {steps} of {} points to the only eligible worker",
        table.ring().len()
    );
    c.bench_function(name, |b| b.iter(|| route_once(&router, &raw)));
}

fn decisions(c: &mut Criterion) {
    let idle = router(16, PolicySettings::default());
    let raw = key32(0);
    assert_eq!(route_once(&idle, &raw), Branch::ExplicitRoutingKeyHit);
    c.bench_function("decide/16_workers_idle", |b| {
        b.iter(|| route_once(&idle, &raw))
    });

    let idle64 = router(64, PolicySettings::default());
    assert_eq!(route_once(&idle64, &raw), Branch::ExplicitRoutingKeyHit);
    c.bench_function("decide/64_workers_idle", |b| {
        b.iter(|| route_once(&idle64, &raw))
    });

    worst_walk(c, "decide/64_workers_worst_walk", key32(0));

    let ring = Ring::build(&urls(64), 150);
    let worst = (0..1000)
        .map(key32)
        .max_by_key(|raw| walk_to_last(&ring, raw).1)
        .unwrap();
    worst_walk(c, "decide/64_workers_worst_of_1000_keys", worst);
}

fn ring_build(c: &mut Criterion) {
    let ids = urls(64);
    c.bench_function("ring/build_64x150", |b| {
        b.iter(|| Ring::build(black_box(&ids), 150))
    });
}

/// 1024 keys, parsed once per route like a request's.
fn keys() -> Vec<[u8; 32]> {
    (0..1024).map(key32).collect()
}

/// Routes `keys[i % 1024]` and drops the guard, for `i` from `start`.
fn route_keys(router: &Router, keys: &[[u8; 32]], start: usize, count: u64) {
    for i in 0..count as usize {
        route_once(router, &keys[(start + i) % keys.len()]);
    }
}

/// Holds `load(w)` requests on every worker `w` (reserved directly, without a decision).
fn hold(router: &Router, load: impl Fn(usize) -> usize) -> Vec<LoadGuard> {
    let table = router.table();
    (0..table.workers().len())
        .flat_map(|w| (0..load(w)).map(move |_| w))
        .map(|w| router.reserve(&table, w).unwrap())
        .collect()
}

fn scale(c: &mut Criterion) {
    let keys = keys();
    for n in [16, 1_000, 10_000, 100_000] {
        let mut group = c.benchmark_group(format!("scale/{n}_workers"));
        let router = router(n, PolicySettings::default());
        let mut turn = 0usize;
        group.bench_function("idle", |b| {
            b.iter(|| {
                turn += 1;
                route_once(&router, &keys[turn % keys.len()])
            })
        });
        let one = key32(0);
        group.bench_function("idle_one_key", |b| b.iter(|| route_once(&router, &one)));
        let held = hold(&router, |w| w % 5);
        group.bench_function("loaded", |b| {
            b.iter(|| {
                turn += 1;
                route_once(&router, &keys[turn % keys.len()])
            })
        });
        drop(held);
        drop(router);
        let strict = PolicySettings {
            min_load_gap: 2,
            max_load_skew: 1.0,
            ..PolicySettings::default()
        };
        let router = crate::router(n, strict);
        let raw = key32(0);
        let (last, steps) = walk_to_last(router.table().ring(), &raw);
        let walk_held = hold(&router, |w| if w == last { 0 } else { 4 });
        let key = RoutingKey::Explicit(ExplicitKey::parse(&raw).unwrap());
        assert_eq!(router.route(&key).decision.worker, Some(last));
        eprintln!(
            "scale/{n}_workers/worst_walk: the spill search walks {steps} of {} points",
            router.table().ring().len()
        );
        group.bench_function("worst_walk", |b| b.iter(|| route_once(&router, &raw)));
        drop(walk_held);
        if n == 10_000 {
            worker_metrics(&mut group, n, &keys);
        }
        group.finish();
    }
}

/// `scale/10000_workers/worker_metrics`: the `loaded` case in `worker_metrics` mode, every worker
/// with a fresh sample (reported `w mod 7` against `w mod 5` at the scrape, so reports run both
/// ahead and behind), and `publish_sample`: one scrape published through the router.
fn worker_metrics(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: usize,
    keys: &[[u8; 32]],
) {
    let policy = PolicySettings {
        load_source: LoadSource::WorkerMetrics,
        ..PolicySettings::default()
    };
    let router = router(n, policy);
    let _held = hold(&router, |w| w % 5);
    let table = router.table();
    let sample = |w: usize| FleetSample {
        reported: (w % 7) as u64,
        local_at_scrape: (w % 5) as u64,
    };
    for (w, worker) in table.workers().iter().enumerate() {
        router.publish_sample(&worker.stats, sample(w), 1);
    }
    let one = RoutingKey::Explicit(ExplicitKey::parse(&keys[0]).unwrap());
    assert_eq!(
        router.route(&one).decision.load_signal,
        Some(LoadSignal::WorkerMetrics)
    );
    let mut turn = 0usize;
    group.bench_function("worker_metrics", |b| {
        b.iter(|| {
            turn += 1;
            route_once(&router, &keys[turn % keys.len()])
        })
    });
    group.bench_function("publish_sample", |b| {
        b.iter(|| {
            turn += 1;
            let w = turn % n;
            let mut next = sample(w);
            next.reported += (turn % 3) as u64;
            router.publish_sample(&table.workers()[w].stats, black_box(next), 1);
        })
    });
}

/// Route plus release from `threads` threads at once, `iters` in all: wall time.
fn routed_by(router: &Router, keys: &[[u8; 32]], threads: usize, iters: u64) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || route_keys(router, keys, t * 512, per_thread));
        }
    });
    start.elapsed()
}

fn threads(c: &mut Criterion) {
    let keys = keys();
    for n in [16, 10_000] {
        let router = router(n, PolicySettings::default());
        for threads in [1, 2] {
            c.bench_function(&format!("threads/{threads}x/{n}_workers"), |b| {
                b.iter_custom(|iters| routed_by(&router, &keys, threads, iters))
            });
        }
    }
}

fn pools(c: &mut Criterion) {
    let keys = keys();
    let half = |i: usize| vec![["model-a", "model-b"][i % 2].to_owned()];
    for n in [16, 10_000] {
        let mut group = c.benchmark_group(format!("pools/{n}_workers_two_models"));
        let router = router_serving(n, PolicySettings::default(), half);
        let pool = router.table().pool_of_model("model-a").unwrap();
        let route_in = |raw: &[u8; 32]| {
            let key = ExplicitKey::parse(black_box(raw)).unwrap();
            let routed = router.route_in(&RoutingKey::Explicit(key), pool);
            let branch = routed.decision.branch;
            drop(black_box(routed));
            branch
        };
        let one = key32(0);
        assert_eq!(route_in(&one), Branch::ExplicitRoutingKeyHit);
        group.bench_function("idle_one_key", |b| b.iter(|| route_in(&one)));
        let held = hold(&router, |w| w % 5);
        let mut turn = 0usize;
        group.bench_function("loaded", |b| {
            b.iter(|| {
                turn += 1;
                route_in(&keys[turn % keys.len()])
            })
        });
        drop(held);
        group.finish();
    }
}

criterion_group!(benches, decisions, ring_build, scale, threads, pools);
criterion_main!(benches);
