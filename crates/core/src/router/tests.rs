use super::*;
use crate::policy::Branch;
use crate::routing_key::ExplicitKey;

fn spec(n: u16) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{n}"),
        url: format!("http://127.0.0.1:{}", 30000 + n),
        ring_id: None,
        source: WorkerSource::Static,
        max_in_flight: None,
        models: Vec::new(),
    }
}

#[test]
fn health_and_threshold_changes_reuse_the_ring() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    let before = Arc::clone(router.table().ring());
    assert!(router.set_health("w1", false));
    assert!(!router.set_health("w1", false));
    router
        .set_policy(&PolicyPatch {
            min_load_gap: Some(7),
            ..Default::default()
        })
        .unwrap();
    let after = router.table();
    assert!(Arc::ptr_eq(&before, after.ring()));
    assert_eq!(after.policy().min_load_gap, 7);
    assert_eq!(after.healthy_flags(), &[false, true]);
    router
        .set_policy(&PolicyPatch {
            virtual_nodes: Some(10),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(router.table().ring().len(), 20);
    assert_eq!(
        router.table().healthy_flags(),
        &[false, true],
        "health survives a rebuild"
    );
}

#[test]
fn refused_changes_leave_the_table_alone() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    let before = router.table();
    assert!(
        router
            .set_policy(&PolicyPatch {
                max_load_skew: Some(0.5),
                ..Default::default()
            })
            .is_err()
    );
    assert_eq!(
        router.add_worker(WorkerSpec {
            name: "w1".into(),
            url: "http://other".into(),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        }),
        Err(MembershipError::DuplicateName("w1".into()))
    );
    assert_eq!(
        router.remove_worker("nope"),
        Err(MembershipError::UnknownWorker("nope".into()))
    );
    assert!(Arc::ptr_eq(&before, &router.table()));
}

#[test]
fn reserve_takes_load_on_the_named_worker_until_the_guard_drops() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    let table = router.table();
    assert!(router.reserve(&table, 2).is_none());
    let guard = router.reserve(&table, 1).unwrap();
    assert_eq!(table.workers()[1].stats.active(), 1);
    assert_eq!(table.workers()[1].stats.requests_total(), 1);
    assert_eq!(table.workers()[0].stats.active(), 0);
    drop(guard);
    assert_eq!(table.workers()[1].stats.active(), 0);
}

#[test]
fn counters_survive_remove_and_re_add() {
    let router = Router::new(vec![spec(1)], PolicySettings::default()).unwrap();
    let key = ExplicitKey::parse(b"k").unwrap();
    let routed = router.route(&RoutingKey::Explicit(key));
    assert_eq!(routed.decision.worker, Some(0));
    router.remove_worker("w1").unwrap();
    assert_eq!(
        router.route(&RoutingKey::Explicit(key)).decision.branch,
        Branch::NoHealthyWorkers
    );
    router.add_worker(spec(1)).unwrap();
    assert_eq!(router.table().workers()[0].stats.active(), 1);
    drop(routed);
    assert_eq!(router.table().workers()[0].stats.active(), 0);
}

#[test]
fn a_held_stats_arc_keeps_a_departed_workers_counters_for_its_return() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    let key = RoutingKey::Explicit(ExplicitKey::parse(b"k").unwrap());
    drop(router.route(&key));
    let table = router.table();
    let kept = Arc::clone(&table.workers()[0].stats);
    let forgotten_total = table.workers()[1].stats.requests_total();
    drop(table);
    router.remove_worker("w1").unwrap();
    router.remove_worker("w2").unwrap();
    router
        .reconfigure(vec![spec(2), spec(1)], PolicySettings::default())
        .unwrap();
    let table = router.table();
    assert!(
        Arc::ptr_eq(&kept, &table.workers()[1].stats),
        "w1 gets its counters back"
    );
    assert_eq!(
        table.workers()[0].stats.requests_total(),
        0,
        "nobody held w2's"
    );
    assert_eq!(kept.requests_total() + forgotten_total, 1);
}

