//! The routing decision itself: a pure function of the ring, the policy, the key and a view of the
//! fleet (health, loads, names). The live [`Router`](crate::router::Router) and the offline
//! [`explain`](crate::explain) both call [`decide`], so what `explain` predicts is what routing does.

use crate::admission::Wait;
use crate::fleet_load::{LoadSignal, LoadSource};
use crate::policy::{BoundCheck, Branch, FleetLoad, PolicyKind, PolicySettings, SpillOrder};
use crate::ring::Ring;
use crate::routing_key::RoutingKey;

mod fleet_view;
pub use fleet_view::{FleetView, is_full};
use fleet_view::{SMALL_FLEET, WithRoom, room_target};

/// A routing decision with the numbers behind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The worker that gets the request; `None` means the gateway answers 503, or with
    /// [`Decision::wait`] set that the request waits for room (or is shed).
    pub worker: Option<usize>,
    /// The ring's preferred worker (first routable clockwise), for keyed requests.
    pub preferred: Option<usize>,
    /// Which path the decision took.
    pub branch: Branch,
    /// For an explicit key under the bounded policy: the loads and thresholds the rule compared.
    pub bound: Option<BoundCheck>,
    /// With `bound`: which signal the compared loads came from.
    pub load_signal: Option<LoadSignal>,
    /// Set when no worker was chosen because the ones the request may use are full: which worker
    /// (or any) it may wait for. The gateway queues it (or sheds it) and decides again at
    /// admission. `None` with no worker means a plain 503 (nothing routable, target miss).
    pub wait: Option<Wait>,
}

impl Decision {
    fn simple(worker: Option<usize>, branch: Branch) -> Self {
        Decision {
            worker,
            preferred: worker,
            branch,
            bound: None,
            load_signal: None,
            wait: None,
        }
    }

    /// No worker now: the request waits for `preferred` (strict keys) or for any worker.
    fn waiting(preferred: Option<usize>, branch: Branch, wait: Wait) -> Self {
        Decision {
            worker: None,
            preferred,
            branch,
            bound: None,
            load_signal: None,
            wait: Some(wait),
        }
    }
}

