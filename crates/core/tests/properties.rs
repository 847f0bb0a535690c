//! Property tests of the ring, the bounded rule and load accounting.
//!
//! Each property is checked against an independent statement of the contract (docs/policy.md):
//! placements are compared by worker URL across registration orders and membership changes, the
//! spill rule is recomputed here from the generated loads, and load accounting is checked after every
//! step of random operation sequences against the guards the test itself holds. Case counts and
//! virtual nodes are kept small so the file runs in a few seconds in a debug build; none of these
//! properties depends on there being 150 points per worker.

use std::sync::{Arc, Weak};

use bch_core::decide::{Decision, FleetView, decide};
use bch_core::fleet_load::{FleetSample, LoadSignal, LoadSource, fleet_load};
use bch_core::load::WorkerStats;
use bch_core::policy::{Branch, PolicyKind, PolicyPatch, PolicySettings, SpillOrder};
use bch_core::ring::{Ring, hash_position};
use bch_core::router::{Routed, Router, RoutingTable, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource, RoutingKey};
use proptest::prelude::*;
use proptest::sample::Index;

/// Printable ASCII explicit keys of 1 to 40 characters, in the key grammar: a space inside but
/// none at either end.
const EXPLICIT_KEY: &str = "[!-~]|[!-~][ -~]{0,38}[!-~]";

fn spec(i: usize) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{i}"),
        url: format!("http://10.0.{}.{}:8000", i / 256, i % 256),
        ring_id: None,
        source: WorkerSource::Static,
        max_in_flight: None,
        models: Vec::new(),
    }
}

fn settings(virtual_nodes: u32) -> PolicySettings {
    PolicySettings {
        virtual_nodes,
        ..PolicySettings::default()
    }
}

fn key_texts(salt: u32, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{salt:08x}-{i}")).collect()
}

/// URL of the worker each key is placed on (explicit and implicit kinds), `None` for a 503.
fn placements(table: &RoutingTable, keys: &[String]) -> Vec<Option<String>> {
    let url = |d: Decision| d.worker.map(|w| table.workers()[w].spec.url.clone());
    keys.iter()
        .flat_map(|k| {
            let explicit = RoutingKey::Explicit(ExplicitKey::parse(k.as_bytes()).unwrap());
            let implicit = RoutingKey::Implicit(ImplicitKey::from_value(
                ImplicitSource::Authorization,
                k.as_bytes(),
            ));
            [url(table.explain(&explicit)), url(table.explain(&implicit))]
        })
        .collect()
}

/// A fleet whose loads and health the test sets directly.
struct Fleet {
    healthy: Vec<bool>,
    loads: Vec<u64>,
}

impl FleetView for Fleet {
    fn worker_count(&self) -> usize {
        self.loads.len()
    }
    // No worker drains here, so the healthy ones are the routable ones.
    fn routable(&self, worker: usize) -> bool {
        self.healthy[worker]
    }
    fn routable_count(&self) -> usize {
        self.healthy.iter().filter(|h| **h).count()
    }
    fn load(&self, worker: usize) -> u64 {
        self.loads[worker]
    }
    fn resolve_target(&self, _raw: &[u8]) -> Option<usize> {
        None
    }
}

/// The first healthy worker clockwise from `position`, by the ring's distinct-worker walk.
fn first_healthy_by_walk(ring: &Ring, healthy: &[bool], position: u64) -> Option<usize> {
    ring.workers_from(position)
        .into_iter()
        .find(|&w| healthy[w])
}

