//! The small sections: `[routing]`, `[policy]`, `[picker]`, `[health]`, `[telemetry]`, `[log]`.
//! Each checks its own fields ([`FieldError`]s relative to the section); [`Config`](super::Config)
//! puts the section's name in front.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bch_core::policy::{
    DEFAULT_MAX_LOAD_SKEW, DEFAULT_MIN_LOAD_GAP, DEFAULT_VIRTUAL_NODES, PolicyKind, SpillOrder,
};
use bch_core::routing_key::{DEFAULT_ROUTING_KEY_HEADER, DEFAULT_TARGET_WORKER_HEADER};
use serde::{Deserialize, Serialize};

use super::field_error::FieldError;
use super::millis;

/// The policy a gateway runs when its configuration names none: strict `consistent_hashing`. The
/// bounded policy is opt-in because a spill gives up KV-cache locality (docs/policy.md). bch-core's
/// own `PolicySettings::default()` is the bounded policy, the one `explain` and the drills study.
pub const DEFAULT_POLICY_KIND: PolicyKind = PolicyKind::ConsistentHashing;

/// `[routing]`: which headers carry routing keys, and what of the body routes a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Header carrying the explicit routing key (case-insensitive; default `x-smg-routing-key`).
    pub routing_key_header: String,
    /// Header pinning a request to one worker by name, URL or index (case-insensitive; default
    /// `x-smg-target-worker`).
    pub target_worker_header: String,
    /// The model of a request whose body names none (not JSON, no `model` field, SGLang's
    /// `/generate`, a GET) when workers declare models; unset: such a request gets a 400 naming
    /// the missing `model`. Must be a model some worker declares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// Route by the body's `rid` (SGLang's request id) with its lineage suffixes `_tN` and `_rN`
    /// stripped, ahead of the routing-key header; off by default (the body is then only read
    /// when several models are configured).
    pub key_from_rid: bool,
    /// Answer `GET /loads` and `GET /get_loads` on the data plane with every worker's load in
    /// SGLang Model Gateway's shape (on by default); off: those paths are proxied to a worker.
    pub serve_loads: bool,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            routing_key_header: DEFAULT_ROUTING_KEY_HEADER.to_owned(),
            target_worker_header: DEFAULT_TARGET_WORKER_HEADER.to_owned(),
            default_model: None,
            key_from_rid: false,
            serve_loads: true,
        }
    }
}

/// `[policy]`: the routing policy and the bounded policy's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Policy kind; default [`DEFAULT_POLICY_KIND`].
    pub kind: PolicyKind,
    /// Bounded policy: how many in-flight requests the preferred worker may exceed the fleet
    /// minimum by before it can spill (integer ≥ 0).
    pub min_load_gap: u64,
    /// Bounded policy: the factor over the fleet mean load the preferred worker must exceed before
    /// it can spill (finite, ≥ 1.0).
    pub max_load_skew: f64,
    /// Bounded policy: where a spilled request goes among the workers under the bound: `ring`
    /// (the next one clockwise, SGLang Model Gateway's order; the default) or `hash_seeded` (a
    /// per-key pseudo-random order of the workers). docs/policy.md, "Spill order".
    pub spill_order: SpillOrder,
    /// Points per worker on the ring; 150 gives placement parity with SGLang Model Gateway.
    pub virtual_nodes: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            kind: DEFAULT_POLICY_KIND,
            min_load_gap: DEFAULT_MIN_LOAD_GAP,
            max_load_skew: DEFAULT_MAX_LOAD_SKEW,
            spill_order: SpillOrder::default(),
            virtual_nodes: DEFAULT_VIRTUAL_NODES,
        }
    }
}

impl RoutingConfig {
    /// Every header name that is not a valid HTTP header name.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems: Vec<FieldError> = [
            ("routing_key_header", &self.routing_key_header),
            ("target_worker_header", &self.target_worker_header),
        ]
        .into_iter()
        .filter(|(_, name)| http::HeaderName::from_bytes(name.as_bytes()).is_err())
        .map(|(field, name)| FieldError::new(field, format!("{name:?} is not a valid header name")))
        .collect();
        if let Some(default) = &self.default_model {
            let checked = super::models::check_models(std::slice::from_ref(default));
            problems.extend(
                checked
                    .err()
                    .map(|e| FieldError::new("default_model", e.message)),
            );
        }
        problems
    }
}

/// Most fallback endpoints the picker may list after the chosen one.
pub const MAX_PICKER_FALLBACKS: usize = 8;

