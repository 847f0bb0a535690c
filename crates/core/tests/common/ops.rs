//! The random operations the router's property tests interleave, and the one interpreter that
//! applies them: requests routed and released, health flips, drains, membership and policy
//! changes, worker samples. Each test draws from its own [`Mix`] and checks its own invariant
//! after every step; what an operation does to the router is the same in all of them.

use bch_core::fleet_load::{FleetSample, LoadSource};
use bch_core::policy::{PolicyKind, PolicyPatch};
use bch_core::router::{Routed, Router, RoutingTable, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource, RoutingKey};
use bch_core::telemetry::WorkerState;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::Union;

/// The keys a [`Route`] names by index.
pub const KEYS: [&str; 6] = ["chat-a", "chat-b", "doc-17", "agent/x", "k5", "k6"];

/// A request to route, left to the test: it knows which pool to route in and what to compare.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// The index of the model whose pool the request is for (0 in a fleet without models).
    pub model: u8,
    /// 0 explicit key, 1 implicit key, 2 no key, 3 target worker.
    pub kind: u8,
    /// The index of the key in [`KEYS`], or of the target worker's name.
    pub key: u8,
}

impl Route {
    /// The routing key; a target names `targets[key]`.
    pub fn routing_key(self, targets: &[&'static str; 6]) -> RoutingKey<'static> {
        let key = usize::from(self.key);
        match self.kind {
            0 => RoutingKey::Explicit(ExplicitKey::parse(KEYS[key].as_bytes()).unwrap()),
            1 => RoutingKey::Implicit(ImplicitKey::from_value(
                ImplicitSource::ForwardedFor,
                KEYS[key].as_bytes(),
            )),
            2 => RoutingKey::None,
            _ => RoutingKey::Target(targets[key].as_bytes()),
        }
    }
}

/// One step of a random interleaving. Workers are named by their index in the test's specs.
#[derive(Debug, Clone)]
pub enum Op {
    /// Route a request (the test does it).
    Route(Route),
    /// Drop one held guard.
    Release(Index),
    /// Flip a worker's health.
    Health(u8),
    /// Drain a worker or make it active again.
    Drain(u8),
    /// Register a worker.
    Add(u8),
    /// Deregister a worker (its guards live on).
    Remove(u8),
    /// Change the policy: kind, thresholds (the skew left as it is when `None`), load source.
    Policy {
        kind: PolicyKind,
        gap: u64,
        skew: Option<f64>,
        metrics: bool,
    },
    /// Publish a fresh sample on a worker (0), mark it stale (1) or clear it (2). The sample's
    /// `local_at_scrape` is the worker's load shifted by `shift` (saturating at 0), so the report
    /// runs ahead of and behind this replica's count.
    Sample {
        worker: u8,
        action: u8,
        reported: u64,
        shift: i64,
    },
}

/// What a test draws its operations from.
pub struct Mix {
    /// Workers the operations name: indices `0..workers` of the test's specs.
    pub workers: u8,
    /// Models a route names: indices `0..models` (1 in a fleet without models).
    pub models: u8,
    /// The policy kinds a policy change draws, with their weights.
    pub kinds: &'static [(u32, PolicyKind)],
    /// Whether a policy change also draws a `max_load_skew` (1.0 to 2.5).
    pub skew: bool,
    /// Whether samples also report loads beyond what a sample cell holds or past the aggregates'
    /// dense levels, and run ahead of and behind the local count; otherwise small reports taken
    /// at the local count.
    pub wide_samples: bool,
}

impl Mix {
    /// The operations, routes and releases most often.
    pub fn op(&self) -> impl Strategy<Value = Op> + use<> {
        let kind = Union::new_weighted(
            (self.kinds.iter())
                .map(|&(weight, kind)| (weight, Just(kind)))
                .collect(),
        );
        let skew = if self.skew {
            (1.0f64..2.5).prop_map(Some).boxed()
        } else {
            Just(None).boxed()
        };
        let worker = 0..self.workers;
        let (sample_weight, sample) = if self.wide_samples {
            (4, (0u8..3, reported(), -3i64..4).boxed())
        } else {
            (3, (0u8..3, 0u64..12, Just(0i64)).boxed())
        };
        prop_oneof![
            14 => (0..self.models, 0u8..4, 0u8..6)
                .prop_map(|(model, kind, key)| Op::Route(Route { model, kind, key })),
            9 => any::<Index>().prop_map(Op::Release),
            2 => worker.clone().prop_map(Op::Health),
            2 => worker.clone().prop_map(Op::Drain),
            1 => worker.clone().prop_map(Op::Add),
            1 => worker.clone().prop_map(Op::Remove),
            1 => (kind, 0u64..4, skew, any::<bool>())
                .prop_map(|(kind, gap, skew, metrics)| Op::Policy { kind, gap, skew, metrics }),
            sample_weight => (worker, sample).prop_map(|(worker, (action, reported, shift))| {
                Op::Sample { worker, action, reported, shift }
            }),
        ]
    }
}

/// Mostly small reports; sometimes one beyond what a sample cell holds (it saturates) or one
/// past the aggregates' dense levels.
fn reported() -> impl Strategy<Value = u64> {
    prop_oneof![
        12 => 0u64..12,
        1 => Just(u64::MAX),
        1 => (1u64 << 16)..(1 << 16) + 3,
    ]
}

/// Applies `op` to `router`, whose table in force is `table`; `specs` are the workers operations
/// name by index, `held` the guards of the requests in flight, one of which a release drops. A
/// route is handed back for the test to make (and to push its guard onto `held`).
pub fn apply(
    router: &Router,
    table: &RoutingTable,
    specs: &[WorkerSpec],
    held: &mut Vec<Routed>,
    op: Op,
) -> Option<Route> {
    let index_of = |w: u8| table.index_of(&specs[usize::from(w)].name);
    match op {
        Op::Route(route) => return Some(route),
        Op::Release(index) => {
            if !held.is_empty() {
                held.swap_remove(index.index(held.len()));
            }
        }
        Op::Health(w) => {
            if let Some(i) = index_of(w) {
                router.set_health(&specs[usize::from(w)].name, !table.healthy_flags()[i]);
            }
        }
        Op::Drain(w) => {
            if let Some(i) = index_of(w) {
                let state = match table.states()[i] {
                    WorkerState::Active => WorkerState::Draining,
                    WorkerState::Draining => WorkerState::Active,
                };
                router.set_state(&specs[usize::from(w)].name, state);
            }
        }
        Op::Add(w) => {
            let _ = router.add_worker(specs[usize::from(w)].clone());
        }
        Op::Remove(w) => {
            let _ = router.remove_worker(&specs[usize::from(w)].name);
        }
        Op::Policy {
            kind,
            gap,
            skew,
            metrics,
        } => {
            let load_source = if metrics {
                LoadSource::WorkerMetrics
            } else {
                LoadSource::Local
            };
            let patch = PolicyPatch {
                kind: Some(kind),
                min_load_gap: Some(gap),
                max_load_skew: skew,
                load_source: Some(load_source),
                ..PolicyPatch::default()
            };
            router.set_policy(&patch).unwrap();
        }
        Op::Sample {
            worker,
            action,
            reported,
            shift,
        } => {
            if let Some(i) = index_of(worker) {
                let stats = &table.workers()[i].stats;
                let local_at_scrape = stats.active().saturating_add_signed(shift);
                match action {
                    0 => router.publish_sample(
                        stats,
                        FleetSample {
                            reported,
                            local_at_scrape,
                        },
                        1_000,
                    ),
                    1 => router.mark_sample_stale(stats),
                    _ => router.clear_sample(stats),
                }
            }
        }
    }
    None
}
