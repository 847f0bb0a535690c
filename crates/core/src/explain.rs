//! Offline what-if: given workers, loads, health, thresholds and a key, which worker and branch would
//! the policy pick? Reserves nothing. Used by `gatewayd explain` (one scenario from flags, or one
//! JSON scenario per line with `--batch`) and checked against the golden vectors.
//!
//! The scenario schema (`docs/explain.md`):
//! `{"workers":[url..],"loads":{url:n},"healthy":{url:bool},"routing_key":k,"explicit":bool,
//!   "min_load_gap":g,"max_load_skew":s,"spill_order":o,"policy":kind,"load_source":src,
//!   "reported":{url:n},"local_at_scrape":{url:n}}`; `loads`, `healthy`, `spill_order` and `policy`
//! are optional and default to 0, true, `ring` and `bounded_consistent_hashing`; `min_load_gap` and
//! `max_load_skew` default to 2 and 1.5; `load_source` defaults to `local`, and in `worker_metrics`
//! mode `reported` holds the workers' scraped loads (a worker without one falls back to local load)
//! and `local_at_scrape` this replica's in-flight count at that scrape (default: its `loads` value,
//! nothing changed since). Capacity: `max_in_flight_per_worker` (default 0, no cap), `max_in_flight`
//! (per-worker overrides by URL) and `engine_full` (workers whose engine reports saturation, by
//! URL) make workers full; the answer then says where the request moves or what it waits for.
//! Models: `models` (the models each worker serves, by URL) and `model` (the request's) decide
//! within that model's pool, on a ring over its workers only, with the bound over their loads
//! (as the gateway's pools by model); with `models` given, `model` is required.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::admission::{AdmissionSettings, Wait};
use crate::decide::{Decision, FleetView, decide};
use crate::fleet_load::{FleetSample, LoadSignal, LoadSource};
use crate::policy::{
    BoundCheck, Branch, DEFAULT_MAX_LOAD_SKEW, DEFAULT_MIN_LOAD_GAP, DEFAULT_VIRTUAL_NODES,
    PolicyError, PolicyKind, PolicySettings, SpillOrder,
};
use crate::ring::Ring;
use crate::routing_key::{ExplicitKey, ImplicitKey, ImplicitSource, RoutingKey};

/// One what-if scenario. Workers are identified by URL, which is also their ring identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Worker URLs in configuration order.
    pub workers: Vec<String>,
    /// In-flight requests per worker URL before the request; missing workers count 0.
    #[serde(default)]
    pub loads: HashMap<String, u64>,
    /// Health per worker URL; missing workers are healthy.
    #[serde(default)]
    pub healthy: HashMap<String, bool>,
    /// The routing key's value (the header's text).
    pub routing_key: String,
    /// `true`: the value came in the explicit routing-key header (may spill). `false`: it came in an
    /// implicit header such as Authorization (never spills).
    pub explicit: bool,
    /// `min_load_gap`: in-flight requests the preferred worker may exceed the minimum by (default 2).
    #[serde(default = "default_gap")]
    pub min_load_gap: u64,
    /// `max_load_skew`: the factor over the mean the preferred worker must exceed (default 1.5).
    #[serde(default = "default_skew")]
    pub max_load_skew: f64,
    /// Where a spilled request goes among the workers under the bound; defaults to `ring`.
    #[serde(default)]
    pub spill_order: SpillOrder,
    /// Policy; defaults to `bounded_consistent_hashing`.
    #[serde(default)]
    pub policy: PolicyKind,
    /// Which load the rule reads; defaults to `local` (then `reported` is shown but not used).
    #[serde(default)]
    pub load_source: LoadSource,
    /// Each worker's reported running + waiting requests at its last good scrape, by URL; a worker
    /// missing here has no fresh sample and falls back to local load.
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub reported: HashMap<String, u64>,
    /// This replica's in-flight requests on the worker when that scrape was sent, by URL; defaults
    /// to the worker's `loads` value (nothing changed since the scrape).
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub local_at_scrape: HashMap<String, u64>,
    /// Requests in flight each worker may hold (compared with the load the rule reads); 0, the
    /// default, is no cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_in_flight_per_worker: u64,
    /// Per-worker capacity overrides by URL (0 = no cap for that worker).
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub max_in_flight: HashMap<String, u64>,
    /// Workers whose engine reports saturation (over `max_waiting` or `max_kv_usage`), by URL;
    /// missing workers are not saturated.
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub engine_full: HashMap<String, bool>,
    /// The models each worker serves, by URL (a worker missing here serves none). Empty, the
    /// default: no model is declared and every worker is in the one pool.
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub models: HashMap<String, Vec<String>>,
    /// The request's model: the decision is taken among the workers that serve it, on their own
    /// ring, with the bound over their loads only. Required when `models` declares any; ignored
    /// without `models` (one pool, as in a gateway without models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn default_gap() -> u64 {
    DEFAULT_MIN_LOAD_GAP
}

