//! A worker as telemetry and the admin API describe it: [`WorkerRecord`], with its operator
//! state ([`WorkerState`]) and where it came from ([`WorkerSource`]).

use serde::{Deserialize, Serialize};

/// Whether a worker takes new requests, set by the operator (independent of health).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Takes new requests while healthy.
    #[default]
    Active,
    /// Takes no new request (its keys go where an unhealthy worker's would); requests already on
    /// it run to completion.
    Draining,
}

impl WorkerState {
    /// The snake-case name used on the wire (`active`, `draining`).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Active => "active",
            WorkerState::Draining => "draining",
        }
    }
}

/// One worker's state, as in `GET /admin/workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Worker name (unique).
    pub name: String,
    /// Worker base URL.
    pub url: String,
    /// The worker's ring identity when it is not its URL (the configured `ring_id`); the ring
    /// places `ring_id`, or the URL exactly as written when absent. Absent from older gateways'
    /// frames, which send the ring's arcs instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_id: Option<String>,
    /// Health as seen by probes and passive marking.
    pub healthy: bool,
    /// `active` or `draining` (absent from frames of older gateways: `active`).
    #[serde(default)]
    pub state: super::open::Open<WorkerState>,
    /// In-flight requests of this gateway process on the worker.
    pub active: u64,
    /// Requests routed to the worker since it was first registered.
    pub requests_total: u64,
    /// Requests spilled onto this worker from an overloaded preferred worker.
    pub spilled_in_total: u64,
    /// Requests whose preferred worker was this one but that spilled elsewhere.
    pub spilled_out_total: u64,
    /// Requests to this worker that ended in a gateway-side error (connect failure, timeout,
    /// broken stream).
    pub errors_total: u64,
    /// The load the bounded rule reads for this worker now (requests): `active` in `local` mode,
    /// the fleet-wide load in `worker_metrics` mode. `None` from a gateway that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<u64>,
    /// The worker's own running + waiting requests at its last good scrape; `None` when it was
    /// never scraped (or scraping is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_load: Option<u64>,
    /// Age of that scrape, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_age_ms: Option<u64>,
    /// In `worker_metrics` mode: no fresh sample, so the rule reads this replica's local load for
    /// the worker. Always `false` in `local` mode.
    #[serde(default)]
    pub load_stale: bool,
    /// Where the worker came from: `static` (configuration file, `--worker`, the admin API) or
    /// `dns:NAME` (found by DNS discovery of `NAME`). Absent from older gateways' frames, which
    /// only had static workers.
    #[serde(default)]
    pub source: super::open::Open<WorkerSource>,
    /// Requests in flight the worker may hold (compared with [`WorkerRecord::load`]); `None` when
    /// it has no cap, and in frames of gateways that predate capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// The worker is full (at its capacity, or its engine reported saturation) and takes no new
    /// request. Sent only when `true`; absent means not full.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
    /// Why the worker's health probes fail, while they do (`status 503`, `refused`, `tls:
    /// certificate not trusted (UnknownIssuer)`); absent once a probe passes, and from gateways
    /// that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_failure: Option<String>,
    /// The models the worker serves in this gateway (its configured `models`), one pool each;
    /// empty (and absent from the wire) when the fleet declares no models, and in frames of
    /// gateways that predate models.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// What the worker's own `GET /v1/models` listed at its last answer, when the gateway learns
    /// models (`[health] learn_models`); shown beside [`WorkerRecord::models`], never a pool of
    /// its own. `None` when not asked or never answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_models: Option<Vec<String>>,
}

impl std::fmt::Display for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl WorkerRecord {
    /// The load the rule reads: [`WorkerRecord::load`], or `active` from an older gateway.
    pub fn rule_load(&self) -> u64 {
        self.load.unwrap_or(self.active)
    }

    /// What the ring hashes for this worker: its `ring_id`, or its URL.
    pub fn ring_identity(&self) -> &str {
        self.ring_id.as_deref().unwrap_or(&self.url)
    }
}

/// Where a worker came from, on the wire `"static"` or `"dns:NAME"`.
///
/// A worker that is both configured and discovered (the same URL) is one worker whose source is
/// `static`: the configured entry is the one an operator wrote, and it stays when DNS drops it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum WorkerSource {
    /// Configured: a `[[workers]]` entry, a `--worker` flag or `POST /admin/workers`.
    #[default]
    Static,
    /// Found by DNS discovery of this name (SRV when it begins with `_`, else A/AAAA).
    Dns(String),
}

impl WorkerSource {
    /// The wire form: `static` or `dns:NAME`.
    pub fn label(&self) -> std::borrow::Cow<'_, str> {
        match self {
            WorkerSource::Static => "static".into(),
            WorkerSource::Dns(name) => format!("dns:{name}").into(),
        }
    }

    /// Whether the worker was discovered rather than configured.
    pub fn is_discovered(&self) -> bool {
        matches!(self, WorkerSource::Dns(_))
    }

    /// Parses the wire form; `None` for anything but `static` or `dns:` followed by a name.
    pub fn parse(text: &str) -> Option<WorkerSource> {
        match text {
            "static" => Some(WorkerSource::Static),
            _ => text
                .strip_prefix("dns:")
                .filter(|name| !name.is_empty())
                .map(|name| WorkerSource::Dns(name.to_owned())),
        }
    }
}

impl super::open::Open<WorkerSource> {
    /// Whether the worker was not configured: discovered by DNS, or found by a source this build
    /// does not know (a newer gateway's).
    pub fn is_discovered(&self) -> bool {
        self.known().is_none_or(WorkerSource::is_discovered)
    }
}

impl std::fmt::Display for WorkerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl Serialize for WorkerSource {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.label())
    }
}

impl<'de> Deserialize<'de> for WorkerSource {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        WorkerSource::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "worker source {text:?}: expected \"static\" or \"dns:NAME\""
            ))
        })
    }
}