/// `n` workers (1..=max), a shuffled order of them, and a health mask.
fn fleet_shape(max: usize) -> impl Strategy<Value = (usize, Vec<usize>, Vec<bool>)> {
    (1..=max).prop_flat_map(|n| {
        (
            Just(n),
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            prop::collection::vec(prop::bool::weighted(0.75), n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Registration order is irrelevant: the same set of workers places every key (explicit and
    /// implicit, with any health mask) on the same URL, and the bare ring gives every position,
    /// including the points themselves and their successors, the same owner.
    #[test]
    fn placement_is_independent_of_registration_order(
        (n, order, healthy) in fleet_shape(8),
        virtual_nodes in 1u32..=40,
        salt in any::<u32>(),
        positions in prop::collection::vec(any::<u64>(), 64),
    ) {
        let specs: Vec<WorkerSpec> = (0..n).map(spec).collect();
        let permuted: Vec<WorkerSpec> = order.iter().map(|&i| specs[i].clone()).collect();
        let a = Router::new(specs.clone(), settings(virtual_nodes)).unwrap();
        let b = Router::new(permuted.clone(), settings(virtual_nodes)).unwrap();
        for (i, up) in healthy.iter().enumerate() {
            if !up {
                prop_assert!(a.set_health(&specs[i].name, false));
                prop_assert!(b.set_health(&specs[i].name, false));
            }
        }
        let keys = key_texts(salt, 100);
        let first = placements(&a.table(), &keys);
        prop_assert_eq!(&first, &placements(&b.table(), &keys));
        prop_assert_eq!(first, placements(&a.table(), &keys), "deterministic");

        let ids: Vec<&str> = specs.iter().map(WorkerSpec::ring_id).collect();
        let permuted_ids: Vec<&str> = permuted.iter().map(WorkerSpec::ring_id).collect();
        let ring = Ring::build(&ids, virtual_nodes);
        let other = Ring::build(&permuted_ids, virtual_nodes);
        let mut probes = positions;
        for (_, arc) in ring.arcs() {
            probes.push(arc.end_inclusive);
            probes.push(arc.end_inclusive.wrapping_add(1));
        }
        probes.extend([0, u64::MAX]);
        for position in probes {
            let owner = ring.owner(position).map(|w| ids[w]);
            prop_assert_eq!(owner, other.owner(position).map(|w| permuted_ids[w]));
            let walk: Vec<&str> = ring.workers_from(position).into_iter().map(|w| ids[w]).collect();
            let other_walk: Vec<&str> =
                other.workers_from(position).into_iter().map(|w| permuted_ids[w]).collect();
            prop_assert_eq!(walk, other_walk);
        }
    }

    /// A worker's `ring_id` stands in for its URL on the ring: a fleet whose ring ids are another
    /// fleet's URLs places every key on the worker at the same index.
    #[test]
    fn ring_id_override_places_like_that_url(
        n in 1usize..=6,
        virtual_nodes in 1u32..=40,
        salt in any::<u32>(),
    ) {
        let plain: Vec<WorkerSpec> = (0..n).map(spec).collect();
        let aliased: Vec<WorkerSpec> = (0..n)
            .map(|i| WorkerSpec {
                name: format!("alias{i}"),
                url: format!("http://192.168.9.{i}:9000"),
                ring_id: Some(plain[i].url.clone()),
                source: WorkerSource::Static,
                max_in_flight: None,
                models: Vec::new(),
            })
            .collect();
        let a = Router::new(plain, settings(virtual_nodes)).unwrap().table();
        let b = Router::new(aliased, settings(virtual_nodes)).unwrap().table();
        for k in key_texts(salt, 100) {
            let key = RoutingKey::Explicit(ExplicitKey::parse(k.as_bytes()).unwrap());
            prop_assert_eq!(a.explain(&key).worker, b.explain(&key).worker);
        }
    }

    /// Adding a worker (anywhere in configuration order) moves only keys that the new worker now
    /// owns; removing it again moves exactly those keys back, and nothing else.
    #[test]
    fn membership_changes_move_only_the_changed_workers_keys(
        (n, _order, healthy) in fleet_shape(7),
        insert_at in any::<Index>(),
        virtual_nodes in 1u32..=40,
        salt in any::<u32>(),
    ) {
        let specs: Vec<WorkerSpec> = (0..n).map(spec).collect();
        let router = Router::new(specs.clone(), settings(virtual_nodes)).unwrap();
        for (i, up) in healthy.iter().enumerate() {
            if !up {
                router.set_health(&specs[i].name, false);
            }
        }
        let keys = key_texts(salt, 150);
        let before = placements(&router.table(), &keys);

        let newcomer = spec(n);
        let mut grown = specs.clone();
        grown.insert(insert_at.index(n + 1), newcomer.clone());
        router.reconfigure(grown, *router.table().policy()).unwrap();
        let grown_table = router.table();
        let after_add = placements(&grown_table, &keys);
        let mut moved = 0;
        for (old, new) in before.iter().zip(&after_add) {
            if old != new {
                prop_assert_eq!(new.as_deref(), Some(newcomer.url.as_str()));
                moved += 1;
            }
        }
        // Every key the newcomer owns moved (it owned none before).
        let owned = after_add.iter().filter(|p| p.as_deref() == Some(newcomer.url.as_str())).count();
        prop_assert_eq!(moved, owned);
        prop_assert_eq!(grown_table.healthy_flags().iter().filter(|h| !**h).count(),
            healthy.iter().filter(|h| !**h).count(), "health survives the rebuild");

        router.remove_worker(&newcomer.name).unwrap();
        let after_remove = placements(&router.table(), &keys);
        for ((added, removed), old) in after_add.iter().zip(&after_remove).zip(&before) {
            if added != removed {
                prop_assert_eq!(added.as_deref(), Some(newcomer.url.as_str()));
            }
            prop_assert_eq!(removed, old);
        }
    }

    /// Health is a filter on a fixed ring: while some workers are down, each key goes to the first
    /// healthy worker of its clockwise walk, keys of healthy owners stay put, the ring is not rebuilt,
    /// and when the workers recover every key returns.
    #[test]
    fn unhealthy_workers_keys_go_clockwise_and_come_back(
        (n, _order, healthy) in fleet_shape(8),
        virtual_nodes in 1u32..=40,
        salt in any::<u32>(),
    ) {
        let specs: Vec<WorkerSpec> = (0..n).map(spec).collect();
        let router = Router::new(specs.clone(), settings(virtual_nodes)).unwrap();
        let keys = key_texts(salt, 150);
        let table = router.table();
        let before = placements(&table, &keys);
        for (i, up) in healthy.iter().enumerate() {
            if !up {
                prop_assert!(router.set_health(&specs[i].name, false));
            }
        }
        let down = router.table();
        prop_assert!(Arc::ptr_eq(table.ring(), down.ring()), "no rebuild on a health flip");
        prop_assert_eq!(down.membership_generation(), table.membership_generation());
        prop_assert_eq!(down.healthy_flags(), &healthy[..]);
        let during = placements(&down, &keys);
        let ring = down.ring();
        for (k, text) in keys.iter().enumerate() {
            let owner = ring.owner(hash_position(text.as_bytes())).unwrap();
            let expected = first_healthy_by_walk(ring, &healthy, hash_position(text.as_bytes()))
                .map(|w| specs[w].url.clone());
            // Explicit and implicit keys hash the same bytes the same way.
            for p in [2 * k, 2 * k + 1] {
                prop_assert_eq!(&during[p], &expected, "key {}", text);
                if healthy[owner] {
                    prop_assert_eq!(&during[p], &before[p], "a healthy owner keeps its key");
                }
            }
        }
        for (i, up) in healthy.iter().enumerate() {
            if !up {
                prop_assert!(router.set_health(&specs[i].name, true));
            }
        }
        prop_assert_eq!(placements(&router.table(), &keys), before);
    }

    /// Implicit keys are strict: whatever the loads, health and thresholds, an implicit key goes to
    /// the first healthy worker clockwise, with no bound check. Explicit keys under the strict policy
    /// behave the same.
    #[test]
    fn implicit_keys_never_spill(
        (n, _order, healthy) in fleet_shape(8),
        loads in prop::collection::vec(0u64..50, 8),
        hot_load in 0u64..100_000,
        min_load_gap in 0u64..6,
        max_load_skew in 1.0f64..4.0,
        bounded in any::<bool>(),
        key in prop::collection::vec(any::<u8>(), 1..64),
        virtual_nodes in 1u32..=40,
    ) {
        let ids: Vec<String> = (0..n).map(|i| spec(i).url).collect();
        let ring = Ring::build(&ids, virtual_nodes);
        let position = hash_position(&key);
        let expected = first_healthy_by_walk(&ring, &healthy, position);
        let mut fleet = Fleet { healthy, loads: loads[..n].to_vec() };
        if let Some(w) = expected {
            fleet.loads[w] = hot_load;
        }
        let policy = PolicySettings {
            kind: if bounded { PolicyKind::BoundedConsistentHashing } else { PolicyKind::ConsistentHashing },
            min_load_gap,
            max_load_skew,
            spill_order: SpillOrder::HashSeeded,
            virtual_nodes,
            load_source: LoadSource::Local,
            admission: Default::default(),
        };
        let implicit = RoutingKey::Implicit(ImplicitKey::from_value(ImplicitSource::Cookie, &key));
        let decision = decide(&ring, &policy, &implicit, &fleet, 7, 7);
        prop_assert_eq!(decision.worker, expected);
        prop_assert_eq!(decision.preferred, expected);
        prop_assert!(decision.bound.is_none());
        let branch = if expected.is_some() { Branch::ImplicitRoutingKeyHit } else { Branch::NoHealthyWorkers };
        prop_assert_eq!(decision.branch, branch);

        if !bounded && expected.is_some()
            && let Ok(explicit) = ExplicitKey::parse(&key) {
                let decision = decide(&ring, &policy, &RoutingKey::Explicit(explicit), &fleet, 7, 7);
                prop_assert_eq!(decision.worker, expected);
                prop_assert_eq!(decision.branch, Branch::ExplicitRoutingKeyHit);
                prop_assert!(decision.bound.is_none());
            }
    }

    /// The bounded rule, recomputed from the generated loads: the decision reports exactly the
    /// preferred load, healthy minimum and healthy mean; it spills iff `preferred − min > gap` and
    /// `preferred > mean × skew` (both strict); the target is the first healthy worker clockwise
    /// after the preferred one with `load <= mean × skew`; and with skew ≥ 1 such a worker always
    /// exists (the healthy minimum qualifies), so "no eligible candidate" never happens.
    #[test]
    fn spill_happens_iff_both_strict_conditions_hold(
        (n, _order, healthy) in fleet_shape(8),
        loads in prop::collection::vec(0u64..12, 8),
        extra in 0u64..40,
        min_load_gap in 0u64..6,
        max_load_skew in skews(),
        key in EXPLICIT_KEY,
        virtual_nodes in 1u32..=40,
        order in spill_orders(),
    ) {
        let rule = Rule { min_load_gap, max_load_skew, order };
        check_spill_rule(&healthy, &loads[..n], extra, rule, &key, virtual_nodes)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The same rule on fleets around the 64-worker line, where the spill search switches from a
    /// bitmask of eligible workers to walking the ring point by point.
    #[test]
    fn spill_rule_holds_on_large_fleets(
        n in 60usize..=72,
        healthy in prop::collection::vec(prop::bool::weighted(0.9), 72),
        loads in prop::collection::vec(0u64..6, 72),
        extra in 0u64..400,
        min_load_gap in 0u64..4,
        max_load_skew in skews(),
        key in EXPLICIT_KEY,
        order in spill_orders(),
    ) {
        let rule = Rule { min_load_gap, max_load_skew, order };
        check_spill_rule(&healthy[..n], &loads[..n], extra, rule, &key, 4)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The same rule with loads beyond 2^53, where `u64 → f64` rounds and `mean × skew` is no
    /// longer below the range where an integer threshold is exact.
    #[test]
    fn spill_rule_holds_with_huge_loads(
        (n, _order, healthy) in fleet_shape(6),
        loads in prop::collection::vec((1u64 << 50)..(1u64 << 58), 6),
        extra in prop_oneof![Just(0u64), (1u64 << 50)..(1u64 << 59)],
        max_load_skew in skews(),
        key in EXPLICIT_KEY,
        order in spill_orders(),
    ) {
        let rule = Rule { min_load_gap: 2, max_load_skew, order };
        check_spill_rule(&healthy, &loads[..n], extra, rule, &key, 8)?;
    }
}

fn skews() -> impl Strategy<Value = f64> {
    prop_oneof![Just(1.0f64), Just(1.5), Just(2.0), 1.0f64..3.0]
}

fn spill_orders() -> impl Strategy<Value = SpillOrder> {
    prop_oneof![Just(SpillOrder::Ring), Just(SpillOrder::HashSeeded)]
}

/// The thresholds and spill order a spill-rule check runs under.
#[derive(Clone, Copy, Debug)]
struct Rule {
    min_load_gap: u64,
    max_load_skew: f64,
    order: SpillOrder,
}

/// MurmurHash3's 64-bit finaliser, restated from docs/policy.md ("Spill order").
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The hash-seeded spill order as docs/policy.md states it: workers by descending
/// `fmix64(key position XOR position(ring id))`, ties to the larger ring-id position.
fn seeded_order_by_spec(ids: &[String], position: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&w| {
        let seed = hash_position(ids[w].as_bytes());
        std::cmp::Reverse((fmix64(position ^ seed), seed))
    });
    order
}

/// Decides `key` on a ring of `healthy.len()` workers with the given loads (the preferred worker
/// gets `extra` more) and checks the decision against the rule recomputed here.
fn check_spill_rule(
    healthy: &[bool],
    loads: &[u64],
    extra: u64,
    rule: Rule,
    key: &str,
    virtual_nodes: u32,
) -> Result<(), TestCaseError> {
    let Rule {
        min_load_gap,
        max_load_skew,
        order,
    } = rule;
    let n = healthy.len();
    let ids: Vec<String> = (0..n).map(|i| spec(i).url).collect();
    let ring = Ring::build(&ids, virtual_nodes);
    let explicit = ExplicitKey::parse(key.as_bytes()).unwrap();
    let walk = ring.workers_from(explicit.position());
    let preferred = walk.iter().copied().find(|&w| healthy[w]);
    let mut fleet = Fleet {
        healthy: healthy.to_vec(),
        loads: loads.to_vec(),
    };
    if let Some(p) = preferred {
        fleet.loads[p] += extra;
    }
    let policy = PolicySettings {
        min_load_gap,
        max_load_skew,
        spill_order: order,
        ..settings(virtual_nodes)
    };
    let decision = decide(
        &ring,
        &policy,
        &RoutingKey::Explicit(explicit),
        &fleet,
        0,
        0,
    );

    let Some(preferred) = preferred else {
        prop_assert_eq!(decision.branch, Branch::NoHealthyWorkers);
        prop_assert_eq!(decision.worker, None);
        return Ok(());
    };
    let healthy_loads: Vec<u64> = (0..n)
        .filter(|&w| healthy[w])
        .map(|w| fleet.loads[w])
        .collect();
    let min = *healthy_loads.iter().min().unwrap();
    let mean = healthy_loads.iter().sum::<u64>() as f64 / healthy_loads.len() as f64;
    let p = fleet.loads[preferred];
    let bound = decision
        .bound
        .expect("explicit key under the bounded policy");
    prop_assert_eq!(bound.preferred_load, p);
    prop_assert_eq!(bound.min_load, min);
    prop_assert_eq!(bound.mean_load, mean);
    prop_assert_eq!(bound.min_load_gap, min_load_gap);
    prop_assert_eq!(bound.max_load_skew, max_load_skew);
    prop_assert_eq!(decision.preferred, Some(preferred));

    let limit = mean * max_load_skew;
    let spill = p - min > min_load_gap && p as f64 > limit;
    if spill {
        let candidates = match order {
            SpillOrder::Ring => walk[1..].to_vec(),
            SpillOrder::HashSeeded => seeded_order_by_spec(&ids, explicit.position()),
        };
        let target = candidates
            .into_iter()
            .find(|&w| w != preferred && healthy[w] && fleet.loads[w] as f64 <= limit)
            .expect("the healthy minimum is always eligible when skew >= 1");
        prop_assert_eq!(decision.branch, Branch::ExplicitRoutingKeySpillover);
        prop_assert_eq!(decision.worker, Some(target));
        prop_assert!(target != preferred);
        prop_assert!(fleet.loads[target] as f64 <= limit);
    } else {
        prop_assert_eq!(decision.branch, Branch::ExplicitRoutingKeyHit);
        prop_assert_eq!(decision.worker, Some(preferred));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `Ring::first_in_set` (the first pick's shortcut) finds exactly the worker a point-by-point
    /// walk and the first step of `Ring::workers_clockwise` (the retries' and fallbacks' walk) find, for sparse and dense sets, at and between points, on rings of up to 70 workers
    /// (indices from 64 up cannot be named and are never returned).
    #[test]
    fn first_in_set_equals_the_walk(
        n in 1usize..=70,
        virtual_nodes in 1u32..=40,
        sets in prop::collection::vec(
            prop_oneof![
                any::<u64>(),
                (0u32..64).prop_map(|b| 1u64 << b),
                // A few workers: the short walk usually misses them and the search decides.
                prop::collection::vec(0u32..64, 2..5)
                    .prop_map(|bits| bits.iter().fold(0u64, |set, b| set | 1 << b)),
                Just(0u64),
                Just(u64::MAX),
            ],
            8,
        ),
        positions in prop::collection::vec(any::<u64>(), 16),
    ) {
        let ids: Vec<String> = (0..n).map(|i| spec(i).url).collect();
        let ring = Ring::build(&ids, virtual_nodes);
        let mut probes = positions;
        for (_, arc) in ring.arcs().into_iter().take(16) {
            probes.push(arc.end_inclusive);
        }
        for &set in &sets {
            for &position in &probes {
                let walked = ring
                    .points_from(position)
                    .find(|&w| w < 64 && (set >> w) & 1 == 1);
                prop_assert_eq!(ring.first_in_set(position, set), walked, "set {:#x}", set);
                // ... and the first worker of the one walk retries and fallbacks take.
                let first_of_walk = ring
                    .workers_clockwise(position, |w| w < 64 && (set >> w) & 1 == 1)
                    .next();
                prop_assert_eq!(walked, first_of_walk, "set {:#x}", set);
            }
        }
    }
}

/// The boundaries of the rule are strict where the design says strict and inclusive where it says
/// `<=`, checked on hand-built loads (random loads rarely land exactly on a boundary).
#[test]
fn rule_boundaries_are_exact() {
    let ids: Vec<String> = (0..4).map(|i| spec(i).url).collect();
    let ring = Ring::build(&ids, 150);
    let key = ExplicitKey::parse(b"boundary-key").unwrap();
    let walk = ring.workers_from(key.position());
    let (preferred, next, third, last) = (walk[0], walk[1], walk[2], walk[3]);
    let run = |loads: [(usize, u64); 4], gap: u64, skew: f64| {
        let mut fleet = Fleet {
            healthy: vec![true; 4],
            loads: vec![0; 4],
        };
        for (w, l) in loads {
            fleet.loads[w] = l;
        }
        let policy = PolicySettings {
            min_load_gap: gap,
            max_load_skew: skew,
            ..PolicySettings::default()
        };
        decide(&ring, &policy, &RoutingKey::Explicit(key), &fleet, 0, 0)
    };
    // p = 4, others 0: mean 1, gap 4 - 0 = 4 is not > 4, so no spill; with gap 3 it spills.
    let d = run([(preferred, 4), (next, 0), (third, 0), (last, 0)], 4, 1.5);
    assert_eq!(d.branch, Branch::ExplicitRoutingKeyHit);
    let d = run([(preferred, 4), (next, 0), (third, 0), (last, 0)], 3, 1.5);
    assert_eq!(
        (d.branch, d.worker),
        (Branch::ExplicitRoutingKeySpillover, Some(next))
    );
    // p = 6, loads sum 12, mean 3, skew 2: bound 6, and 6 is not > 6, so no spill.
    let d = run([(preferred, 6), (next, 6), (third, 0), (last, 0)], 0, 2.0);
    assert_eq!(d.branch, Branch::ExplicitRoutingKeyHit);
    // p = 7, loads sum 12: mean 3, bound 4.5 at skew 1.5; the next worker clockwise has 5 > 4.5 and
    // is skipped, the one after it takes the request.
    let d = run([(preferred, 7), (next, 5), (third, 0), (last, 0)], 0, 1.5);
    assert_eq!(
        (d.branch, d.worker),
        (Branch::ExplicitRoutingKeySpillover, Some(third))
    );
    // Target eligibility is inclusive: loads [8, 4, 0, 0], mean 3, skew 4/3 gives bound 4 exactly.
    let d = run(
        [(preferred, 8), (next, 4), (third, 0), (last, 0)],
        0,
        4.0 / 3.0,
    );
    assert_eq!(d.bound.unwrap().skew_bound(), 4.0);
    assert_eq!(
        (d.branch, d.worker),
        (Branch::ExplicitRoutingKeySpillover, Some(next))
    );
}

/// One step of a random workload on a live router.
#[derive(Debug, Clone)]
enum Op {
    /// Route a key: 0 explicit, 1 implicit, 2 keyless, 3 target worker (by name, possibly gone).
    Route { kind: u8, key: u8 },
    /// Drop one held guard (the response ended).
    Release(Index),
    /// Flip one pool worker's health.
    ToggleHealth(u8),
    /// Apply a policy patch (sometimes an invalid one).
    Policy {
        kind: Option<PolicyKind>,
        min_load_gap: Option<u64>,
        max_load_skew: Option<f64>,
    },
    /// Register a pool worker.
    Add(u8),
    /// Deregister a pool worker.
    Remove(u8),
}

const POOL: usize = 6;

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        Just(PolicyKind::BoundedConsistentHashing),
        Just(PolicyKind::ConsistentHashing),
        Just(PolicyKind::RoundRobin),
        Just(PolicyKind::Random),
    ];
    let skew = prop_oneof![
        4 => 1.0f64..2.5,
        1 => Just(f64::NAN),
        1 => Just(0.5f64),
    ];
    prop_oneof![
        12 => (0u8..4, 0u8..4).prop_map(|(kind, key)| Op::Route { kind, key }),
        8 => any::<Index>().prop_map(Op::Release),
        2 => (0..POOL as u8).prop_map(Op::ToggleHealth),
        2 => (prop::option::weighted(0.2, kind), prop::option::of(0u64..4), prop::option::of(skew))
            .prop_map(|(kind, min_load_gap, max_load_skew)| Op::Policy { kind, min_load_gap, max_load_skew }),
        1 => (0..POOL as u8).prop_map(Op::Add),
        1 => (0..POOL as u8).prop_map(Op::Remove),
    ]
}

const EXPLICIT_KEYS: [&str; 4] = ["chat-a", "chat-b", "doc-17", "agent/x"];
const IMPLICIT_VALUES: [&str; 4] = ["Bearer a", "Bearer b", "10.1.1.1", "sid=9"];

/// Every live counter equals the number of held guards on it, whether its worker is in the current
/// table or was removed while requests were in flight; a worker that is (again) in the table shares
/// its counters with the guards taken before its removal.
fn check_accounting(router: &Router, held: &[Routed]) -> Result<(), TestCaseError> {
    let guards: Vec<&Arc<WorkerStats>> = held
        .iter()
        .map(|r| r.guard.as_ref().unwrap().stats())
        .collect();
    let on = |stats: &Arc<WorkerStats>| guards.iter().filter(|g| Arc::ptr_eq(g, stats)).count();
    let table = router.table();
    for worker in table.workers() {
        prop_assert_eq!(
            worker.stats.active(),
            on(&worker.stats) as u64,
            "{}",
            worker.spec.name
        );
    }
    for routed in held {
        let stats = routed.guard.as_ref().unwrap().stats();
        prop_assert_eq!(stats.active(), on(stats) as u64);
        let url = &routed.table.workers()[routed.decision.worker.unwrap()]
            .spec
            .url;
        if let Some(now) = table.workers().iter().find(|w| &w.spec.url == url) {
            prop_assert!(Arc::ptr_eq(&now.stats, stats), "counters survive re-add");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of arrivals, departures, health flips, policy changes and membership changes:
    /// each routed request's decision is what `explain` predicted a moment before, it only lands on
    /// a healthy worker, every counter equals the number of live guards on it after every step, and
    /// all counters return to 0 once every guard is dropped.
    #[test]
    fn counters_track_live_guards_under_random_operations(
        ops in prop::collection::vec(op(), 1..150),
        gap in 0u64..4,
    ) {
        let pool: Vec<WorkerSpec> = (0..POOL).map(spec).collect();
        let policy = PolicySettings { min_load_gap: gap, ..settings(8) };
        let router = Router::new(pool[..4].to_vec(), policy).unwrap();
        let mut held: Vec<Routed> = Vec::new();
        let mut seen: Vec<Weak<WorkerStats>> = Vec::new();
        for op in ops {
            match op {
                Op::Route { kind, key } => {
                    let k = usize::from(key);
                    let key = match kind {
                        0 => RoutingKey::Explicit(ExplicitKey::parse(EXPLICIT_KEYS[k].as_bytes()).unwrap()),
                        1 => RoutingKey::Implicit(ImplicitKey::from_value(
                            ImplicitSource::ForwardedFor,
                            IMPLICIT_VALUES[k].as_bytes(),
                        )),
                        2 => RoutingKey::None,
                        _ => RoutingKey::Target(pool[k].name.as_bytes()),
                    };
                    let table = router.table();
                    let predicted = table.explain(&key);
                    let routed = router.route(&key);
                    prop_assert!(Arc::ptr_eq(&routed.table, &table));
                    let deterministic = matches!(key, RoutingKey::Target(_))
                        || (key.position().is_some()
                            && matches!(
                                table.policy().kind,
                                PolicyKind::BoundedConsistentHashing | PolicyKind::ConsistentHashing
                            ));
                    if deterministic {
                        prop_assert_eq!(routed.decision, predicted);
                    } else {
                        prop_assert_eq!(routed.decision.branch, predicted.branch);
                    }
                    prop_assert_eq!(routed.decision.worker.is_some(), routed.guard.is_some());
                    if let (Some(w), Some(guard)) = (routed.decision.worker, &routed.guard) {
                        prop_assert!(table.healthy_flags()[w], "routed to an unhealthy worker");
                        prop_assert!(Arc::ptr_eq(guard.stats(), &table.workers()[w].stats));
                        seen.push(Arc::downgrade(guard.stats()));
                        held.push(routed);
                    }
                }
                Op::Release(index) => {
                    if !held.is_empty() {
                        held.swap_remove(index.index(held.len()));
                    }
                }
                Op::ToggleHealth(w) => {
                    let table = router.table();
                    let name = &pool[usize::from(w)].name;
                    let changed = match table.index_of(name) {
                        Some(i) => router.set_health(name, !table.healthy_flags()[i]),
                        None => router.set_health(name, false),
                    };
                    prop_assert_eq!(changed, table.index_of(name).is_some());
                }
                Op::Policy { kind, min_load_gap, max_load_skew } => {
                    let before = router.table();
                    let patch = PolicyPatch { kind, min_load_gap, max_load_skew, spill_order: None, virtual_nodes: None, load_source: None, admission: None };
                    match router.set_policy(&patch) {
                        Ok(applied) => prop_assert_eq!(*router.table().policy(), applied),
                        Err(_) => {
                            prop_assert!(max_load_skew.is_some_and(|s| s.is_nan() || s < 1.0));
                            prop_assert!(Arc::ptr_eq(&before, &router.table()), "refused patch changed the table");
                        }
                    }
                }
                Op::Add(w) => {
                    let present = router.table().index_of(&pool[usize::from(w)].name).is_some();
                    prop_assert_eq!(router.add_worker(pool[usize::from(w)].clone()).is_ok(), !present);
                }
                Op::Remove(w) => {
                    let present = router.table().index_of(&pool[usize::from(w)].name).is_some();
                    prop_assert_eq!(router.remove_worker(&pool[usize::from(w)].name).is_ok(), present);
                }
            }
            check_accounting(&router, &held)?;
        }
        drop(held);
        for worker in router.table().workers() {
            prop_assert_eq!(worker.stats.active(), 0);
        }
        for stats in seen.iter().filter_map(Weak::upgrade) {
            prop_assert_eq!(stats.active(), 0);
        }
    }
}

// Fleet-wide load (docs/replicas.md): the formula's contract, and N replicas sharing one fleet.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Never below this replica's own count; no sample is local load; an exact report of this
    /// replica's own requests is its own count (one replica alone routes as in `local` mode);
    /// monotone in the report and in this replica's count.
    #[test]
    fn fleet_load_contract(
        local in 0u64..1_000,
        reported in 0u64..1_000,
        at_scrape in 0u64..1_000,
        more in 0u64..10,
    ) {
        let sample = FleetSample { reported, local_at_scrape: at_scrape };
        let load = fleet_load(local, Some(sample));
        prop_assert!(load >= local);
        prop_assert_eq!(fleet_load(local, None), local);
        let exact = FleetSample { reported: at_scrape, local_at_scrape: at_scrape };
        prop_assert_eq!(fleet_load(local, Some(exact)), local);
        let higher = FleetSample { reported: reported + more, ..sample };
        prop_assert!(fleet_load(local, Some(higher)) >= load);
        prop_assert!(fleet_load(local + more, Some(sample)) >= load);
        // What other replicas had at the scrape is carried over unchanged.
        if reported >= at_scrape {
            prop_assert_eq!(load, reported - at_scrape + local);
        }
        prop_assert_eq!(sample.since_scrape(local), local as i64 - at_scrape as i64);
    }

    /// A sample beyond what the cell holds saturates instead of wrapping: the rule can only see
    /// more load than reported, never less.
    #[test]
    fn sample_cell_round_trips_or_saturates(reported in any::<u64>(), at_scrape in any::<u64>()) {
        let cell = bch_core::fleet_load::SampleCell::default();
        cell.publish(FleetSample { reported, local_at_scrape: at_scrape }, 5);
        let back = cell.fresh().unwrap();
        prop_assert_eq!(back.reported, reported.min(bch_core::fleet_load::MAX_REPORTED));
        prop_assert_eq!(back.local_at_scrape, at_scrape.min(bch_core::fleet_load::MAX_LOCAL_AT_SCRAPE));
    }
}

/// N routers over one fleet, each scraping every worker's true load (the sum of every router's
/// in-flight requests) before each request, as a scrape interval shorter than the request spacing
/// gives: in `worker_metrics` mode the replicas place requests exactly as one gateway does.
fn replicas_place(replicas: usize, requests: usize, source: LoadSource) -> (Vec<u64>, Vec<Routed>) {
    let specs: Vec<WorkerSpec> = (0..2).map(spec).collect();
    let policy = PolicySettings {
        load_source: source,
        ..PolicySettings::default()
    };
    let routers: Vec<Router> = (0..replicas)
        .map(|_| Router::new(specs.clone(), policy).unwrap())
        .collect();
    let key = RoutingKey::Explicit(ExplicitKey::parse(b"session-a").unwrap());
    let truth = |w: usize| -> u64 {
        routers
            .iter()
            .map(|r| r.table().workers()[w].stats.active())
            .sum()
    };
    let mut held = Vec::new();
    for i in 0..requests {
        for router in &routers {
            for (w, worker) in router.table().workers().iter().enumerate() {
                let sample = FleetSample {
                    reported: truth(w),
                    local_at_scrape: worker.stats.active(),
                };
                router.publish_sample(&worker.stats, sample, 1);
            }
        }
        let routed = routers[i % replicas].route(&key);
        if source == LoadSource::WorkerMetrics && i > 0 {
            assert_eq!(routed.decision.load_signal, Some(LoadSignal::WorkerMetrics));
        }
        held.push(routed);
    }
    ((0..2).map(truth).collect(), held)
}

#[test]
fn three_replicas_decide_as_one_with_worker_metrics() {
    let (alone, held_alone) = replicas_place(1, 8, LoadSource::Local);
    let mut sorted = alone.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![2, 6], "one gateway splits the burst 6:2");
    let (fleet, held_fleet) = replicas_place(3, 8, LoadSource::WorkerMetrics);
    assert_eq!(
        fleet, alone,
        "three replicas with worker metrics place as one gateway"
    );
    let (local, held_local) = replicas_place(3, 8, LoadSource::Local);
    assert!(
        local.contains(&8),
        "three local replicas see at most 3 each and never spill: {local:?}"
    );
    for held in [held_alone, held_fleet, held_local] {
        let stats: Vec<_> = held
            .iter()
            .filter_map(|r| r.guard.as_ref().map(|g| Arc::clone(g.stats())))
            .collect();
        drop(held);
        assert!(stats.iter().all(|s| s.active() == 0));
    }
}

/// A stale sample is not read: the rule falls back to local load and says so.
#[test]
fn stale_samples_fall_back_to_local_load() {
    let specs: Vec<WorkerSpec> = (0..2).map(spec).collect();
    let policy = PolicySettings {
        load_source: LoadSource::WorkerMetrics,
        ..PolicySettings::default()
    };
    let router = Router::new(specs, policy).unwrap();
    let key = RoutingKey::Explicit(ExplicitKey::parse(b"session-a").unwrap());
    let preferred = router.table().explain(&key).preferred.unwrap();
    let stats = Arc::clone(&router.table().workers()[preferred].stats);
    router.publish_sample(
        &stats,
        FleetSample {
            reported: 9,
            local_at_scrape: 0,
        },
        1,
    );
    let hot = router.table().explain(&key);
    assert_eq!(hot.branch, Branch::ExplicitRoutingKeySpillover);
    assert_eq!(
        hot.load_signal,
        Some(LoadSignal::Mixed),
        "the other worker was never scraped"
    );
    router.mark_sample_stale(&stats);
    let cold = router.table().explain(&key);
    assert_eq!(cold.branch, Branch::ExplicitRoutingKeyHit);
    assert_eq!(cold.load_signal, Some(LoadSignal::Local));
    let records = router.table().worker_records(10);
    assert!(records[preferred].load_stale);
    assert_eq!(records[preferred].reported_load, Some(9));
    assert_eq!(records[preferred].scrape_age_ms, Some(9));
    assert_eq!(records[preferred].load, Some(0));
}