/// Decides where a request goes: the key precedence and the rules of docs/policy.md.
///
/// `entropy` is a uniformly random number (used by the keyless power-of-two-choices pick and the
/// `random` policy); `turn` is a counter incremented per request (used by `round_robin`). Passing
/// them in keeps this function pure and reproducible in tests.
///
/// Never allocates. Finding the preferred worker walks the ring from the key past unroutable
/// workers. A spill on a fleet of up to 64 workers costs two passes over the workers plus, under
/// [`SpillOrder::Ring`], [`Ring::first_in_set`] (a short walk, then a binary search per eligible
/// worker), or under [`SpillOrder::HashSeeded`] one score per eligible worker; on larger fleets
/// the ring order walks the ring, up to once round when nearly every worker is over the bound, and
/// the hash-seeded order scores every worker once.
///
/// Capacity (docs/policy.md, "Capacity"; only when [`FleetView::limited`]): a *full* worker
/// ([`is_full`]) is not eligible for a new request. Following HAProxy's `maxconn` with a queue and
/// SGLang Model Gateway's overload shedding, but keeping key affinity:
/// - an explicit key whose preferred worker is full moves at once to the first worker with room
///   in its spill order, whatever the bound says (`explicit_routing_key_capacity_spill`); none
///   with room: it waits for any worker (`fleet_full`, [`Wait::ForAnyWorker`]);
/// - an implicit key or a target worker whose worker is full waits for that worker
///   (`implicit_routing_key_full` / `target_worker_full`, [`Wait::ForWorker`]);
/// - keyless requests and the baselines pick among the workers with room as they pick among
///   routable ones (none: `fleet_full`);
/// - a bound spill goes only to a worker with room.
///
/// Each worker is asked whether it is full at most once per search, and the search ends after
/// one pass also when every worker is full (HAProxy 3.4 fixed a walk that looped then). Without
/// limits every decision is the one without capacity.
pub fn decide<F: FleetView>(
    ring: &Ring,
    policy: &PolicySettings,
    key: &RoutingKey<'_>,
    fleet: &F,
    entropy: u64,
    turn: u64,
) -> Decision {
    let limited = fleet.limited();
    if let RoutingKey::Target(raw) = key {
        return match fleet.resolve_target(raw) {
            Some(worker) if fleet.routable(worker) => {
                if limited && is_full(fleet, worker) {
                    Decision::waiting(
                        Some(worker),
                        Branch::TargetWorkerFull,
                        Wait::ForWorker(worker),
                    )
                } else {
                    Decision::simple(Some(worker), Branch::TargetWorkerHit)
                }
            }
            _ => Decision::simple(None, Branch::TargetWorkerMiss),
        };
    }
    let routable_count = fleet.routable_count();
    if routable_count == 0 {
        return Decision::simple(None, Branch::NoHealthyWorkers);
    }
    if key_ignored_or_absent(policy.kind, key) {
        if !limited {
            return decide_unkeyed(policy.kind, fleet, routable_count, entropy, turn);
        }
        // Under caps, keyless requests and the baselines pick among the workers with room exactly
        // as they pick among routable workers without caps.
        let count = (0..fleet.worker_count())
            .filter(|&w| fleet.routable(w) && !is_full(fleet, w))
            .count();
        if count == 0 {
            return Decision::waiting(None, Branch::FleetFull, Wait::ForAnyWorker);
        }
        let with_room = WithRoom { fleet, count };
        return decide_unkeyed(policy.kind, &with_room, count, entropy, turn);
    }
    match key {
        RoutingKey::Target(_) | RoutingKey::None => unreachable!("handled above"),
        RoutingKey::Implicit(implicit) => {
            let preferred = first_routable(ring, fleet, implicit.position());
            match preferred {
                Some(worker) if limited && is_full(fleet, worker) => Decision::waiting(
                    preferred,
                    Branch::ImplicitRoutingKeyFull,
                    Wait::ForWorker(worker),
                ),
                _ => Decision::simple(preferred, Branch::ImplicitRoutingKeyHit),
            }
        }
        RoutingKey::Explicit(explicit) => {
            let position = explicit.position();
            let Some(preferred) = first_routable(ring, fleet, position) else {
                // Unreachable while the ring holds every registered worker, but a view whose ring
                // and worker list disagree must not panic the data plane.
                return Decision::simple(None, Branch::NoHealthyWorkers);
            };
            if limited && is_full(fleet, preferred) {
                return capacity_spill(ring, policy, fleet, preferred, position);
            }
            if policy.kind == PolicyKind::ConsistentHashing {
                return Decision::simple(Some(preferred), Branch::ExplicitRoutingKeyHit);
            }
            let (bound, load_signal) = bound_check(fleet, preferred, policy);
            let (worker, branch) = if !bound.should_spill() {
                (preferred, Branch::ExplicitRoutingKeyHit)
            } else {
                let candidate = spill_target(
                    ring,
                    policy.spill_order,
                    fleet,
                    preferred,
                    &bound,
                    position,
                    limited,
                );
                match candidate {
                    Some(target) => (target, Branch::ExplicitRoutingKeySpillover),
                    None => (preferred, Branch::ExplicitRoutingKeyNoEligibleCandidate),
                }
            };
            Decision {
                worker: Some(worker),
                preferred: Some(preferred),
                branch,
                bound: Some(bound),
                load_signal: Some(load_signal),
                wait: None,
            }
        }
    }
}

/// An explicit key whose preferred worker is full: the first worker with room in the key's spill
/// order, whatever the bound says (the bound's numbers are still reported under the bounded
/// policy); none with room, the request waits for any worker.
fn capacity_spill<F: FleetView>(
    ring: &Ring,
    policy: &PolicySettings,
    fleet: &F,
    preferred: usize,
    position: u64,
) -> Decision {
    let Some(target) = room_target(ring, policy.spill_order, fleet, preferred, position) else {
        return Decision::waiting(Some(preferred), Branch::FleetFull, Wait::ForAnyWorker);
    };
    let (bound, load_signal) = match policy.kind {
        PolicyKind::BoundedConsistentHashing => {
            let (bound, signal) = bound_check(fleet, preferred, policy);
            (Some(bound), Some(signal))
        }
        _ => (None, None),
    };
    Decision {
        worker: Some(target),
        preferred: Some(preferred),
        branch: Branch::ExplicitRoutingKeyCapacitySpill,
        bound,
        load_signal,
        wait: None,
    }
}