fn default_skew() -> f64 {
    DEFAULT_MAX_LOAD_SKEW
}

/// The answer: `{"worker":url|null,"branch":..}` plus, when present, the preferred worker and the
/// numbers the bound compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// URL of the chosen worker, `null` for a 503.
    pub worker: Option<String>,
    /// The branch the decision took (the `x-bch-branch` value the gateway would send).
    pub branch: Branch,
    /// URL of the ring's preferred worker (omitted when there is none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred: Option<String>,
    /// Loads and thresholds behind a bounded decision (omitted otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<BoundCheck>,
    /// Which signal the bound's loads came from (with `bound`, when the scenario uses worker
    /// metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_signal: Option<LoadSignal>,
    /// Per worker: local and fleet numbers, when the scenario uses worker metrics or gives
    /// reported loads (omitted otherwise, so classic scenarios answer as they always did). Named
    /// as in `/admin/explain`, whose `loads` is the map of local counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fleet_loads: Vec<WorkerLoad>,
    /// When no worker was chosen because the ones the request may use are full: what it waits
    /// for at the gateway (`{"for_worker": url}` or `"for_any_worker"`); omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitsFor>,
    /// The model whose pool the decision was taken in (omitted when the scenario declares no
    /// models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// [`Wait`] with the worker named by URL, as everywhere in an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitsFor {
    /// Only this worker may take the request (an implicit key, a target worker).
    ForWorker(String),
    /// Any worker with room may take it.
    ForAnyWorker,
}

/// One worker's load as the rule sees it, in requests: this replica's count, the worker's report
/// and the fleet-wide load the formula gives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerLoad {
    /// Worker URL (or name, in the gateway's live explain).
    pub worker: String,
    /// This replica's in-flight requests on it.
    pub local: u64,
    /// Its reported running + waiting requests at the last good scrape, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<u64>,
    /// This replica's requests since that scrape, net of its requests that ended since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_scrape: Option<i64>,
    /// `max(local, reported + since_scrape)`: the fleet-wide load (equals `local` without a fresh
    /// report).
    pub fleet: u64,
    /// The load the rule read: `fleet` in `worker_metrics` mode with a fresh report, else `local`.
    pub used: u64,
    /// Which signal `used` is.
    pub signal: LoadSignal,
}

impl WorkerLoad {
    /// The numbers for one worker with `local` in-flight requests and, if fresh, `sample`, under
    /// `source`.
    pub fn new(
        worker: String,
        local: u64,
        sample: Option<FleetSample>,
        source: LoadSource,
    ) -> WorkerLoad {
        let fleet = crate::fleet_load::fleet_load(local, sample);
        let metrics = source == LoadSource::WorkerMetrics && sample.is_some();
        WorkerLoad {
            worker,
            local,
            reported: sample.map(|s| s.reported),
            since_scrape: sample.map(|s| s.since_scrape(local)),
            fleet,
            used: if metrics { fleet } else { local },
            signal: if metrics {
                LoadSignal::WorkerMetrics
            } else {
                LoadSignal::Local
            },
        }
    }
}