/// `[picker]`: gatewayd as Envoy's endpoint picker, the Gateway API Inference Extension's
/// ext_proc protocol (docs/envoy.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PickerConfig {
    /// Where to serve `envoy.service.ext_proc.v3.ExternalProcessor` (plaintext gRPC); `None` (the
    /// default) serves no picker. Every worker must then be an `http(s)://IP:PORT` URL.
    pub listen: Option<SocketAddr>,
    /// How many fallback endpoints, in ring order from the key, follow the chosen one in the
    /// answer (0..=8); Envoy retries a failed connect on them in turn. `gatewayd envoy-config`
    /// sets Envoy's retry count to this.
    pub fallbacks: usize,
    /// `silent_stream_timeout_ms`: longest time an ext_proc stream may go without a message
    /// from Envoy; then the picker ends it (gRPC OK, so Envoy goes on without the picker) and
    /// releases its load. Envoy sends nothing between a response's headers and its end, so this
    /// also bounds how long a response's load is counted: keep it above the longest generation.
    #[serde(rename = "silent_stream_timeout_ms", with = "millis")]
    pub silent_stream_timeout: Duration,
    /// `max_streams`: most ext_proc streams open at once (each holds one request's load and
    /// about 11 KB); more are refused with `RESOURCE_EXHAUSTED`. Also each connection's HTTP/2
    /// `MAX_CONCURRENT_STREAMS`.
    pub max_streams: usize,
    /// `[picker.tls]`: the picker's own TLS (ALPN `h2`); unset = `[server.tls]`'s. With
    /// `client_ca_file` set only Envoy's client certificate opens a stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<super::tls::ListenerTls>,
    /// The model whose pool the picker serves: it routes every request among that model's
    /// workers only (one endpoint picker per pool, as the Gateway API Inference Extension has
    /// it). Must be a declared model; required when several models are declared. Unset: the
    /// only pool (the fleet without models, or its one declared model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Default `[picker] silent_stream_timeout_ms`: one hour. The data plane bounds silence inside a
/// body, not a response's length, so no data-plane timeout fits; an hour is above any
/// generation an engine finishes (a 32k-token answer at 10 tokens a second takes under an hour).
pub const DEFAULT_SILENT_STREAM_TIMEOUT: Duration = Duration::from_millis(3_600_000);

/// Default `[picker] max_streams`: the data plane's default `max_connections`, the same number of
/// requests in flight.
pub const DEFAULT_PICKER_MAX_STREAMS: usize = 10_000;

impl Default for PickerConfig {
    fn default() -> Self {
        Self {
            listen: None,
            fallbacks: 2,
            silent_stream_timeout: DEFAULT_SILENT_STREAM_TIMEOUT,
            max_streams: DEFAULT_PICKER_MAX_STREAMS,
            tls: None,
            model: None,
        }
    }
}

/// `[health]`: active probes of every worker, and passive marking on connect failures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Probe path appended to each worker URL (a worker may override it).
    pub path: String,
    /// `interval_ms`: time between probes of one worker. Each worker is probed once per interval
    /// at an offset of it stable per worker, so a fleet's probes spread over the interval.
    #[serde(rename = "interval_ms", with = "millis")]
    pub interval: Duration,
    /// `timeout_ms`: time a probe may take before it counts as a failure.
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    /// Consecutive failures before a worker is marked unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successes before an unhealthy worker is marked healthy again.
    pub healthy_threshold: u32,
    /// Mark a worker unhealthy at once when a connection to it fails (probes bring it back).
    pub passive: bool,
    /// New workers (start-up, `POST /admin/workers`, reload) get traffic only once their first
    /// probe passed; with `false` they start healthy. On by default: a worker that is not up yet
    /// (a model still loading, a typo in its address) must not answer the first requests with 502s
    /// and worker errors, and a load balancer sees `/readiness` fail until a worker is confirmed.
    pub wait_for_first_probe: bool,
    /// Also ask each worker whose probe passed for its `GET /v1/models`, with the probes, and
    /// show what it lists (`reported_models` in its record). Shown only: the configured `models`
    /// decide the pools. Off by default: not every engine serves the list.
    pub learn_models: bool,
    /// Probes in flight at once at most (each one connection, so also the prober's sockets); a
    /// probe due while this many run waits for one to finish, first probes and asked ones before
    /// periodic ones.
    pub max_concurrent_probes: usize,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            path: "/health".to_owned(),
            interval: Duration::from_millis(2_000),
            timeout: Duration::from_millis(1_000),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            passive: true,
            wait_for_first_probe: true,
            learn_models: false,
            max_concurrent_probes: 256,
        }
    }
}

/// `[telemetry]`: what the websocket telemetry tracks and how often it ticks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `interval_ms`: time between two `tick` frames to websocket clients.
    #[serde(rename = "interval_ms", with = "millis")]
    pub interval: Duration,
    /// Most recently active routing keys tracked.
    pub max_keys: usize,
    /// Show explicit keys as `key:` + 8 hex digits instead of their (truncated) text.
    pub redact_keys: bool,
    /// Spill events kept for snapshots.
    pub max_spill_events: usize,
    /// Frames queued per websocket client before it is considered slow and resynced.
    pub client_queue: usize,
    /// Record every frame a version 2 console would receive into this file (bch-core's recording
    /// format; `bch-tui --replay` plays it), so a drill nobody watched is kept. `None`: no
    /// recording.
    pub record_file: Option<PathBuf>,
    /// Size in bytes past which the recording is rotated: `FILE` becomes `FILE.1` (the older
    /// `FILE.1` … `FILE.8` move up one, the oldest is deleted) and a fresh `FILE` starts with a
    /// snapshot.
    pub record_max_bytes: u64,
}