/// Whether the request is decided without a key: no key, or a baseline policy (which ignores
/// explicit and implicit keys; a target worker was handled before).
fn key_ignored_or_absent(kind: PolicyKind, key: &RoutingKey<'_>) -> bool {
    matches!(kind, PolicyKind::RoundRobin | PolicyKind::Random) || matches!(key, RoutingKey::None)
}

/// The pick of a request decided without a key among `fleet`'s `routable_count` routable workers.
fn decide_unkeyed<F: FleetView>(
    kind: PolicyKind,
    fleet: &F,
    routable_count: usize,
    entropy: u64,
    turn: u64,
) -> Decision {
    let pick = match kind {
        PolicyKind::RoundRobin => fleet.nth_routable((turn % routable_count as u64) as usize),
        PolicyKind::Random => fleet.nth_routable((entropy % routable_count as u64) as usize),
        PolicyKind::ConsistentHashing | PolicyKind::BoundedConsistentHashing => {
            power_of_two_choices(fleet, routable_count, entropy)
        }
    };
    Decision::simple(pick, Branch::Keyless)
}

/// Where a spilled request goes: the first worker under the bound (routable, not the preferred one)
/// in `order`, the ring walk from the key or its hash-seeded order. `None` when no worker qualifies.
fn spill_target<F: FleetView>(
    ring: &Ring,
    order: SpillOrder,
    fleet: &F,
    preferred: usize,
    bound: &BoundCheck,
    position: u64,
    limited: bool,
) -> Option<usize> {
    let eligible = |w: usize| {
        w != preferred
            && fleet.routable(w)
            && bound.eligible(fleet.load(w))
            && !(limited && is_full(fleet, w))
    };
    match (order, eligible_mask(fleet, preferred, bound, limited)) {
        (SpillOrder::Ring, Some(mask)) => ring.first_in_set(position, mask),
        // Under limits, fullness is asked once per worker: `workers_clockwise` yields each once.
        (SpillOrder::Ring, None) if limited => ring
            .workers_clockwise(position, |w| w != preferred && fleet.routable(w))
            .find(|&w| eligible(w)),
        (SpillOrder::Ring, None) => ring.points_from(position).find(|&w| eligible(w)),
        (SpillOrder::HashSeeded, Some(mask)) => ring.first_seeded_in_set(position, mask),
        (SpillOrder::HashSeeded, None) => ring.first_seeded(position, eligible),
    }
}

/// The first routable worker clockwise from `position`.
pub fn first_routable<F: FleetView>(ring: &Ring, fleet: &F, position: u64) -> Option<usize> {
    ring.points_from(position).find(|&w| fleet.routable(w))
}

/// The bound for `preferred` over the routable workers' loads, and which signal those loads came
/// from (always local in `local` mode, without asking the view). The view's kept aggregates are
/// read when it has them (O(1); in `worker_metrics` mode also its kept signal); otherwise the
/// minimum, mean and signal are computed over the workers.
fn bound_check<F: FleetView>(
    fleet: &F,
    preferred: usize,
    policy: &PolicySettings,
) -> (BoundCheck, LoadSignal) {
    let per_worker = policy.load_source == LoadSource::WorkerMetrics;
    if let Some(fleet_load) = fleet.kept_fleet_load() {
        let kept_signal = if per_worker {
            fleet.kept_load_signal()
        } else {
            Some(LoadSignal::Local)
        };
        if let Some(signal) = kept_signal {
            return (fleet_load.bound_for(fleet.load(preferred), policy), signal);
        }
    }
    let mut signal: Option<LoadSignal> = None;
    let routable_loads = (0..fleet.worker_count())
        .filter(|&worker| fleet.routable(worker))
        .map(|worker| {
            if !per_worker {
                return fleet.load(worker);
            }
            let (load, from) = fleet.load_with_signal(worker);
            signal = Some(signal.map_or(from, |s| s.and(from)));
            load
        });
    // The caller found the preferred worker routable, so the summary exists; an empty one (a view
    // that contradicts itself) must not panic the data plane.
    let fleet_load = FleetLoad::of(routable_loads).unwrap_or(FleetLoad {
        min_load: 0,
        mean_load: 0.0,
        healthy: 0,
    });
    let bound = fleet_load.bound_for(fleet.load(preferred), policy);
    (bound, signal.unwrap_or(LoadSignal::Local))
}

