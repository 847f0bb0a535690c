//! Routing policies, their settings, the branches a decision can take and the bounded spill rule.
//!
//! The rule (docs/policy.md, compatible with SGLang Model Gateway's `bounded_consistent_hashing`):
//! for an explicit routing key, with loads read *before* the new request is added and `min`/`mean`
//! taken over healthy workers, the request spills off its preferred worker iff
//! `preferred − min > min_load_gap` **and** `preferred > mean × max_load_skew` (both strict). The
//! target is the first healthy worker clockwise after the preferred one whose load is
//! `<= mean × max_load_skew`; if none qualifies the preferred worker keeps the request.
//!
//! Why two thresholds: on a near-idle fleet the mean is tiny, so the skew test alone would spill a
//! key at its second in-flight request and throw away its KV cache for nothing. The gap test
//! requires the preferred worker to be *absolutely* busier than the idlest worker by more than
//! `min_load_gap` requests; the skew test requires it to be *relatively* overloaded. Loads `[p,0,0,0]`
//! with gap 2 and skew 1.5 stay for `p <= 2` and spill at `p = 3`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::admission::{AdmissionError, AdmissionPatch, AdmissionSettings};
use crate::fleet_load::LoadSource;

/// Default `min_load_gap`, in in-flight requests.
pub const DEFAULT_MIN_LOAD_GAP: u64 = 2;
/// Default `max_load_skew`, a factor over the fleet mean.
pub const DEFAULT_MAX_LOAD_SKEW: f64 = 1.5;
/// Default virtual nodes per worker (SGLang Model Gateway's value; required for placement parity).
pub const DEFAULT_VIRTUAL_NODES: u32 = 150;
/// Upper bound on `virtual_nodes`, to keep ring builds and memory bounded (64 workers × 10,000
/// points is 640,000 points, about 8 MiB).
pub const MAX_VIRTUAL_NODES: u32 = 10_000;

/// Which routing policy is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Strict affinity: the first healthy worker clockwise from the key; load is ignored.
    ConsistentHashing,
    /// Affinity with a load bound: explicit keys spill off a clearly overloaded worker.
    #[default]
    BoundedConsistentHashing,
    /// Baseline: healthy workers in turn; routing keys are ignored (target worker still applies).
    RoundRobin,
    /// Baseline: a uniformly random healthy worker; routing keys are ignored (target worker still
    /// applies).
    Random,
}

impl PolicyKind {
    /// Every kind, in documentation order.
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::ConsistentHashing,
        PolicyKind::BoundedConsistentHashing,
        PolicyKind::RoundRobin,
        PolicyKind::Random,
    ];

    /// The snake-case name used in configuration, JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::ConsistentHashing => "consistent_hashing",
            PolicyKind::BoundedConsistentHashing => "bounded_consistent_hashing",
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| PolicyError::UnknownKind(s.to_owned()))
    }
}

/// Where the bounded policy looks for a spill target among the workers under the bound.
///
/// Both orders are per key and deterministic, so every gateway replica picks the same target for the
/// same loads, and both reach every healthy worker (the least-loaded one is always eligible). They
/// differ in what a key's overflow lands on when its first choices are also over the bound
/// (docs/policy.md, "Spill order").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SpillOrder {
    /// The next eligible worker clockwise on the ring after the preferred one: SGLang Model
    /// Gateway's order, and the default.
    #[default]
    Ring,
    /// The eligible worker ranked first in a per-key pseudo-random order of the workers (highest
    /// score `mix(key position, worker ring id)`), as Envoy's bounded-load hashing walks a per-hash
    /// random sequence of hosts. The order depends on worker ring ids only, never on configuration
    /// order, so replicas agree.
    HashSeeded,
}

impl SpillOrder {
    /// Every order, in documentation order.
    pub const ALL: [SpillOrder; 2] = [SpillOrder::Ring, SpillOrder::HashSeeded];

    /// The snake-case name used in configuration and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            SpillOrder::Ring => "ring",
            SpillOrder::HashSeeded => "hash_seeded",
        }
    }
}

impl fmt::Display for SpillOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SpillOrder {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpillOrder::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| PolicyError::UnknownSpillOrder(s.to_owned()))
    }
}