#[test]
fn reconfigure_swaps_workers_and_policy_together_or_not_at_all() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    router.set_health("w2", false);
    let before = router.table();
    let bad = PolicySettings {
        max_load_skew: 0.5,
        ..Default::default()
    };
    assert!(router.reconfigure(vec![spec(2), spec(3)], bad).is_err());
    assert!(Arc::ptr_eq(&before, &router.table()));
    let good = PolicySettings {
        min_load_gap: 9,
        ..Default::default()
    };
    router.reconfigure(vec![spec(2), spec(3)], good).unwrap();
    let after = router.table();
    assert_eq!(after.policy().min_load_gap, 9);
    let names: Vec<_> = after
        .workers()
        .iter()
        .map(|w| w.spec.name.as_str())
        .collect();
    assert_eq!(names, ["w2", "w3"]);
    assert_eq!(after.healthy_flags(), &[false, true], "w2 keeps its health");
    assert_eq!(
        after.membership_generation(),
        before.membership_generation() + 1
    );
}

#[test]
fn a_draining_worker_gets_no_new_requests_and_keeps_its_health_and_state() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    let key = ExplicitKey::parse(b"session").unwrap();
    let preferred = router.route(&RoutingKey::Explicit(key)).decision.worker;
    let home = preferred.unwrap();
    let name = router.table().workers()[home].spec.name.clone();
    assert_eq!(router.set_state(&name, WorkerState::Draining), Some(true));
    assert_eq!(router.set_state(&name, WorkerState::Draining), Some(false));
    assert_eq!(router.set_state("nope", WorkerState::Draining), None);
    let table = router.table();
    assert_eq!(table.healthy_flags(), &[true, true], "health untouched");
    assert_eq!(table.routable_count(), 1);
    let routed = router.route(&RoutingKey::Explicit(key));
    assert_eq!(
        routed.decision.worker,
        Some(1 - home),
        "where an unhealthy worker's go"
    );
    let target = router.route(&RoutingKey::Target(name.as_bytes()));
    assert_eq!(target.decision.branch, Branch::TargetWorkerMiss);
    assert!(
        router
            .route_retry(&table, &RoutingKey::None, 1 - home)
            .is_none(),
        "a retry never lands on it either"
    );
    // Kept across a membership change (a reload of the same workers), like health.
    router
        .reconfigure(vec![spec(1), spec(2)], PolicySettings::default())
        .unwrap();
    let table = router.table();
    assert_eq!(table.states()[home], WorkerState::Draining);
    assert_eq!(table.worker_records(0)[home].state, WorkerState::Draining);
    router.set_state(&name, WorkerState::Active);
    let back = router.route(&RoutingKey::Explicit(key)).decision.worker;
    assert_eq!(back, preferred, "undrained, the key comes home");
}

#[test]
fn new_workers_can_start_unhealthy_and_health_flips_are_counted() {
    let router =
        Router::with_initial_health(vec![spec(1)], PolicySettings::default(), false).unwrap();
    assert_eq!(router.table().healthy_flags(), &[false]);
    assert_eq!(
        router.route(&RoutingKey::None).decision.branch,
        Branch::NoHealthyWorkers
    );
    assert!(router.set_health("w1", true));
    router.add_worker(spec(2)).unwrap();
    assert_eq!(
        router.table().healthy_flags(),
        &[true, false],
        "only the new one waits"
    );
    // A change that joins w3 and starts joining workers healthy from now on.
    let joins_healthy = router
        .prepare(
            vec![spec(1), spec(2), spec(3)],
            PolicySettings::default(),
            true,
        )
        .unwrap();
    router.commit(joins_healthy);
    assert_eq!(router.table().healthy_flags(), &[true, false, true]);
    router.set_health("w1", false);
    router.set_health("w1", false);
    assert_eq!(router.table().workers()[0].stats.health_changes_total(), 2);
}

