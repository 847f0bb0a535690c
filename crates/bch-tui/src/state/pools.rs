//! Pools by model, as the console sees them: which models the fleet's workers serve (each model
//! is a pool with its own ring and its own bounded rule, `docs/models.md`), the picture of one
//! pool ([`FleetPicture::pool_view`]: its workers, the ring the gateway routes that pool on, the
//! keys and spills of its workers) and the OVER test of a picture ([`OverRule`]): the pool's own
//! minimum and mean, as the gateway's rule reads them, never the whole fleet's when the fleet has
//! several pools.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use bch_core::policy::FleetLoad;
use bch_core::telemetry::WorkerRecord;

use super::picture::{FleetBound, FleetPicture, routable};

/// Decides OVER for each worker of a picture: whether a new request of a key preferring it would
/// spill, by the bound its pool's rule reads.
#[derive(Debug, Clone, PartialEq)]
pub enum OverRule {
    /// No bound applies (the policy is unknown or never spills, or no worker takes requests):
    /// nothing is OVER.
    Nothing,
    /// One bound for every worker: a fleet with one pool (no model declared, or one), or the
    /// picture of one pool.
    One(FleetBound),
    /// The whole fleet of several pools: each pool's bound by model; a worker is OVER when a key
    /// of some pool it serves would spill off it.
    PerPool(BTreeMap<String, FleetBound>),
}

impl OverRule {
    /// Whether `worker` is OVER: routable (healthy, not draining), and over the bound of its
    /// pool (of one of its pools, for a worker that serves several models).
    pub fn over(&self, worker: &WorkerRecord) -> bool {
        if !routable(worker) {
            return false;
        }
        let load = worker.rule_load();
        match self {
            OverRule::Nothing => false,
            OverRule::One(bound) => bound.check(load).should_spill(),
            OverRule::PerPool(bounds) => (worker.models.iter())
                .filter_map(|model| bounds.get(model))
                .any(|bound| bound.check(load).should_spill()),
        }
    }
}

impl FleetPicture {
    /// The models the workers serve, sorted by name (bytes) and each once: the gateway's pools,
    /// in its order. Empty when no worker declares a model (one pool of every worker).
    pub fn models(&self) -> Vec<&str> {
        let models: BTreeSet<&str> = (self.workers.iter())
            .flat_map(|w| w.models.iter().map(String::as_str))
            .collect();
        models.into_iter().collect()
    }

    /// Whether the workers serve two models or more: the fleet has several pools, each with its
    /// own bound, so no one bound describes every worker.
    pub fn several_pools(&self) -> bool {
        let mut models = self.workers.iter().flat_map(|w| w.models.iter());
        let Some(first) = models.next() else {
            return false;
        };
        models.any(|model| model != first)
    }

    /// The bound of each model's pool: the bounded rule over the pool's routable workers' loads,
    /// as the gateway keeps it per pool. A pool without a routable worker has none. Empty when the
    /// bound is not in force.
    pub fn pool_bounds(&self) -> BTreeMap<String, FleetBound> {
        let Some(policy) = self.policy.filter(|_| self.bound_in_force()) else {
            return BTreeMap::new();
        };
        let mut loads: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for worker in self.workers.iter().filter(|w| routable(w)) {
            for model in &worker.models {
                loads.entry(model).or_default().push(worker.rule_load());
            }
        }
        (loads.into_iter())
            .filter_map(|(model, loads)| {
                let load = FleetLoad::of(loads)?;
                Some((model.to_owned(), FleetBound::new(load, policy)))
            })
            .collect()
    }

    /// How this picture decides OVER: its one bound ([`FleetPicture::bound`]) when it is one
    /// pool's picture or the fleet has one pool, else each pool's own.
    pub fn over_rule(&self) -> OverRule {
        if self.pool.is_none() && self.several_pools() {
            let bounds = self.pool_bounds();
            return if bounds.is_empty() {
                OverRule::Nothing
            } else {
                OverRule::PerPool(bounds)
            };
        }
        self.bound().map_or(OverRule::Nothing, OverRule::One)
    }

    /// This picture seen through `model`'s pool: the workers that serve `model` (configuration
    /// order), the ring the gateway routes that pool on (computed with bch-core from their ring
    /// identities, as the gateway builds a pool's ring; reused from `previous`, an earlier view
    /// of the pool, while its members are the same), and the tracked keys and spills whose
    /// preferred or serving worker is one of them. Key records and spill events name no model, so
    /// a key on a worker that serves two models shows in both pools' views. Policy, rates,
    /// history, discovery and admission stay the fleet's.
    pub(super) fn pool_view(&self, model: &str, previous: Option<&FleetPicture>) -> FleetPicture {
        let mut view = FleetPicture::default();
        view.workers = (self.workers.iter())
            .filter(|w| w.models.iter().any(|m| m == model))
            .cloned()
            .collect();
        let members: HashSet<&str> = view.workers.iter().map(|w| w.name.as_str()).collect();
        let served = |worker: &str| members.contains(worker);
        view.keys = (self.keys.iter())
            .filter(|(_, k)| served(&k.preferred) || served(&k.current))
            .map(|(label, k)| (label.clone(), k.clone()))
            .collect();
        view.spills = (self.spills.iter())
            .filter(|s| served(&s.from) || served(&s.to))
            .cloned()
            .collect();
        view.ts_ms = self.ts_ms;
        view.policy = self.policy;
        view.policy_unknown = self.policy_unknown.clone();
        view.policy_changed_by = self.policy_changed_by.clone();
        view.policy_changed_from = self.policy_changed_from.clone();
        view.baseline = self.baseline.clone();
        view.tick_interval_ms = self.tick_interval_ms;
        view.totals = self.totals;
        view.dropped_events = self.dropped_events;
        view.history = self.history.clone();
        view.discovery = self.discovery.clone();
        view.admission = self.admission;
        view.read_only = self.read_only;
        view.pool = Some(model.to_owned());
        // The whole ring's virtual nodes: a pool's ring has as many per worker.
        let virtual_nodes = self.ring.as_ref().map(|ring| ring.virtual_nodes);
        if let (Some(virtual_nodes), false) = (virtual_nodes, view.workers.is_empty()) {
            if let Some(previous) = previous.filter(|p| p.pool.as_deref() == Some(model)) {
                view.share_ring_of(previous);
            }
            view.compute_ring(virtual_nodes);
        }
        view
    }
}