/// The policy in force: kind, both thresholds, the spill order, the ring's virtual nodes and which
/// load the rule reads. The JSON shape is the one of `GET /admin/policy`:
/// `{"kind","min_load_gap","max_load_skew","spill_order","virtual_nodes","load_source"}`
/// (`spill_order` may be absent when read, meaning `ring`, and `load_source` may be absent, meaning
/// `local`, so documents written before either existed still parse). Unknown fields are ignored when
/// read, as the telemetry protocol requires of clients (docs/protocol.md): a console must keep
/// working against a gateway that reports a newer field (changes come in as the strict
/// [`PolicyPatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PolicySettings {
    /// Which policy decides (`bounded_consistent_hashing` unless set).
    pub kind: PolicyKind,
    /// Bounded policy: the preferred worker must exceed the healthy minimum by more than this many
    /// in-flight requests before it may spill. Integer ≥ 0.
    pub min_load_gap: u64,
    /// Bounded policy: the preferred worker must exceed the healthy mean times this factor before it
    /// may spill. Finite, ≥ 1.0.
    pub max_load_skew: f64,
    /// Bounded policy: where a spilled request goes among the workers under the bound.
    #[serde(default)]
    pub spill_order: SpillOrder,
    /// Points per worker on the ring. Changing it rebuilds the ring (and moves keys).
    pub virtual_nodes: u32,
    /// Which per-worker load the rule reads: this process's in-flight requests, or the fleet-wide
    /// load from the workers' own gauges ([`crate::fleet_load`]).
    #[serde(default)]
    pub load_source: LoadSource,
    /// Capacity per worker, engine-reported saturation and the gateway's queue (`[admission]`),
    /// published with the policy so one decision reads one consistent set. Absent when read:
    /// the defaults, which change no decision.
    #[serde(default)]
    pub admission: AdmissionSettings,
}

impl Default for PolicySettings {
    fn default() -> Self {
        Self {
            kind: PolicyKind::default(),
            min_load_gap: DEFAULT_MIN_LOAD_GAP,
            max_load_skew: DEFAULT_MAX_LOAD_SKEW,
            spill_order: SpillOrder::default(),
            virtual_nodes: DEFAULT_VIRTUAL_NODES,
            load_source: LoadSource::default(),
            admission: AdmissionSettings::default(),
        }
    }
}

/// A partial policy change: any subset of [`PolicySettings`]' fields. The body of
/// `PUT /admin/policy` and the payload of the websocket `set_policy` command.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPatch {
    /// New kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<PolicyKind>,
    /// New `min_load_gap` (requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_load_gap: Option<u64>,
    /// New `max_load_skew` (factor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_load_skew: Option<f64>,
    /// New spill order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_order: Option<SpillOrder>,
    /// New virtual nodes per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_nodes: Option<u32>,
    /// New load source (`local` or `worker_metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_source: Option<LoadSource>,
    /// Admission changes, same field names as `[admission]`:
    /// `{"admission": {"max_in_flight_per_worker": 4}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionPatch>,
}

impl From<PolicySettings> for PolicyPatch {
    /// The patch that sets every field to `settings`' value.
    fn from(settings: PolicySettings) -> Self {
        PolicyPatch {
            kind: Some(settings.kind),
            min_load_gap: Some(settings.min_load_gap),
            max_load_skew: Some(settings.max_load_skew),
            spill_order: Some(settings.spill_order),
            virtual_nodes: Some(settings.virtual_nodes),
            load_source: Some(settings.load_source),
            admission: Some(settings.admission.into()),
        }
    }
}

/// Why a policy setting was refused. Messages name the field so an operator can fix it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// `max_load_skew` was NaN, infinite or below 1.0.
    #[error("max_load_skew must be a finite number >= 1.0, got {0}")]
    InvalidSkew(f64),
    /// `virtual_nodes` was 0 or above [`MAX_VIRTUAL_NODES`].
    #[error("virtual_nodes must be between 1 and {MAX_VIRTUAL_NODES}, got {0}")]
    InvalidVirtualNodes(u32),
    /// Unknown policy name.
    #[error(
        "kind must be one of consistent_hashing, bounded_consistent_hashing, round_robin, random; got {0:?}"
    )]
    UnknownKind(String),
    /// Unknown spill order name.
    #[error("spill_order must be one of ring, hash_seeded; got {0:?}")]
    UnknownSpillOrder(String),
    /// An `[admission]` field was out of range.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
}

impl PolicyError {
    /// The field at fault, as `[policy]` (and the admin API's policy body) spells it.
    pub fn field(&self) -> &'static str {
        match self {
            PolicyError::InvalidSkew(_) => "max_load_skew",
            PolicyError::InvalidVirtualNodes(_) => "virtual_nodes",
            PolicyError::UnknownKind(_) => "kind",
            PolicyError::UnknownSpillOrder(_) => "spill_order",
            PolicyError::Admission(error) => error.field(),
        }
    }
}