/// For fleets of at most [`SMALL_FLEET`] workers: bit `w` is set iff worker `w` may take a spilled
/// request (not the preferred worker, routable, [`BoundCheck::eligible`]). With it
/// [`Ring::first_in_set`] finds the target without visiting up to every ring point (the walk it
/// replaces visits hundreds of points when only one worker on a 64-worker ring is under the bound).
/// `None` for larger fleets, which test each point's worker while walking.
fn eligible_mask<F: FleetView>(
    fleet: &F,
    preferred: usize,
    bound: &BoundCheck,
    limited: bool,
) -> Option<u64> {
    let count = fleet.worker_count();
    if count > SMALL_FLEET {
        return None;
    }
    if limited {
        // Under caps a spill target must also have room; the plain test per worker (the integer
        // shortcut below is an optimisation of the uncapped hot path).
        let mask = (0..count)
            .filter(|&w| {
                w != preferred
                    && fleet.routable(w)
                    && bound.eligible(fleet.load(w))
                    && !is_full(fleet, w)
            })
            .fold(0u64, |mask, w| mask | 1 << w);
        return Some(mask);
    }
    let mut mask = 0u64;
    let limit = bound.skew_bound();
    if (0.0..EXACT_IN_F64).contains(&limit) {
        // `load as f64 <= limit` is monotone in `load`; for a limit in [0, 2^53) it is exactly
        // `load <= floor(limit)` (loads up to 2^53 convert exactly, larger ones exceed the limit
        // either way). An integer compare per worker instead of an unsigned-to-float conversion.
        let threshold = limit as u64;
        for worker in 0..count {
            if fleet.routable(worker) && fleet.load(worker) <= threshold {
                mask |= 1 << worker;
            }
        }
    } else {
        for worker in 0..count {
            if fleet.routable(worker) && bound.eligible(fleet.load(worker)) {
                mask |= 1 << worker;
            }
        }
    }
    Some(mask & !(1 << preferred))
}

/// Integers up to this convert to `f64` exactly.
const EXACT_IN_F64: f64 = (1u64 << 53) as f64;