#[test]
fn the_walk_yields_routable_workers_once_in_ring_order_without_the_skipped() {
    let router = Router::new((1..=5).map(spec).collect(), PolicySettings::default()).unwrap();
    router.set_health("w2", false);
    router.set_state("w4", WorkerState::Draining);
    let table = router.table();
    assert_eq!(table.healthy_flags(), &[true, false, true, true, true]);
    assert!(table.routable(0) && !table.routable(1) && !table.routable(3));
    assert!(!table.routable(5), "no such worker");
    let position = crate::ring::hash_position(b"key");
    let expected: Vec<usize> = table
        .ring()
        .workers_from(position)
        .into_iter()
        .filter(|&w| ![1, 3, 4].contains(&w))
        .collect();
    let walk: Vec<usize> = table.routable_from(position, |w| w == 4).collect();
    assert_eq!(walk, expected);
    assert_eq!(expected.len(), 2);
    assert_eq!(
        router
            .route_retry(
                &table,
                &RoutingKey::Explicit(ExplicitKey::parse(b"key").unwrap()),
                4
            )
            .map(|(w, _)| w),
        expected.first().copied(),
        "a retry takes the walk's first"
    );
}

#[test]
fn keyless_fallbacks_go_to_the_least_loaded_routable_worker() {
    let router = Router::new((1..=4).map(spec).collect(), PolicySettings::default()).unwrap();
    router.set_state("w1", WorkerState::Draining);
    let table = router.table();
    let _held = [
        router.reserve(&table, 1),
        router.reserve(&table, 1),
        router.reserve(&table, 2),
    ];
    assert_eq!(table.least_loaded_routable(|_| false), Some(3));
    assert_eq!(table.least_loaded_routable(|w| w == 3), Some(2));
    assert_eq!(table.least_loaded_routable(|w| w != 0), None, "w1 drains");
    assert_eq!(
        router
            .route_retry(&table, &RoutingKey::None, 3)
            .map(|(w, _)| w),
        Some(2)
    );
}

proptest::proptest! {
    #[test]
    fn the_walk_yields_only_routable_workers_each_once_in_ring_order(
        workers in 1u16..12,
        virtual_nodes in 1u32..40,
        flags in proptest::collection::vec((proptest::bool::ANY, proptest::bool::ANY), 12),
        skipped in proptest::collection::vec(proptest::bool::ANY, 12),
        position in proptest::num::u64::ANY,
    ) {
        let policy = PolicySettings { virtual_nodes, ..PolicySettings::default() };
        let router = Router::new((0..workers).map(spec).collect(), policy).unwrap();
        for (w, (healthy, draining)) in flags.iter().take(usize::from(workers)).enumerate() {
            let name = format!("w{w}");
            router.set_health(&name, *healthy);
            if *draining {
                router.set_state(&name, WorkerState::Draining);
            }
        }
        let table = router.table();
        let walk: Vec<usize> = table.routable_from(position, |w| skipped[w]).collect();
        for &w in &walk {
            proptest::prop_assert!(table.healthy_flags()[w]);
            proptest::prop_assert_eq!(table.states()[w], WorkerState::Active);
            proptest::prop_assert!(!skipped[w]);
        }
        // Ring order, each once: the walk is the first-point order of the turn, filtered.
        let mut seen = vec![false; usize::from(workers)];
        let reference: Vec<usize> = table
            .ring()
            .points_from(position)
            .filter(|&w| !std::mem::replace(&mut seen[w], true))
            .filter(|&w| table.routable(w) && !skipped[w])
            .collect();
        proptest::prop_assert_eq!(walk, reference);
    }
}