impl PolicySettings {
    /// Checks every field; `Ok` means the settings can be put in force.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !self.max_load_skew.is_finite() || self.max_load_skew < 1.0 {
            return Err(PolicyError::InvalidSkew(self.max_load_skew));
        }
        if self.virtual_nodes == 0 || self.virtual_nodes > MAX_VIRTUAL_NODES {
            return Err(PolicyError::InvalidVirtualNodes(self.virtual_nodes));
        }
        self.admission.validate()?;
        Ok(())
    }

    /// Returns these settings with `patch` applied, validated; `self` is never changed, so a refused
    /// patch leaves the running policy as it was.
    pub fn patched(&self, patch: &PolicyPatch) -> Result<PolicySettings, PolicyError> {
        let next = PolicySettings {
            kind: patch.kind.unwrap_or(self.kind),
            min_load_gap: patch.min_load_gap.unwrap_or(self.min_load_gap),
            max_load_skew: patch.max_load_skew.unwrap_or(self.max_load_skew),
            spill_order: patch.spill_order.unwrap_or(self.spill_order),
            virtual_nodes: patch.virtual_nodes.unwrap_or(self.virtual_nodes),
            load_source: patch.load_source.unwrap_or(self.load_source),
            admission: match &patch.admission {
                Some(admission) => self.admission.patched(admission)?,
                None => self.admission,
            },
        };
        next.validate()?;
        Ok(next)
    }
}

/// Which path a routing decision took (docs/policy.md, "Branches"). Serialized in snake case; the same names are
/// used in the `x-bch-branch` response header and the `bch_branch_total` metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Branch {
    /// No healthy worker could take the request (503).
    NoHealthyWorkers,
    /// `X-SMG-Target-Worker` named a healthy worker.
    TargetWorkerHit,
    /// `X-SMG-Target-Worker` named an unknown or unhealthy worker (503, never a fall-through).
    TargetWorkerMiss,
    /// Explicit key served by its preferred worker.
    ExplicitRoutingKeyHit,
    /// Explicit key spilled to the next eligible worker clockwise.
    ExplicitRoutingKeySpillover,
    /// Explicit key over the bound but no other worker was under it; stayed on the preferred worker.
    ExplicitRoutingKeyNoEligibleCandidate,
    /// Implicit key (Authorization, X-Forwarded-For, Cookie) served by its preferred worker.
    ImplicitRoutingKeyHit,
    /// No key: the less loaded of two random healthy workers (or a baseline policy's pick).
    Keyless,
    /// Explicit key whose preferred worker is full (at capacity, or its engine saturated): moved
    /// at once to the first worker with room in its spill order, whatever the bound says.
    ExplicitRoutingKeyCapacitySpill,
    /// `X-SMG-Target-Worker` named a routable worker that is full: the request waits for it.
    TargetWorkerFull,
    /// Implicit key whose preferred worker is full: the request waits for it (implicit keys never
    /// move).
    ImplicitRoutingKeyFull,
    /// An explicit key or keyless request found no eligible worker with room: it waits for any.
    FleetFull,
}

impl Branch {
    /// Every branch, in documentation order (for metrics pre-registration).
    pub const ALL: [Branch; 12] = [
        Branch::NoHealthyWorkers,
        Branch::TargetWorkerHit,
        Branch::TargetWorkerMiss,
        Branch::ExplicitRoutingKeyHit,
        Branch::ExplicitRoutingKeySpillover,
        Branch::ExplicitRoutingKeyNoEligibleCandidate,
        Branch::ImplicitRoutingKeyHit,
        Branch::Keyless,
        Branch::ExplicitRoutingKeyCapacitySpill,
        Branch::TargetWorkerFull,
        Branch::ImplicitRoutingKeyFull,
        Branch::FleetFull,
    ];