/// Keyless requests: the less loaded of two distinct random routable workers (ties to the first),
/// the classic "power of two choices" that avoids herding onto one idle worker.
fn power_of_two_choices<F: FleetView>(
    fleet: &F,
    routable_count: usize,
    entropy: u64,
) -> Option<usize> {
    let n = routable_count as u64;
    let first = entropy % n;
    let mut second = (entropy >> 32) % n;
    if second == first && n > 1 {
        second = (second + 1) % n;
    }
    let a = fleet.nth_routable(first as usize)?;
    let b = fleet.nth_routable(second as usize)?;
    Some(if fleet.load(b) < fleet.load(a) { b } else { a })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource};

    struct Fleet {
        names: Vec<&'static str>,
        routable: Vec<bool>,
        loads: Vec<u64>,
    }

    impl FleetView for Fleet {
        fn worker_count(&self) -> usize {
            self.names.len()
        }
        fn routable(&self, w: usize) -> bool {
            self.routable[w]
        }
        fn routable_count(&self) -> usize {
            self.routable.iter().filter(|r| **r).count()
        }
        fn load(&self, w: usize) -> u64 {
            self.loads[w]
        }
        fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
            self.names.iter().position(|n| n.as_bytes() == raw)
        }
    }

    fn fleet(loads: &[u64]) -> Fleet {
        Fleet {
            names: ["w0", "w1", "w2", "w3"][..loads.len()].to_vec(),
            routable: vec![true; loads.len()],
            loads: loads.to_vec(),
        }
    }

    #[test]
    fn target_is_strict() {
        let ring = Ring::build(&["w0", "w1"], 10);
        let policy = PolicySettings::default();
        let mut f = fleet(&[100, 0]);
        let d = decide(&ring, &policy, &RoutingKey::Target(b"w0"), &f, 0, 0);
        assert_eq!((d.worker, d.branch), (Some(0), Branch::TargetWorkerHit));
        f.routable[0] = false;
        let d = decide(&ring, &policy, &RoutingKey::Target(b"w0"), &f, 0, 0);
        assert_eq!((d.worker, d.branch), (None, Branch::TargetWorkerMiss));
        let d = decide(&ring, &policy, &RoutingKey::Target(b"nope"), &f, 0, 0);
        assert_eq!(d.branch, Branch::TargetWorkerMiss);
    }

    #[test]
    fn implicit_keys_never_spill() {
        let ring = Ring::build(&["w0", "w1"], 150);
        let policy = PolicySettings {
            min_load_gap: 0,
            max_load_skew: 1.0,
            ..Default::default()
        };
        let key = ImplicitKey::from_value(ImplicitSource::Cookie, b"sid");
        let preferred = ring.owner(key.position()).unwrap();
        let mut loads = [0, 0];
        loads[preferred] = 1000;
        let d = decide(
            &ring,
            &policy,
            &RoutingKey::Implicit(key),
            &fleet(&loads),
            0,
            0,
        );
        assert_eq!(d.worker, Some(preferred));
        assert_eq!(d.branch, Branch::ImplicitRoutingKeyHit);
    }

    #[test]
    fn strict_policy_ignores_load() {
        let ring = Ring::build(&["w0", "w1"], 150);
        let policy = PolicySettings {
            kind: PolicyKind::ConsistentHashing,
            ..Default::default()
        };
        let key = ExplicitKey::parse(b"hot").unwrap();
        let preferred = ring.owner(key.position()).unwrap();
        let mut loads = [0, 0];
        loads[preferred] = 1000;
        let d = decide(
            &ring,
            &policy,
            &RoutingKey::Explicit(key),
            &fleet(&loads),
            0,
            0,
        );
        assert_eq!(
            (d.worker, d.branch),
            (Some(preferred), Branch::ExplicitRoutingKeyHit)
        );
        assert!(d.bound.is_none());
    }

    #[test]
    fn keyless_prefers_the_less_loaded_of_two() {
        let ring = Ring::build(&["w0", "w1"], 150);
        let policy = PolicySettings::default();
        for entropy in 0..16u64 {
            let d = decide(
                &ring,
                &policy,
                &RoutingKey::None,
                &fleet(&[5, 1]),
                entropy,
                0,
            );
            assert_eq!((d.worker, d.branch), (Some(1), Branch::Keyless));
        }
    }

    #[test]
    fn baselines_cycle_and_skip_unroutable() {
        let ring = Ring::build(&["w0", "w1", "w2"], 150);
        let policy = PolicySettings {
            kind: PolicyKind::RoundRobin,
            ..Default::default()
        };
        let mut f = fleet(&[0, 0, 0]);
        f.routable[1] = false;
        let picks: Vec<_> = (0..4)
            .map(|turn| decide(&ring, &policy, &RoutingKey::None, &f, 0, turn).worker)
            .collect();
        assert_eq!(picks, vec![Some(0), Some(2), Some(0), Some(2)]);
        let random = PolicySettings {
            kind: PolicyKind::Random,
            ..Default::default()
        };
        for entropy in 0..32 {
            let w = decide(&ring, &random, &RoutingKey::None, &f, entropy, 0).worker;
            assert_ne!(w, Some(1));
        }
    }
}
