//! Routing a request allocates nothing: `ExplicitKey::parse` + `Router::route` + dropping
//! the guard, on every path a data-plane request can take under the bounded policy (explicit hit,
//! explicit spill, implicit, keyless, target worker) and under the baselines, counted with
//! `allocation-counter` (per thread, so parallel tests do not disturb each other).

use allocation_counter::measure;
use bch_core::fleet_load::{FleetSample, LoadSignal, LoadSource};
use bch_core::policy::{Branch, PolicyKind, PolicyPatch, PolicySettings, SpillOrder};
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource, RoutingKey};

const REPEAT: usize = 100;

fn router(policy: PolicySettings) -> Router {
    let workers = (0..4)
        .map(|i| WorkerSpec {
            name: format!("w{i}"),
            url: format!("http://127.0.0.1:{}", 32000 + i),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        })
        .collect();
    Router::new(workers, policy).unwrap()
}

/// Routes `raw` as an explicit key `REPEAT` times inside the measurement (parse, route, drop the
/// guard) after one warm-up call, and returns the allocation count and the branch taken.
fn measure_explicit(router: &Router, raw: &[u8]) -> (u64, Branch) {
    let warm = router.route(&RoutingKey::Explicit(ExplicitKey::parse(raw).unwrap()));
    let expected = warm.decision.branch;
    drop(warm);
    let mut branch = expected;
    let info = measure(|| {
        for _ in 0..REPEAT {
            let key = RoutingKey::Explicit(ExplicitKey::parse(raw).unwrap());
            let routed = router.route(&key);
            branch = routed.decision.branch;
            assert!(routed.guard.is_some());
            drop(routed);
        }
    });
    (info.count_total, branch)
}

fn measure_key(router: &Router, key: &RoutingKey<'_>) -> (u64, Branch) {
    drop(router.route(key));
    let mut branch = Branch::NoHealthyWorkers;
    let info = measure(|| {
        for _ in 0..REPEAT {
            let routed = router.route(key);
            branch = routed.decision.branch;
            drop(routed);
        }
    });
    (info.count_total, branch)
}

/// The counter is live in this binary: something that does allocate is counted.
#[test]
fn the_counter_sees_allocations() {
    let router = router(PolicySettings::default());
    let table = router.table();
    let info = measure(|| {
        let walk = table.ring().workers_from(42);
        assert_eq!(walk.len(), 4);
    });
    assert!(info.count_total >= 1, "{info:?}");
}

#[test]
fn explicit_hit_does_not_allocate() {
    let router = router(PolicySettings::default());
    let (count, branch) = measure_explicit(&router, b"a-32-byte-routing-key-0123456789");
    assert_eq!(branch, Branch::ExplicitRoutingKeyHit);
    assert_eq!(count, 0);
}

#[test]
fn explicit_spill_does_not_allocate() {
    for spill_order in SpillOrder::ALL {
        explicit_spill_does_not_allocate_under(spill_order);
    }
}

fn explicit_spill_does_not_allocate_under(spill_order: SpillOrder) {
    let router = router(PolicySettings {
        spill_order,
        ..PolicySettings::default()
    });
    let raw = b"a-32-byte-routing-key-0123456789";
    let key = RoutingKey::Explicit(ExplicitKey::parse(raw).unwrap());
    let preferred = router.table().explain(&key).preferred.unwrap();
    // Loads [3,0,0,0] on the preferred worker: over both thresholds (gap 2, skew 1.5).
    let name = format!("w{preferred}");
    let held: Vec<_> = (0..3)
        .map(|_| router.route(&RoutingKey::Target(name.as_bytes())))
        .collect();
    let (count, branch) = measure_explicit(&router, raw);
    assert_eq!(branch, Branch::ExplicitRoutingKeySpillover, "{spill_order}");
    assert_eq!(count, 0, "{spill_order}");
    drop(held);
}

/// In `worker_metrics` mode the rule reads each worker's published sample: still no allocation,
/// whether the report makes the preferred worker hot (spill) or not (hit).
#[test]
fn worker_metrics_decisions_do_not_allocate() {
    let router = router(PolicySettings {
        load_source: LoadSource::WorkerMetrics,
        ..PolicySettings::default()
    });
    let raw = b"a-32-byte-routing-key-0123456789";
    let key = RoutingKey::Explicit(ExplicitKey::parse(raw).unwrap());
    let preferred = router.table().explain(&key).preferred.unwrap();
    for worker in router.table().workers() {
        let sample = FleetSample {
            reported: 0,
            local_at_scrape: 0,
        };
        router.publish_sample(&worker.stats, sample, 1);
    }
    let (count, branch) = measure_explicit(&router, raw);
    assert_eq!(branch, Branch::ExplicitRoutingKeyHit);
    assert_eq!(count, 0);
    // Other replicas put 5 requests on the preferred worker.
    let hot = FleetSample {
        reported: 5,
        local_at_scrape: 0,
    };
    router.publish_sample(&router.table().workers()[preferred].stats, hot, 2);
    let (count, branch) = measure_explicit(&router, raw);
    assert_eq!(branch, Branch::ExplicitRoutingKeySpillover);
    assert_eq!(count, 0);
    assert_eq!(
        router.table().explain(&key).load_signal,
        Some(LoadSignal::WorkerMetrics)
    );
}

#[test]
fn implicit_keyless_and_target_do_not_allocate() {
    let router = router(PolicySettings::default());
    let implicit = RoutingKey::Implicit(ImplicitKey::from_value(
        ImplicitSource::Authorization,
        b"Bearer token",
    ));
    for (key, expected) in [
        (implicit, Branch::ImplicitRoutingKeyHit),
        (RoutingKey::None, Branch::Keyless),
        (RoutingKey::Target(b"w2"), Branch::TargetWorkerHit),
        (
            RoutingKey::Target(b"http://127.0.0.1:32001"),
            Branch::TargetWorkerHit,
        ),
        (RoutingKey::Target(b"3"), Branch::TargetWorkerHit),
        (RoutingKey::Target(b"nope"), Branch::TargetWorkerMiss),
    ] {
        let (count, branch) = measure_key(&router, &key);
        assert_eq!(branch, expected, "{key:?}");
        assert_eq!(count, 0, "{key:?}");
    }
}

#[test]
fn baselines_and_explain_do_not_allocate() {
    let router = router(PolicySettings::default());
    let explicit = RoutingKey::Explicit(ExplicitKey::parse(b"k").unwrap());
    for kind in [
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::ConsistentHashing,
    ] {
        router
            .set_policy(&PolicyPatch {
                kind: Some(kind),
                ..PolicyPatch::default()
            })
            .unwrap();
        let (count, _) = measure_key(&router, &explicit);
        assert_eq!(count, 0, "{kind}");
    }
    let table = router.table();
    let info = measure(|| {
        for _ in 0..REPEAT {
            assert!(table.explain(&explicit).worker.is_some());
        }
    });
    assert_eq!(info.count_total, 0);
}

#[test]
fn no_healthy_workers_does_not_allocate() {
    let router = router(PolicySettings::default());
    for i in 0..4 {
        assert!(router.set_health(&format!("w{i}"), false));
    }
    let key = RoutingKey::Explicit(ExplicitKey::parse(b"k").unwrap());
    let (count, branch) = measure_key(&router, &key);
    assert_eq!(branch, Branch::NoHealthyWorkers);
    assert_eq!(count, 0);
}