/// `record_max_bytes` by default: 64 MiB, an hour of a busy 100-worker fleet's frames.
pub const DEFAULT_RECORD_MAX_BYTES: u64 = 64 * 1024 * 1024;

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            max_keys: 256,
            redact_keys: false,
            max_spill_events: 200,
            client_queue: 64,
            record_file: None,
            record_max_bytes: DEFAULT_RECORD_MAX_BYTES,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`: format and filter of gatewayd's log on stderr.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Text for people, JSON for log shippers.
    pub format: LogFormat,
    /// `tracing` filter, e.g. `info` or `gatewayd=debug`. `RUST_LOG` overrides it.
    pub level: String,
    /// State-change lines one source (a discovery source, a worker's scrapes, a worker's probes)
    /// may log per `state_change_period`; the rest are counted and summarised (at least 1).
    pub state_change_lines: u32,
    /// The period of that budget (`state_change_period_ms`, at least 1 ms).
    #[serde(rename = "state_change_period_ms", with = "super::millis")]
    pub state_change_period: Duration,
}

/// Lines per source per period by default: a whole incident of one source (a DNS outage and its
/// recovery write about six lines) is read in full, while a source flapping without end writes a
/// line every three seconds.
pub const DEFAULT_STATE_CHANGE_LINES: u32 = 20;

/// The budget's period by default.
pub const DEFAULT_STATE_CHANGE_PERIOD: Duration = Duration::from_secs(60);

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
            state_change_lines: DEFAULT_STATE_CHANGE_LINES,
            state_change_period: DEFAULT_STATE_CHANGE_PERIOD,
        }
    }
}

impl LogConfig {
    /// A budget of no lines, or of a zero period.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.state_change_lines == 0 {
            problems.push(FieldError::new("state_change_lines", "must be at least 1"));
        }
        if self.state_change_period.is_zero() {
            problems.push(FieldError::new(
                "state_change_period_ms",
                "must be at least 1",
            ));
        }
        problems
    }
}

impl PickerConfig {
    /// A fallback count above [`MAX_PICKER_FALLBACKS`], a zero silence timeout or stream cap, a
    /// stream cap HTTP/2 cannot announce (over `u32::MAX`), a `model` outside the name grammar
    /// (whether some worker serves it is [`Config::model_problems`](super::Config::model_problems)).
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.fallbacks > MAX_PICKER_FALLBACKS {
            problems.push(FieldError::new(
                "fallbacks",
                format!("must be at most {MAX_PICKER_FALLBACKS}"),
            ));
        }
        problems.extend(zero_durations([(
            "silent_stream_timeout_ms",
            self.silent_stream_timeout,
        )]));
        problems.extend(zero_counts([("max_streams", self.max_streams as u64)]));
        if u32::try_from(self.max_streams).is_err() {
            problems.push(FieldError::new(
                "max_streams",
                format!("must be at most {}", u32::MAX),
            ));
        }
        if let Some(tls) = &self.tls {
            problems.extend(tls.problems().into_iter().map(|e| e.within("tls")));
        }
        if let Some(model) = &self.model {
            let checked = super::models::check_models(std::slice::from_ref(model));
            problems.extend(checked.err().map(|e| FieldError::new("model", e.message)));
        }
        problems
    }
}

impl HealthConfig {
    /// A path without its leading `/`, a zero interval or timeout, a zero threshold or cap.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if !self.path.starts_with('/') {
            problems.push(FieldError::new("path", "must start with '/'"));
        }
        problems.extend(zero_durations([
            ("interval_ms", self.interval),
            ("timeout_ms", self.timeout),
        ]));
        problems.extend(zero_counts([
            ("unhealthy_threshold", u64::from(self.unhealthy_threshold)),
            ("healthy_threshold", u64::from(self.healthy_threshold)),
            ("max_concurrent_probes", self.max_concurrent_probes as u64),
        ]));
        problems
    }
}

impl TelemetryConfig {
    /// A zero tick interval or client queue.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = zero_durations([("interval_ms", self.interval)]);
        problems.extend(zero_counts([("client_queue", self.client_queue as u64)]));
        if self.record_max_bytes < MIN_RECORD_BYTES {
            problems.push(FieldError::new(
                "record_max_bytes",
                format!("must be at least {MIN_RECORD_BYTES} (one snapshot must fit)"),
            ));
        }
        problems
    }
}

/// The smallest `record_max_bytes`: below it a file would rotate on every frame.
const MIN_RECORD_BYTES: u64 = 64 * 1024;

/// `must be greater than 0` for each of `durations` that is zero.
pub fn zero_durations<const N: usize>(durations: [(&str, Duration); N]) -> Vec<FieldError> {
    durations
        .into_iter()
        .filter(|(_, value)| value.is_zero())
        .map(|(field, _)| FieldError::new(field, "must be greater than 0"))
        .collect()
}

/// `must be at least 1` for each of `counts` that is zero.
pub fn zero_counts<const N: usize>(counts: [(&str, u64); N]) -> Vec<FieldError> {
    counts
        .into_iter()
        .filter(|(_, value)| *value == 0)
        .map(|(field, _)| FieldError::new(field, "must be at least 1"))
        .collect()
}