    /// The snake-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Branch::NoHealthyWorkers => "no_healthy_workers",
            Branch::TargetWorkerHit => "target_worker_hit",
            Branch::TargetWorkerMiss => "target_worker_miss",
            Branch::ExplicitRoutingKeyHit => "explicit_routing_key_hit",
            Branch::ExplicitRoutingKeySpillover => "explicit_routing_key_spillover",
            Branch::ExplicitRoutingKeyNoEligibleCandidate => {
                "explicit_routing_key_no_eligible_candidate"
            }
            Branch::ImplicitRoutingKeyHit => "implicit_routing_key_hit",
            Branch::Keyless => "keyless",
            Branch::ExplicitRoutingKeyCapacitySpill => "explicit_routing_key_capacity_spill",
            Branch::TargetWorkerFull => "target_worker_full",
            Branch::ImplicitRoutingKeyFull => "implicit_routing_key_full",
            Branch::FleetFull => "fleet_full",
        }
    }

    /// True for the branches shown as spills (telemetry spill events): the two that come from
    /// the bound firing, and the capacity spill.
    pub fn is_spill_event(self) -> bool {
        matches!(
            self,
            Branch::ExplicitRoutingKeySpillover
                | Branch::ExplicitRoutingKeyNoEligibleCandidate
                | Branch::ExplicitRoutingKeyCapacitySpill
        )
    }

    /// True for the branches that moved a request off its preferred worker (a spill out of it and
    /// into the worker that got it).
    pub fn moved(self) -> bool {
        matches!(
            self,
            Branch::ExplicitRoutingKeySpillover | Branch::ExplicitRoutingKeyCapacitySpill
        )
    }

    /// True for the branches of a decision that chose no worker for want of room: the request may
    /// wait ([`crate::decide::Decision::wait`] says for what) or be shed. These names are also
    /// the `x-bch-branch` of a shed answer, so a client sees which wait it gave up on.
    pub fn is_full(self) -> bool {
        matches!(
            self,
            Branch::TargetWorkerFull | Branch::ImplicitRoutingKeyFull | Branch::FleetFull
        )
    }
}

impl fmt::Display for Branch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The numbers behind a bounded-policy decision on an explicit key, for telemetry and `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BoundCheck {
    /// Preferred worker's in-flight requests, before this request.
    pub preferred_load: u64,
    /// Minimum in-flight requests over healthy workers.
    pub min_load: u64,
    /// Mean in-flight requests over healthy workers (no floor).
    pub mean_load: f64,
    /// `min_load_gap` in force (requests).
    pub min_load_gap: u64,
    /// `max_load_skew` in force (factor).
    pub max_load_skew: f64,
}

/// The minimum and mean load over the healthy workers: what the bounded rule compares a preferred
/// worker's load with. One definition for routing ([`crate::decide::decide`]) and for anyone who
/// wants to show the bound (the console's OVER marker), so both always agree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetLoad {
    /// Minimum in-flight requests over healthy workers.
    pub min_load: u64,
    /// Mean in-flight requests over healthy workers (a float, no floor).
    pub mean_load: f64,
    /// Number of healthy workers the minimum and mean were taken over.
    pub healthy: usize,
}

impl FleetLoad {
    /// Summarises the in-flight loads (requests) of the healthy workers; `None` for an empty fleet,
    /// where there is no bound. Allocation-free.
    pub fn of(healthy_loads: impl IntoIterator<Item = u64>) -> Option<FleetLoad> {
        let mut min_load = u64::MAX;
        let mut sum: u128 = 0;
        let mut healthy = 0usize;
        for load in healthy_loads {
            min_load = min_load.min(load);
            sum += u128::from(load);
            healthy += 1;
        }
        (healthy > 0).then(|| FleetLoad {
            min_load,
            mean_load: sum as f64 / healthy as f64,
            healthy,
        })
    }

    /// The bound check for a request whose preferred worker has `preferred_load` in-flight requests
    /// (read before the request is added), under `policy`'s thresholds.
    pub fn bound_for(&self, preferred_load: u64, policy: &PolicySettings) -> BoundCheck {
        BoundCheck {
            preferred_load,
            min_load: self.min_load,
            mean_load: self.mean_load,
            min_load_gap: policy.min_load_gap,
            max_load_skew: policy.max_load_skew,
        }
    }
}

impl BoundCheck {
    /// `min + min_load_gap` (saturating): the load a preferred worker must exceed to spill.
    pub fn gap_bound(&self) -> u64 {
        self.min_load.saturating_add(self.min_load_gap)
    }

    /// `mean × max_load_skew`: the load a spill target may not exceed, and the one the preferred
    /// worker must exceed.
    pub fn skew_bound(&self) -> f64 {
        self.mean_load * self.max_load_skew
    }

    /// `preferred − min > min_load_gap` (saturating subtraction).
    pub fn gap_exceeded(&self) -> bool {
        self.preferred_load.saturating_sub(self.min_load) > self.min_load_gap
    }

    /// `preferred > mean × max_load_skew`.
    pub fn skew_exceeded(&self) -> bool {
        // u64 → f64 is exact below 2^53 in-flight requests, far beyond any real load.
        self.preferred_load as f64 > self.skew_bound()
    }

    /// Both conditions: the preferred worker is clearly overloaded and the key should spill.
    pub fn should_spill(&self) -> bool {
        self.gap_exceeded() && self.skew_exceeded()
    }

    /// Whether a worker with `load` in-flight requests may take a spilled request.
    pub fn eligible(&self, load: u64) -> bool {
        load as f64 <= self.skew_bound()
    }
}

#[cfg(test)]
mod tests;
