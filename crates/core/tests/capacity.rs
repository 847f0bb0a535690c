//! The capacity rule (docs/policy.md, "Capacity"), checked against an independent statement of it:
//! a full worker is never chosen; explicit keys move at once to the first worker with room in
//! their spill order; implicit keys and target workers never move, they wait; keyless requests go
//! only to a worker with room; every search asks each worker at most once whether it is full,
//! also when every worker is full; caps no worker reaches change no decision; and concurrent
//! routes never take a worker past its cap.

use std::cell::RefCell;
use std::sync::{Arc, Barrier};
use std::thread;

use bch_core::admission::{AdmissionPatch, AdmissionSettings, EngineReport, Wait};
use bch_core::decide::{Decision, FleetView, decide};
use bch_core::policy::{Branch, PolicyKind, PolicyPatch, PolicySettings, SpillOrder};
use bch_core::ring::Ring;
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource, RoutingKey};
use proptest::prelude::*;

/// A fleet whose loads, health, caps and engine flags the test sets directly, counting how often
/// a decision asks whether each worker is full.
#[derive(Debug, Clone)]
struct CappedFleet {
    routable: Vec<bool>,
    loads: Vec<u64>,
    caps: Vec<Option<u64>>,
    engine_full: Vec<bool>,
    limited: bool,
    asked: RefCell<Vec<u32>>,
}

impl CappedFleet {
    /// The rule's definition of full, stated here independently of the crate.
    fn full(&self, worker: usize) -> bool {
        self.engine_full[worker] || self.caps[worker].is_some_and(|cap| self.loads[worker] >= cap)
    }

    fn has_room(&self, worker: usize) -> bool {
        self.routable[worker] && !self.full(worker)
    }
}