/// Why a scenario could not be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    /// `min_load_gap` / `max_load_skew` / `policy` out of range; the message names the field.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The same URL twice in `workers`.
    #[error("workers lists {0:?} twice")]
    DuplicateWorker(String),
    /// `loads` or `healthy` names a URL that is not in `workers`.
    #[error("{field} names {url:?}, which is not in workers")]
    UnknownWorker {
        /// `loads` or `healthy`.
        field: &'static str,
        /// The stray URL.
        url: String,
    },
    /// `models` declares models but the scenario names none in `model`.
    #[error("models are declared: name the request's model in model")]
    MissingModel,
    /// No worker of `models` serves `model`.
    #[error("no worker serves model {0:?}")]
    UnknownModel(String),
}

/// Evaluates scenarios, reusing the last ring when consecutive scenarios list the same workers (a
/// batch of 10,000 scenarios over one fleet builds one ring).
#[derive(Debug, Default)]
pub struct Explainer {
    cached: Option<(Vec<String>, Ring)>,
}

impl Explainer {
    /// A fresh explainer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Evaluates one scenario.
    pub fn explain(&mut self, scenario: &Scenario) -> Result<Answer, ScenarioError> {
        let policy = PolicySettings {
            kind: scenario.policy,
            min_load_gap: scenario.min_load_gap,
            max_load_skew: scenario.max_load_skew,
            spill_order: scenario.spill_order,
            virtual_nodes: DEFAULT_VIRTUAL_NODES,
            load_source: scenario.load_source,
            admission: AdmissionSettings {
                max_in_flight_per_worker: scenario.max_in_flight_per_worker,
                ..AdmissionSettings::default()
            },
        };
        policy.validate()?;
        for (index, url) in scenario.workers.iter().enumerate() {
            if scenario.workers[..index].contains(url) {
                return Err(ScenarioError::DuplicateWorker(url.clone()));
            }
        }
        for (field, urls) in [
            ("loads", scenario.loads.keys().collect::<Vec<_>>()),
            ("healthy", scenario.healthy.keys().collect()),
            ("reported", scenario.reported.keys().collect()),
            ("local_at_scrape", scenario.local_at_scrape.keys().collect()),
            ("max_in_flight", scenario.max_in_flight.keys().collect()),
            ("engine_full", scenario.engine_full.keys().collect()),
            ("models", scenario.models.keys().collect()),
        ] {
            if let Some(url) = urls.into_iter().find(|u| !scenario.workers.contains(u)) {
                return Err(ScenarioError::UnknownWorker {
                    field,
                    url: url.clone(),
                });
            }
        }
        let (members, model) = pool_of(scenario)?;
        if self.cached.as_ref().map(|(w, _)| w.as_slice()) != Some(&*members) {
            let ring = Ring::build(&members, DEFAULT_VIRTUAL_NODES);
            self.cached = Some((members.into_owned(), ring));
        }
        let (members, ring) = self.cached.as_ref().expect("just set");
        let fleet = ScenarioFleet::new(scenario, members, &policy.admission);
        let key = scenario_key(scenario);
        let decision: Decision = decide(ring, &policy, &key, &fleet, 0, 0);
        let url = |w: usize| members[w].clone();
        let fleet_numbers =
            scenario.load_source == LoadSource::WorkerMetrics || !scenario.reported.is_empty();
        let fleet_loads = if fleet_numbers {
            (0..members.len())
                .map(|w| {
                    WorkerLoad::new(url(w), fleet.local[w], fleet.samples[w], policy.load_source)
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Answer {
            worker: decision.worker.map(url),
            branch: decision.branch,
            preferred: decision.preferred.map(url),
            bound: decision.bound,
            load_signal: decision.load_signal.filter(|_| fleet_numbers),
            fleet_loads,
            wait: decision.wait.map(|wait| match wait {
                Wait::ForWorker(w) => WaitsFor::ForWorker(url(w)),
                Wait::ForAnyWorker => WaitsFor::ForAnyWorker,
            }),
            model,
        })
    }
}

/// The workers the scenario's request is decided among, in configuration order, and the model
/// whose pool they are: every worker when no model is declared, else those that serve `model`.
fn pool_of(scenario: &Scenario) -> Result<(Cow<'_, [String]>, Option<String>), ScenarioError> {
    let declared = scenario.models.values().any(|models| !models.is_empty());
    if !declared {
        return Ok((Cow::Borrowed(&scenario.workers), None));
    }
    let model = scenario.model.as_ref().ok_or(ScenarioError::MissingModel)?;
    let serves =
        |url: &String| (scenario.models.get(url)).is_some_and(|models| models.contains(model));
    let members: Vec<String> = scenario
        .workers
        .iter()
        .filter(|u| serves(u))
        .cloned()
        .collect();
    if members.is_empty() {
        return Err(ScenarioError::UnknownModel(model.clone()));
    }
    Ok((Cow::Owned(members), Some(model.clone())))
}

/// The routing key a scenario describes. An explicit value that is not a valid explicit key (empty,
/// over 128 bytes) is treated as absent, exactly as the gateway treats the header.
fn scenario_key(scenario: &Scenario) -> RoutingKey<'_> {
    if scenario.explicit {
        match ExplicitKey::parse(scenario.routing_key.as_bytes()) {
            Ok(key) => RoutingKey::Explicit(key),
            Err(_) => RoutingKey::None,
        }
    } else if scenario.routing_key.is_empty() {
        RoutingKey::None
    } else {
        RoutingKey::Implicit(ImplicitKey::from_value(
            ImplicitSource::Authorization,
            scenario.routing_key.as_bytes(),
        ))
    }
}

struct ScenarioFleet {
    /// A scenario names no drained worker, so its healthy workers are its routable ones.
    routable: Vec<bool>,
    local: Vec<u64>,
    samples: Vec<Option<FleetSample>>,
    source: LoadSource,
    urls: Vec<String>,
    capacity: Vec<Option<u64>>,
    engine_full: Vec<bool>,
}

impl ScenarioFleet {
    fn new(scenario: &Scenario, workers: &[String], admission: &AdmissionSettings) -> Self {
        let local: Vec<u64> = workers
            .iter()
            .map(|u| scenario.loads.get(u).copied().unwrap_or(0))
            .collect();
        let samples = workers
            .iter()
            .zip(&local)
            .map(|(u, &local)| {
                scenario.reported.get(u).map(|&reported| FleetSample {
                    reported,
                    local_at_scrape: scenario.local_at_scrape.get(u).copied().unwrap_or(local),
                })
            })
            .collect();
        Self {
            routable: workers
                .iter()
                .map(|u| scenario.healthy.get(u).copied().unwrap_or(true))
                .collect(),
            local,
            samples,
            source: scenario.load_source,
            urls: workers.to_vec(),
            capacity: workers
                .iter()
                .map(|u| admission.capacity(scenario.max_in_flight.get(u).copied()))
                .collect(),
            engine_full: workers
                .iter()
                .map(|u| scenario.engine_full.get(u).copied().unwrap_or(false))
                .collect(),
        }
    }
}

impl FleetView for ScenarioFleet {
    fn worker_count(&self) -> usize {
        self.urls.len()
    }
    fn routable(&self, worker: usize) -> bool {
        self.routable[worker]
    }
    fn routable_count(&self) -> usize {
        self.routable.iter().filter(|r| **r).count()
    }
    fn load(&self, worker: usize) -> u64 {
        self.load_with_signal(worker).0
    }
    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        match (self.source, self.samples[worker]) {
            (LoadSource::WorkerMetrics, Some(sample)) => {
                (sample.load(self.local[worker]), LoadSignal::WorkerMetrics)
            }
            _ => (self.local[worker], LoadSignal::Local),
        }
    }
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.urls.iter().position(|u| u.as_bytes() == raw)
    }
    fn limited(&self) -> bool {
        self.capacity.iter().any(Option::is_some) || self.engine_full.contains(&true)
    }
    fn capacity(&self, worker: usize) -> Option<u64> {
        self.capacity[worker]
    }
    fn engine_full(&self, worker: usize) -> bool {
        self.engine_full[worker]
    }
}

#[cfg(test)]
mod tests;
