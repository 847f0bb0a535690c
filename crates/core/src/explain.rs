//! Offline what-if: given workers, loads, health, thresholds and a key, which worker and branch would
//! the policy pick? Reserves nothing. Used by `gatewayd explain` (one scenario from flags, or one
//! JSON scenario per line with `--batch`) and checked against the golden vectors.
//!
//! The scenario schema (`docs/explain.md`):
//! `{"workers":[url..],"loads":{url:n},"healthy":{url:bool},"routing_key":k,"explicit":bool,
//!   "min_load_gap":g,"max_load_skew":s,"spill_order":o,"policy":kind}`; `loads`, `healthy`,
//! `spill_order` and `policy` are optional and default to 0, true, `ring` and
//! `bounded_consistent_hashing`; `min_load_gap` and `max_load_skew` default to 2 and 1.5.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::decide::{Decision, FleetView, decide};
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
        ] {
            if let Some(url) = urls.into_iter().find(|u| !scenario.workers.contains(u)) {
                return Err(ScenarioError::UnknownWorker {
                    field,
                    url: url.clone(),
                });
            }
        }
        if self.cached.as_ref().map(|(w, _)| w) != Some(&scenario.workers) {
            let ring = Ring::build(&scenario.workers, DEFAULT_VIRTUAL_NODES);
            self.cached = Some((scenario.workers.clone(), ring));
        }
        let ring = &self.cached.as_ref().expect("just set").1;
        let fleet = ScenarioFleet::new(scenario);
        let key = scenario_key(scenario);
        let decision: Decision = decide(ring, &policy, &key, &fleet, 0, 0);
        let url = |w: usize| scenario.workers[w].clone();
        Ok(Answer {
            worker: decision.worker.map(url),
            branch: decision.branch,
            preferred: decision.preferred.map(url),
            bound: decision.bound,
        })
    }
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
    healthy: Vec<bool>,
    loads: Vec<u64>,
    urls: Vec<String>,
}

impl ScenarioFleet {
    fn new(scenario: &Scenario) -> Self {
        Self {
            healthy: scenario
                .workers
                .iter()
                .map(|u| scenario.healthy.get(u).copied().unwrap_or(true))
                .collect(),
            loads: scenario
                .workers
                .iter()
                .map(|u| scenario.loads.get(u).copied().unwrap_or(0))
                .collect(),
            urls: scenario.workers.clone(),
        }
    }
}

impl FleetView for ScenarioFleet {
    fn worker_count(&self) -> usize {
        self.urls.len()
    }
    fn healthy(&self, worker: usize) -> bool {
        self.healthy[worker]
    }
    fn healthy_count(&self) -> usize {
        self.healthy.iter().filter(|h| **h).count()
    }
    fn load(&self, worker: usize) -> u64 {
        self.loads[worker]
    }
    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        self.urls.iter().position(|u| u.as_bytes() == raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(json: &str) -> Scenario {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_and_errors() {
        let mut explainer = Explainer::new();
        let s =
            scenario(r#"{"workers":["http://a","http://b"],"routing_key":"k","explicit":true}"#);
        assert_eq!((s.min_load_gap, s.max_load_skew), (2, 1.5));
        let answer = explainer.explain(&s).unwrap();
        assert_eq!(answer.branch, Branch::ExplicitRoutingKeyHit);
        assert_eq!(answer.worker, answer.preferred);
        let stray = scenario(
            r#"{"workers":["http://a"],"loads":{"http://z":1},"routing_key":"k","explicit":true}"#,
        );
        assert!(
            explainer
                .explain(&stray)
                .unwrap_err()
                .to_string()
                .contains("loads")
        );
        let bad = scenario(
            r#"{"workers":["http://a"],"routing_key":"k","explicit":true,"max_load_skew":0.5}"#,
        );
        assert!(explainer.explain(&bad).is_err());
        assert!(
            serde_json::from_str::<Scenario>(
                r#"{"workers":[],"routing_key":"k","explicit":true,"x":1}"#
            )
            .is_err()
        );
    }
}
