//! Properties of the two spill orders (docs/policy.md, "Spill order"): each is deterministic per key,
//! reaches every healthy worker, and is identical across gateway replicas that list the workers in
//! another order; the hash-seeded order spreads the overflow of the keys of one worker over all the
//! others. The rule itself (when to spill, which workers are eligible) is checked for both orders
//! by `properties.rs`.

use bch_core::decide::{FleetView, decide};
use bch_core::policy::{Branch, PolicySettings, SpillOrder};
use bch_core::ring::Ring;
use bch_core::routing_key::{ExplicitKey, RoutingKey};
use proptest::prelude::*;

/// Printable ASCII explicit keys of 1 to 24 characters, in the key grammar: a space inside but
/// none at either end.
const EXPLICIT_KEY: &str = "[!-~]|[!-~][ -~]{0,22}[!-~]";

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

fn url(i: usize) -> String {
    format!("http://10.1.{}.{}:8000", i / 256, i % 256)
}

/// Spills eagerly: gap 0 and skew 1 spill any preferred worker above the mean, and only workers at
/// or below the mean are eligible.
fn eager(order: SpillOrder, virtual_nodes: u32) -> PolicySettings {
    PolicySettings {
        min_load_gap: 0,
        max_load_skew: 1.0,
        spill_order: order,
        virtual_nodes,
        ..PolicySettings::default()
    }
}

fn explicit(key: &str) -> RoutingKey<'_> {
    RoutingKey::Explicit(ExplicitKey::parse(key.as_bytes()).unwrap())
}

fn orders() -> impl Strategy<Value = SpillOrder> {
    prop_oneof![Just(SpillOrder::Ring), Just(SpillOrder::HashSeeded)]
}