#[test]
fn target_resolution_order() {
    let specs = [
        WorkerSpec {
            name: "1".into(),
            url: "http://a".into(),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        },
        WorkerSpec {
            name: "b".into(),
            url: "http://b".into(),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        },
    ];
    assert_eq!(
        resolve_target(specs.iter(), b"1"),
        Some(0),
        "name before index"
    );
    assert_eq!(resolve_target(specs.iter(), b"http://b"), Some(1));
    assert_eq!(resolve_target(specs.iter(), b"0"), Some(0));
    assert_eq!(resolve_target(specs.iter(), b"2"), None);
    assert_eq!(resolve_target(specs.iter(), b"\xff"), None);
}

#[test]
fn prepare_checks_everything_and_changes_nothing_then_commit_swaps_once() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    router.set_health("w2", false);
    let before = router.table();
    let bad = PolicySettings {
        max_load_skew: 0.5,
        ..Default::default()
    };
    assert!(router.prepare(vec![spec(2), spec(3)], bad, true).is_err());
    assert!(matches!(
        router.prepare(vec![spec(2), spec(2)], PolicySettings::default(), true),
        Err(RouterError::Membership(MembershipError::DuplicateName(_)))
    ));
    let prepared = router
        .prepare(vec![spec(2), spec(3)], PolicySettings::default(), false)
        .unwrap();
    assert!(!prepared.keeps_workers());
    assert!(
        Arc::ptr_eq(&before, &router.table()),
        "prepare swaps nothing"
    );
    let after = router.commit(prepared);
    assert!(Arc::ptr_eq(&after, &router.table()));
    assert_eq!(
        after.healthy_flags(),
        &[false, false],
        "w2 keeps its health; w3 starts as the change says"
    );
    assert_eq!(
        after.membership_generation(),
        before.membership_generation() + 1
    );
    router.add_worker(spec(4)).unwrap();
    assert!(!router.table().healthy_flags()[2], "and so do later ones");
}

#[test]
fn a_policy_only_commit_keeps_the_ring_and_generation_and_an_empty_one_swaps_nothing() {
    let router = Router::new(vec![spec(1), spec(2)], PolicySettings::default()).unwrap();
    let before = router.table();
    let same = router
        .prepare(vec![spec(1), spec(2)], PolicySettings::default(), true)
        .unwrap();
    assert!(same.keeps_workers());
    assert!(Arc::ptr_eq(&before, &router.commit(same)));
    let policy = PolicySettings {
        min_load_gap: 9,
        ..Default::default()
    };
    let after = router.commit(
        router
            .prepare(vec![spec(1), spec(2)], policy, true)
            .unwrap(),
    );
    assert!(Arc::ptr_eq(before.ring(), after.ring()));
    assert_eq!(
        after.membership_generation(),
        before.membership_generation()
    );
    assert_eq!(after.policy().min_load_gap, 9);
    let more_points = PolicySettings {
        virtual_nodes: 10,
        ..policy
    };
    let prepared = router
        .prepare(vec![spec(1), spec(2)], more_points, true)
        .unwrap();
    assert!(prepared.keeps_workers(), "no new endpoints needed");
    let rebuilt = router.commit(prepared);
    assert_eq!(rebuilt.ring().len(), 20);
    assert_eq!(
        rebuilt.membership_generation(),
        before.membership_generation() + 1
    );
}

#[test]
fn the_observer_sees_the_table_in_force_and_every_swap_in_order() {
    let router =
        Router::with_initial_health(vec![spec(1), spec(2)], PolicySettings::default(), false)
            .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    assert!(router.observe(move |table| record.lock().unwrap().push(table.routable_count())));
    assert!(!router.observe(|_| {}), "one observer per router");
    assert!(router.set_health("w1", true));
    assert!(!router.set_health("w1", true), "no change, no swap");
    router.set_state("w1", WorkerState::Draining).unwrap();
    router.add_worker(spec(3)).unwrap();
    router.remove_worker("w3").unwrap();
    router
        .set_policy(&PolicyPatch {
            min_load_gap: Some(5),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), [0, 1, 0, 0, 0, 0]);
}