impl FleetView for CappedFleet {
    fn worker_count(&self) -> usize {
        self.loads.len()
    }
    fn routable(&self, worker: usize) -> bool {
        self.routable[worker]
    }
    fn routable_count(&self) -> usize {
        self.routable.iter().filter(|r| **r).count()
    }
    fn load(&self, worker: usize) -> u64 {
        self.loads[worker]
    }
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        let index: usize = std::str::from_utf8(raw)
            .ok()?
            .strip_prefix('w')?
            .parse()
            .ok()?;
        (index < self.loads.len()).then_some(index)
    }
    fn limited(&self) -> bool {
        self.limited
    }
    fn capacity(&self, worker: usize) -> Option<u64> {
        self.caps[worker]
    }
    // `is_full` asks this exactly once per check, so it counts the checks.
    fn engine_full(&self, worker: usize) -> bool {
        self.asked.borrow_mut()[worker] += 1;
        self.engine_full[worker]
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum KeyKind {
    Explicit,
    Implicit,
    Target,
    None,
}

fn key_kinds() -> impl Strategy<Value = KeyKind> {
    prop_oneof![
        Just(KeyKind::Explicit),
        Just(KeyKind::Implicit),
        Just(KeyKind::Target),
        Just(KeyKind::None),
    ]
}

fn kinds() -> impl Strategy<Value = PolicyKind> {
    prop::sample::select(PolicyKind::ALL.to_vec())
}

fn orders() -> impl Strategy<Value = SpillOrder> {
    prop::sample::select(SpillOrder::ALL.to_vec())
}

/// Fleets of `sizes` workers: routable mostly, small loads, caps of 1..=5 on most workers and an
/// engine flag on some.
fn fleets(sizes: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = CappedFleet> {
    sizes.prop_flat_map(|n| {
        (
            prop::collection::vec(prop::bool::weighted(0.85), n),
            prop::collection::vec(0u64..7, n),
            prop::collection::vec(prop::option::weighted(0.8, 1u64..6), n),
            prop::collection::vec(prop::bool::weighted(0.1), n),
        )
            .prop_map(move |(routable, loads, caps, engine_full)| CappedFleet {
                routable,
                loads,
                caps,
                engine_full,
                limited: true,
                asked: RefCell::new(vec![0; n]),
            })
    })
}

fn ring_of(n: usize) -> Ring {
    let ids: Vec<String> = (0..n).map(|i| format!("http://10.0.0.{i}:8000")).collect();
    Ring::build(&ids, 16)
}

fn policy(kind: PolicyKind, spill_order: SpillOrder, gap: u64) -> PolicySettings {
    PolicySettings {
        kind,
        spill_order,
        min_load_gap: gap,
        ..PolicySettings::default()
    }
}

/// Decides `kind` of key with text `text` (a worker index for target keys).
fn decide_key(
    ring: &Ring,
    policy: &PolicySettings,
    fleet: &CappedFleet,
    kind: KeyKind,
    text: &str,
    target: usize,
    entropy: u64,
) -> Decision {
    let target_name = format!("w{target}");
    let key = match kind {
        KeyKind::Explicit => RoutingKey::Explicit(ExplicitKey::parse(text.as_bytes()).unwrap()),
        KeyKind::Implicit => RoutingKey::Implicit(ImplicitKey::from_value(
            ImplicitSource::Cookie,
            text.as_bytes(),
        )),
        KeyKind::Target => RoutingKey::Target(target_name.as_bytes()),
        KeyKind::None => RoutingKey::None,
    };
    decide(ring, policy, &key, fleet, entropy, entropy >> 7)
}

/// The first routable worker clockwise from the key, by the ring's walk.
fn preferred_of(ring: &Ring, fleet: &CappedFleet, position: u64) -> Option<usize> {
    ring.points_from(position).find(|&w| fleet.routable[w])
}

/// Where the rule says an explicit key whose preferred worker is full goes.
fn first_with_room(
    ring: &Ring,
    order: SpillOrder,
    fleet: &CappedFleet,
    preferred: usize,
    position: u64,
) -> Option<usize> {
    let room = |w: usize| w != preferred && fleet.has_room(w);
    match order {
        SpillOrder::Ring => ring.points_from(position).find(|&w| room(w)),
        SpillOrder::HashSeeded => ring.first_seeded(position, room),
    }
}

/// One generated request: the policy it meets and its key.
struct Case {
    kind: PolicyKind,
    order: SpillOrder,
    gap: u64,
    key_kind: KeyKind,
    text: String,
    target: usize,
    entropy: u64,
}

fn check_rule(fleet: &CappedFleet, case: Case) -> Result<(), TestCaseError> {
    let Case {
        kind,
        order,
        gap,
        key_kind,
        ref text,
        target,
        entropy,
    } = case;
    let n = fleet.loads.len();
    let ring = ring_of(n);
    let policy = policy(kind, order, gap);
    let target = target % n;
    let decision = decide_key(&ring, &policy, fleet, key_kind, text, target, entropy);
    let asked = fleet.asked.borrow().clone();
    fleet.asked.borrow_mut().fill(0);

    // A full worker is never chosen.
    if let Some(w) = decision.worker {
        prop_assert!(
            fleet.has_room(w),
            "chose full or unroutable {w}: {decision:?}"
        );
        prop_assert!(decision.wait.is_none());
    }
    let any_room = (0..n).any(|w| fleet.has_room(w));
    let hashing = matches!(
        kind,
        PolicyKind::ConsistentHashing | PolicyKind::BoundedConsistentHashing
    );
    if key_kind == KeyKind::Target {
        let expected = if !fleet.routable[target] {
            (None, Branch::TargetWorkerMiss, None)
        } else if fleet.full(target) {
            (
                None,
                Branch::TargetWorkerFull,
                Some(Wait::ForWorker(target)),
            )
        } else {
            (Some(target), Branch::TargetWorkerHit, None)
        };
        prop_assert_eq!((decision.worker, decision.branch, decision.wait), expected);
    } else if !fleet.routable.contains(&true) {
        prop_assert_eq!(decision.branch, Branch::NoHealthyWorkers);
        prop_assert_eq!(decision.wait, None);
    } else if !hashing || key_kind == KeyKind::None {
        // Keyless, or a baseline that ignores keys: only workers with room; none, wait for any.
        if any_room {
            prop_assert!(decision.worker.is_some());
            prop_assert_eq!(decision.branch, Branch::Keyless);
        } else {
            prop_assert_eq!(
                (decision.worker, decision.branch, decision.wait),
                (None, Branch::FleetFull, Some(Wait::ForAnyWorker))
            );
        }
    } else {
        let position = match key_kind {
            KeyKind::Explicit => ExplicitKey::parse(text.as_bytes()).unwrap().position(),
            _ => ImplicitKey::from_value(ImplicitSource::Cookie, text.as_bytes()).position(),
        };
        let preferred = preferred_of(&ring, fleet, position).unwrap();
        prop_assert_eq!(decision.preferred, Some(preferred));
        if key_kind == KeyKind::Implicit {
            // Implicit keys never move: their worker, or a wait for it.
            if fleet.full(preferred) {
                prop_assert_eq!(
                    (decision.worker, decision.branch, decision.wait),
                    (
                        None,
                        Branch::ImplicitRoutingKeyFull,
                        Some(Wait::ForWorker(preferred))
                    )
                );
            } else {
                prop_assert_eq!(decision.worker, Some(preferred));
            }
        } else if fleet.full(preferred) {
            // Explicit keys move at once, whatever the bound says.
            match first_with_room(&ring, order, fleet, preferred, position) {
                Some(to) => prop_assert_eq!(
                    (decision.worker, decision.branch),
                    (Some(to), Branch::ExplicitRoutingKeyCapacitySpill)
                ),
                None => prop_assert_eq!(
                    (decision.worker, decision.branch, decision.wait),
                    (None, Branch::FleetFull, Some(Wait::ForAnyWorker))
                ),
            }
            prop_assert!(decision.branch.is_spill_event() || decision.branch.is_full());
        } else {
            prop_assert!(decision.worker.is_some());
        }
        // Each worker is asked at most once whether it is full, also when all are.
        prop_assert!(asked.iter().all(|&a| a <= 1), "asked {asked:?}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_capacity_rule_holds(
        fleet in fleets(1..=10),
        kind in kinds(),
        order in orders(),
        gap in 0u64..3,
        key_kind in key_kinds(),
        text in "[a-z0-9]{1,12}",
        target in 0usize..16,
        entropy in any::<u64>(),
    ) {
        check_rule(&fleet, Case { kind, order, gap, key_kind, text, target, entropy })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Fleets past 64 workers take the searches without bitmasks.
    #[test]
    fn the_capacity_rule_holds_on_large_fleets(
        fleet in fleets(65..=80),
        kind in kinds(),
        order in orders(),
        key_kind in key_kinds(),
        text in "[a-z0-9]{1,12}",
        target in 0usize..80,
        entropy in any::<u64>(),
    ) {
        check_rule(&fleet, Case { kind, order, gap: 2, key_kind, text, target, entropy })?;
    }

    /// Caps no worker reaches, asked for or not, change no decision: without limits the rule is
    /// the one without capacity.
    #[test]
    fn caps_no_worker_reaches_change_nothing(
        fleet in fleets(1..=70),
        kind in kinds(),
        order in orders(),
        gap in 0u64..3,
        key_kind in key_kinds(),
        text in "[a-z0-9]{1,12}",
        target in 0usize..70,
        entropy in any::<u64>(),
    ) {
        let n = fleet.loads.len();
        let uncapped = CappedFleet {
            caps: vec![None; n],
            engine_full: vec![false; n],
            limited: false,
            ..fleet.clone()
        };
        let unreached = CappedFleet {
            caps: vec![Some(u64::MAX); n],
            limited: true,
            ..uncapped.clone()
        };
        let ring = ring_of(n);
        let policy = policy(kind, order, gap);
        let target = target % n;
        let plain = decide_key(&ring, &policy, &uncapped, key_kind, &text, target, entropy);
        let capped = decide_key(&ring, &policy, &unreached, key_kind, &text, target, entropy);
        prop_assert_eq!(plain, capped);
        prop_assert_eq!(plain.wait, None);
    }
}

fn spec(i: usize, max_in_flight: Option<u64>) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{i}"),
        url: format!("http://10.0.0.{i}:8000"),
        ring_id: None,
        source: WorkerSource::Static,
        max_in_flight,
        models: Vec::new(),
    }
}

fn capped_router(workers: usize, cap: u64) -> Router {
    let policy = PolicySettings {
        admission: AdmissionSettings {
            max_in_flight_per_worker: cap,
            ..AdmissionSettings::default()
        },
        ..PolicySettings::default()
    };
    Router::new((0..workers).map(|i| spec(i, None)).collect(), policy).unwrap()
}

/// Eight threads route explicit and keyless requests at once, holding every guard: exactly the
/// fleet's capacity is admitted, no worker past its cap, and the rest are told to wait.
#[test]
fn concurrent_routes_never_pass_a_cap() {
    let router = Arc::new(capped_router(4, 3));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let router = Arc::clone(&router);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                (0..10)
                    .map(|i| {
                        let key = if (t + i) % 3 == 0 {
                            RoutingKey::None
                        } else {
                            RoutingKey::Explicit(ExplicitKey::parse(b"hot").unwrap())
                        };
                        router.route(&key)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let routed: Vec<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let admitted = routed.iter().filter(|r| r.guard.is_some()).count();
    assert_eq!(admitted, 12, "four workers of capacity 3");
    let table = router.table();
    for worker in table.workers() {
        assert_eq!(worker.stats.active(), 3, "{}", worker.spec.name);
    }
    for waiting in routed.iter().filter(|r| r.guard.is_none()) {
        assert_eq!(waiting.decision.wait, Some(Wait::ForAnyWorker));
        assert_eq!(waiting.decision.branch, Branch::FleetFull);
    }
    drop(routed);
    assert!(table.workers().iter().all(|w| w.stats.active() == 0));
    // A slot freed: deciding again admits.
    let again = router.route(&RoutingKey::Explicit(ExplicitKey::parse(b"hot").unwrap()));
    assert_eq!(again.decision.branch, Branch::ExplicitRoutingKeyHit);
}

#[test]
fn a_capacity_spill_is_counted_like_a_spill() {
    let router = capped_router(3, 1);
    let key = RoutingKey::Explicit(ExplicitKey::parse(b"session").unwrap());
    let first = router.route(&key);
    let preferred = first.decision.worker.unwrap();
    let second = router.route(&key);
    assert_eq!(
        second.decision.branch,
        Branch::ExplicitRoutingKeyCapacitySpill
    );
    assert_eq!(second.decision.preferred, Some(preferred));
    let to = second.decision.worker.unwrap();
    assert_ne!(to, preferred);
    let table = router.table();
    assert_eq!(table.workers()[preferred].stats.spilled_out_total(), 1);
    assert_eq!(table.workers()[to].stats.spilled_in_total(), 1);
    assert!(second.decision.branch.is_spill_event());
}

#[test]
fn a_worker_override_and_an_engine_report_make_a_worker_full() {
    // No fleet cap; w0 holds one request.
    let router = Router::new(
        vec![spec(0, Some(1)), spec(1, None)],
        PolicySettings::default(),
    )
    .unwrap();
    let target = RoutingKey::Target(b"w0");
    let held = router.route(&target);
    assert_eq!(held.decision.branch, Branch::TargetWorkerHit);
    let table = router.table();
    assert_eq!((table.capacity(0), table.capacity(1)), (Some(1), None));
    assert!(table.full(0) && !table.full(1));
    let waits = router.route(&target);
    assert_eq!(
        (
            waits.decision.worker,
            waits.decision.branch,
            waits.decision.wait
        ),
        (None, Branch::TargetWorkerFull, Some(Wait::ForWorker(0)))
    );
    assert!(waits.guard.is_none());
    // The retry after a failed connection skips the full worker.
    let retry = router.route_retry(&table, &RoutingKey::None, 1);
    assert!(retry.is_none(), "w1 failed and w0 is full");
    drop(held);
    // Engine-reported: w1 says 5 waiting; with max_waiting 4 it is full, and its record says so.
    router
        .set_policy(&PolicyPatch {
            admission: Some(AdmissionPatch {
                max_waiting: Some(4),
                ..AdmissionPatch::default()
            }),
            ..PolicyPatch::default()
        })
        .unwrap();
    let table = router.table();
    table.workers()[1]
        .stats
        .engine_report()
        .publish(EngineReport {
            waiting: 5,
            kv_usage: 0.2,
        });
    assert!(table.full(1));
    let records = table.worker_records(0);
    assert_eq!((records[0].capacity, records[0].full), (Some(1), false));
    assert_eq!((records[1].capacity, records[1].full), (None, true));
    let waits = router.route(&RoutingKey::Target(b"w1"));
    assert_eq!(waits.decision.branch, Branch::TargetWorkerFull);
    table.workers()[1].stats.engine_report().clear();
    let served = router.route(&RoutingKey::Target(b"w1"));
    assert_eq!(served.decision.branch, Branch::TargetWorkerHit);
}

#[test]
fn a_refused_admission_patch_names_its_field_and_changes_nothing() {
    let router = capped_router(2, 4);
    let before = router.table();
    let error = router
        .set_policy(&PolicyPatch {
            min_load_gap: Some(0),
            admission: Some(AdmissionPatch {
                max_kv_usage: Some(1.5),
                ..AdmissionPatch::default()
            }),
            ..PolicyPatch::default()
        })
        .unwrap_err();
    assert_eq!(error.field(), "max_kv_usage");
    assert!(Arc::ptr_eq(&before, &router.table()));
    let applied = router
        .set_policy(&PolicyPatch {
            admission: Some(AdmissionPatch {
                max_in_flight_per_worker: Some(0),
                ..AdmissionPatch::default()
            }),
            ..PolicyPatch::default()
        })
        .unwrap();
    assert_eq!(applied.admission.max_in_flight_per_worker, 0);
    assert_eq!(router.table().capacity(0), None);
    // The patch reads with the `[admission]` names, nested under `admission`.
    let patch: PolicyPatch =
        serde_json::from_str(r#"{"admission":{"queue_timeout_ms":500,"max_queued":8}}"#).unwrap();
    assert_eq!(patch.admission.unwrap().max_queued, Some(8));
}

/// A bound spill on a large fleet whose eligible workers are all full but one: the walk asks each
/// worker once, finds the one with room, and with none left ends with the preferred worker.
#[test]
fn a_bound_spill_past_full_workers_asks_each_once() {
    let n = 70;
    let ring = ring_of(n);
    let key = ExplicitKey::parse(b"hot").unwrap();
    let preferred = ring.owner(key.position()).unwrap();
    let last = *ring.workers_from(key.position()).last().unwrap();
    let mut fleet = CappedFleet {
        routable: vec![true; n],
        loads: vec![0; n],
        caps: vec![None; n],
        engine_full: vec![true; n],
        limited: true,
        asked: RefCell::new(vec![0; n]),
    };
    fleet.loads[preferred] = 10;
    fleet.engine_full[preferred] = false;
    fleet.engine_full[last] = false;
    let policy = policy(PolicyKind::BoundedConsistentHashing, SpillOrder::Ring, 2);
    let decision = decide(&ring, &policy, &RoutingKey::Explicit(key), &fleet, 0, 0);
    assert_eq!(
        (decision.worker, decision.branch),
        (Some(last), Branch::ExplicitRoutingKeySpillover)
    );
    assert!(
        fleet.asked.borrow().iter().all(|&a| a <= 1),
        "{:?}",
        fleet.asked
    );
    fleet.asked.borrow_mut().fill(0);
    fleet.engine_full[last] = true;
    let decision = decide(&ring, &policy, &RoutingKey::Explicit(key), &fleet, 0, 0);
    assert_eq!(
        (decision.worker, decision.branch),
        (
            Some(preferred),
            Branch::ExplicitRoutingKeyNoEligibleCandidate
        )
    );
    assert!(
        fleet.asked.borrow().iter().all(|&a| a <= 1),
        "{:?}",
        fleet.asked
    );
}