/// `n` workers (2..=max, some on each side of the 64-worker bitmask line when `max` > 64), a
/// shuffled order of them, a health mask and loads.
fn fleets(max: usize) -> impl Strategy<Value = (Vec<usize>, Vec<bool>, Vec<u64>)> {
    (2..=max).prop_flat_map(|n| {
        (
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            prop::collection::vec(prop::bool::weighted(0.8), n),
            prop::collection::vec(0u64..8, n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Two replicas listing the same workers in different orders, with the same loads and health,
    /// send every key to the same URL, branch for branch; and asking twice gives the same answer.
    #[test]
    fn identical_across_replicas_and_deterministic_per_key(
        (order, healthy, loads) in fleets(72),
        spill_order in orders(),
        virtual_nodes in 1u32..=20,
        keys in prop::collection::vec(EXPLICIT_KEY, 24),
    ) {
        let n = order.len();
        let urls: Vec<String> = (0..n).map(url).collect();
        let permuted: Vec<String> = order.iter().map(|&i| urls[i].clone()).collect();
        let (a, b) = (Ring::build(&urls, virtual_nodes), Ring::build(&permuted, virtual_nodes));
        let fleet_a = Fleet { healthy: healthy.clone(), loads: loads.clone() };
        let fleet_b = Fleet {
            healthy: order.iter().map(|&i| healthy[i]).collect(),
            loads: order.iter().map(|&i| loads[i]).collect(),
        };
        let policy = eager(spill_order, virtual_nodes);
        for key in &keys {
            let da = decide(&a, &policy, &explicit(key), &fleet_a, 0, 0);
            let db = decide(&b, &policy, &explicit(key), &fleet_b, 1, 1);
            prop_assert_eq!(da.branch, db.branch);
            prop_assert_eq!(da.worker.map(|w| &urls[w]), db.worker.map(|w| &permuted[w]));
            prop_assert_eq!(da, decide(&a, &policy, &explicit(key), &fleet_a, 0, 0));
            prop_assert_ne!(da.branch, Branch::ExplicitRoutingKeyNoEligibleCandidate);
        }
    }

    /// Every healthy worker other than the preferred one is reachable: when it is the only worker
    /// under the bound, the spill goes to it, under either order, on small and large fleets.
    #[test]
    fn every_healthy_worker_is_reachable(
        (_order, healthy, _loads) in fleets(70),
        spill_order in orders(),
        key in EXPLICIT_KEY,
    ) {
        let n = healthy.len();
        let urls: Vec<String> = (0..n).map(url).collect();
        let ring = Ring::build(&urls, 4);
        let policy = eager(spill_order, 4);
        let position = ExplicitKey::parse(key.as_bytes()).unwrap().position();
        let Some(preferred) = ring.workers_from(position).into_iter().find(|&w| healthy[w]) else {
            return Ok(());
        };
        for target in (0..n).filter(|&w| w != preferred && healthy[w]) {
            // Everyone at 10 except the target at 0: the mean is below 10, so only the target is
            // eligible, and the preferred worker (10 > mean) spills.
            let loads = (0..n).map(|w| if w == target { 0 } else { 10 }).collect();
            let fleet = Fleet { healthy: healthy.clone(), loads };
            let d = decide(&ring, &policy, &explicit(&key), &fleet, 0, 0);
            prop_assert_eq!(d.branch, Branch::ExplicitRoutingKeySpillover);
            prop_assert_eq!(d.worker, Some(target));
        }
    }

    /// The hash-seeded order of a key is a permutation of all the workers, and with every worker
    /// eligible the spill goes to the first one in it after the preferred worker.
    #[test]
    fn the_seeded_order_is_a_permutation_and_picks_its_first(
        n in 2usize..=70,
        key in EXPLICIT_KEY,
    ) {
        let urls: Vec<String> = (0..n).map(url).collect();
        let ring = Ring::build(&urls, 4);
        let position = ExplicitKey::parse(key.as_bytes()).unwrap().position();
        let order = ring.seeded_order(position);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        let preferred = ring.owner(position).unwrap();
        let mut loads = vec![0; n];
        loads[preferred] = 100;
        let fleet = Fleet { healthy: vec![true; n], loads };
        let d = decide(&ring, &eager(SpillOrder::HashSeeded, 4), &explicit(&key), &fleet, 0, 0);
        let first = order.into_iter().find(|&w| w != preferred);
        prop_assert_eq!(d.worker, first);
    }
}

/// On eight workers, the first spill target of the keys that share one preferred worker is spread
/// over the seven others by the hash-seeded order (each gets 1/7 ± 3 points of 2,000 keys), and
/// under `ring` it is each key's clockwise successor. Both orders are exercised on the same keys.
#[test]
fn hash_seeded_spreads_one_workers_overflow_over_all_others() {
    let urls: Vec<String> = (0..8).map(url).collect();
    let ring = Ring::build(&urls, 150);
    let mut counts = [[0usize; 8]; 2];
    let mut keys = 0;
    for i in 0..40_000 {
        let key = format!("session-{i}");
        let position = ExplicitKey::parse(key.as_bytes()).unwrap().position();
        let preferred = ring.owner(position).unwrap();
        if preferred != 0 {
            continue;
        }
        keys += 1;
        let mut loads = vec![0; 8];
        loads[0] = 100;
        let fleet = Fleet {
            healthy: vec![true; 8],
            loads,
        };
        for (slot, order) in [SpillOrder::Ring, SpillOrder::HashSeeded]
            .into_iter()
            .enumerate()
        {
            let d = decide(&ring, &eager(order, 150), &explicit(&key), &fleet, 0, 0);
            let target = d.worker.unwrap();
            assert_ne!(target, 0);
            if order == SpillOrder::Ring {
                assert_eq!(target, ring.workers_from(position)[1], "{key}");
            }
            counts[slot][target] += 1;
        }
        if keys == 2_000 {
            break;
        }
    }
    assert_eq!(keys, 2_000);
    for (w, &count) in counts[1].iter().enumerate().skip(1) {
        let share = count as f64 / keys as f64;
        assert!(
            (share - 1.0 / 7.0).abs() < 0.03,
            "worker {w}: {share:.3} of the hash-seeded first choices ({:?})",
            counts[1]
        );
    }
}