/// Worker `i` of the flip property: models from its code (0: none, 1: `a`, 2: `b`, 3: both), and
/// a cap on every third worker, so pools of part of the fleet, of all of it, and capacities occur.
fn flip_spec(i: usize, code: u8) -> WorkerSpec {
    let models = match code {
        0 => vec![],
        1 => vec!["a".to_owned()],
        2 => vec!["b".to_owned()],
        _ => vec!["a".to_owned(), "b".to_owned()],
    };
    WorkerSpec {
        max_in_flight: i.is_multiple_of(3).then_some(2),
        models,
        ..spec(i as u16)
    }
}

/// `flipped` (derived flip by flip) equals `built` (every list computed whole) field by field, and
/// shares what the membership fixes with it.
fn same_table(
    flipped: &RoutingTable,
    built: &RoutingTable,
) -> Result<(), proptest::test_runner::TestCaseError> {
    proptest::prop_assert_eq!(&flipped.healthy, &built.healthy);
    proptest::prop_assert_eq!(&flipped.states, &built.states);
    proptest::prop_assert_eq!(&flipped.routable, &built.routable);
    proptest::prop_assert_eq!(flipped.routable_count, built.routable_count);
    proptest::prop_assert_eq!(&flipped.routable_indices, &built.routable_indices);
    proptest::prop_assert_eq!(&flipped.pool_routable, &built.pool_routable);
    proptest::prop_assert_eq!(&flipped.capacity, &built.capacity);
    proptest::prop_assert_eq!(flipped.limited, built.limited);
    proptest::prop_assert_eq!(flipped.policy, built.policy);
    proptest::prop_assert_eq!(flipped.membership_generation, built.membership_generation);
    proptest::prop_assert!(Arc::ptr_eq(&flipped.workers, &built.workers));
    proptest::prop_assert!(Arc::ptr_eq(&flipped.ring, &built.ring));
    proptest::prop_assert!(Arc::ptr_eq(&flipped.pools, &built.pools));
    Ok(())
}

proptest::proptest! {
    /// Health and drain flips through the router, in any order and on any workers (models or
    /// none, pools of part of the fleet or all of it), leave the table that one build from the
    /// same flags gives, and every worker is found by name.
    #[test]
    fn a_flip_sequence_yields_the_table_built_with_its_flags(
        codes in proptest::collection::vec(0u8..4, 1..12),
        flips in proptest::collection::vec((0usize..12, proptest::bool::ANY, proptest::bool::ANY), 1..40),
    ) {
        let specs: Vec<WorkerSpec> = codes.iter().enumerate().map(|(i, &c)| flip_spec(i, c)).collect();
        let count = specs.len();
        let policy = PolicySettings { virtual_nodes: 4, ..PolicySettings::default() };
        let router = Router::new(specs, policy).unwrap();
        let first = router.table();
        let mut healthy = vec![true; count];
        let mut states = vec![WorkerState::Active; count];
        for (worker, health, draining) in flips {
            let worker = worker % count;
            let name = format!("w{worker}");
            let state = if draining { WorkerState::Draining } else { WorkerState::Active };
            proptest::prop_assert_eq!(router.set_health(&name, health), healthy[worker] != health);
            proptest::prop_assert_eq!(router.set_state(&name, state), Some(states[worker] != state));
            (healthy[worker], states[worker]) = (health, state);
            let built = first.with_flags(healthy.clone(), states.clone(), policy);
            let table = router.table();
            same_table(&table, &built)?;
            proptest::prop_assert!(Arc::ptr_eq(&table.capacity, &first.capacity));
        }
        let table = router.table();
        for worker in 0..count {
            proptest::prop_assert_eq!(table.index_of(&format!("w{worker}")), Some(worker));
        }
        proptest::prop_assert_eq!(table.index_of("w99"), None);
    }
}
