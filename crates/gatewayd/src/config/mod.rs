//! gatewayd configuration: TOML with `deny_unknown_fields`, every field defaulted, validated as a
//! whole before anything is put in force. The annotated reference is `config/gatewayd.toml`.
//!
//! [`worker`] holds one worker entry and its parsed URL; [`alias`] the canonical backend a URL
//! reaches; [`load`] the `[load]` section (which load the rule reads, and how workers are
//! scraped); [`discovery`] one DNS discovery source; [`runtime`] the per-request settings derived
//! from a whole configuration; [`diff`] what a reload changed, for its log line; [`persist`] the
//! configuration in force as TOML.

pub mod alias;
pub mod diff;
pub mod discovery;
pub mod load;
pub mod millis;
pub mod persist;
pub mod runtime;
pub mod server;
pub mod worker;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use bch_core::policy::{
    DEFAULT_MAX_LOAD_SKEW, DEFAULT_MIN_LOAD_GAP, DEFAULT_VIRTUAL_NODES, PolicyKind, PolicySettings,
    SpillOrder,
};
use bch_core::router::WorkerSpec;
use bch_core::routing_key::{DEFAULT_ROUTING_KEY_HEADER, DEFAULT_TARGET_WORKER_HEADER};
use serde::{Deserialize, Serialize};

pub use discovery::{DiscoveryConfig, DiscoveryError, DnsKind};
pub use load::LoadConfig;
pub use server::{ControlAccess, Limits, Listeners, ServerConfig, Timeouts};
pub use worker::{Member, WorkerConfig, WorkerError, WorkerUrl, WorkerUrlError};

/// The policy a gateway runs when its configuration names none: strict `consistent_hashing`. The
/// bounded policy is opt-in because a spill gives up KV-cache locality (docs/policy.md). bch-core's
/// own `PolicySettings::default()` is the bounded policy, the one `explain` and the drills study.
pub const DEFAULT_POLICY_KIND: PolicyKind = PolicyKind::ConsistentHashing;

/// The configuration in force, shared by its one writer (the admin owner) and its readers (health
/// probes, the control plane): a lock-free load.
pub type SharedConfig = Arc<ArcSwap<Config>>;

/// The membership in force, static and discovered workers merged, shared by its one writer (the
/// admin owner) and its reader (health probes): a lock-free load.
pub type SharedMembers = Arc<ArcSwap<Vec<Member>>>;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listeners, control access, limits and timeouts.
    pub server: ServerConfig,
    /// Routing header names.
    pub routing: RoutingConfig,
    /// Policy and thresholds.
    pub policy: PolicyConfig,
    /// Which load the rule reads, and how workers' own gauges are scraped.
    pub load: LoadConfig,
    /// Active health probes.
    pub health: HealthConfig,
    /// Websocket telemetry.
    pub telemetry: TelemetryConfig,
    /// Log format and filter.
    pub log: LogConfig,
    /// Envoy's endpoint picker (ext_proc over gRPC).
    pub picker: PickerConfig,
    /// Workers, in configuration order (the order target-worker indices refer to).
    pub workers: Vec<WorkerConfig>,
    /// DNS names whose records are more workers, after the static ones (docs/discovery.md).
    pub discovery: Vec<DiscoveryConfig>,
}

/// `[routing]`: which headers carry routing keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Header carrying the explicit routing key (case-insensitive; default `x-smg-routing-key`).
    pub routing_key_header: String,
    /// Header pinning a request to one worker by name, URL or index (case-insensitive; default
    /// `x-smg-target-worker`).
    pub target_worker_header: String,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            routing_key_header: DEFAULT_ROUTING_KEY_HEADER.to_owned(),
            target_worker_header: DEFAULT_TARGET_WORKER_HEADER.to_owned(),
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

impl Config {
    /// The router's policy settings: `[policy]` plus `[load] source`.
    pub fn policy_settings(&self) -> PolicySettings {
        PolicySettings {
            kind: self.policy.kind,
            min_load_gap: self.policy.min_load_gap,
            max_load_skew: self.policy.max_load_skew,
            spill_order: self.policy.spill_order,
            virtual_nodes: self.policy.virtual_nodes,
            load_source: self.load.source,
        }
    }

    /// Puts `settings` in force in this configuration: `[policy]` and `[load] source`.
    pub fn set_policy_settings(&mut self, settings: PolicySettings) {
        self.policy.kind = settings.kind;
        self.policy.min_load_gap = settings.min_load_gap;
        self.policy.max_load_skew = settings.max_load_skew;
        self.policy.spill_order = settings.spill_order;
        self.policy.virtual_nodes = settings.virtual_nodes;
        self.load.source = settings.load_source;
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
    /// default) serves no picker. Every worker must then be an `http://IP:PORT` URL.
    pub listen: Option<SocketAddr>,
    /// How many fallback endpoints, in ring order from the key, follow the chosen one in the
    /// answer (0..=8); Envoy retries a failed connect on them in turn. `gatewayd envoy-config`
    /// sets Envoy's retry count to this.
    pub fallbacks: usize,
}

impl Default for PickerConfig {
    fn default() -> Self {
        Self {
            listen: None,
            fallbacks: 2,
        }
    }
}

/// `[health]`: active probes of every worker, and passive marking on connect failures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Probe path appended to each worker URL (a worker may override it).
    pub path: String,
    /// `interval_ms`: time between probes of one worker.
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
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            max_keys: 256,
            redact_keys: false,
            max_spill_events: 200,
            client_queue: 64,
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
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

/// A configuration error, naming the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {cause}")]
    Read {
        /// The configuration file that could not be read.
        path: PathBuf,
        /// Cause. Part of the message, deliberately not the error's `source()`, so `{:#}` chains
        /// print it once.
        cause: std::io::Error,
    },
    /// TOML syntax, unknown field or wrong type (the message gives line, column and key).
    #[error("invalid config {path}: {message}")]
    Parse {
        /// The configuration file that does not parse.
        path: PathBuf,
        /// toml's message with line and key.
        message: String,
    },
    /// A value out of range or inconsistent.
    #[error("invalid config{}: {field}: {message}", .path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Invalid {
        /// File, when loaded from one.
        path: Option<PathBuf>,
        /// Dotted field path, e.g. `policy.max_load_skew` or `workers[2].url`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// Reads and parses a configuration file without validating it (see [`Config::problems`]).
    pub fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.to_owned(),
            cause,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })
    }

    /// Reads, parses and validates a configuration file; the first problem is the error.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let config = Config::read(path)?;
        match config.problems(Some(path)).into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(config),
        }
    }

    /// Checks every value; the first problem is returned, naming its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.problems(None).into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    }

    /// Every problem of this configuration, in field order, each naming its field (and `path`,
    /// the file it came from, when given): an operator fixes them all in one pass.
    pub fn problems(&self, path: Option<&Path>) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        let mut invalid = |field: &str, message: String| {
            problems.push(ConfigError::Invalid {
                path: path.map(Path::to_owned),
                field: field.to_owned(),
                message,
            })
        };
        if let Err(e) = self.policy_settings().validate() {
            let field = if matches!(e, bch_core::policy::PolicyError::InvalidSkew(_)) {
                "policy.max_load_skew"
            } else {
                "policy.virtual_nodes"
            };
            invalid(field, e.to_string());
        }
        for (field, name) in [
            (
                "routing.routing_key_header",
                &self.routing.routing_key_header,
            ),
            (
                "routing.target_worker_header",
                &self.routing.target_worker_header,
            ),
        ] {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                invalid(field, format!("{name:?} is not a valid header name"));
            }
        }
        if !self.health.path.starts_with('/') {
            invalid("health.path", "must start with '/'".into());
        }
        let server_timeouts = self
            .server
            .timeouts
            .required()
            .map(|(key, value)| (format!("server.{key}"), value));
        for (field, value) in [
            ("health.interval_ms".to_owned(), self.health.interval),
            ("health.timeout_ms".to_owned(), self.health.timeout),
            ("telemetry.interval_ms".to_owned(), self.telemetry.interval),
        ]
        .into_iter()
        .chain(server_timeouts)
        {
            if value.is_zero() {
                invalid(&field, "must be greater than 0".into());
            }
        }
        for (field, value) in [
            (
                "health.unhealthy_threshold",
                u64::from(self.health.unhealthy_threshold),
            ),
            (
                "health.healthy_threshold",
                u64::from(self.health.healthy_threshold),
            ),
            ("telemetry.client_queue", self.telemetry.client_queue as u64),
            (
                "server.max_connections",
                self.server.limits.max_connections as u64,
            ),
        ] {
            if value == 0 {
                invalid(field, "must be at least 1".into());
            }
        }
        if let Some(clash) = self.server.listeners_clash() {
            invalid("server.control_listen", clash);
        }
        let access = &self.server.control_access;
        if access.metrics_token_file.is_some() && access.admin_token_file.is_none() {
            invalid(
                "server.metrics_token_file",
                "needs server.admin_token_file: without it the control plane is open and a metrics token protects nothing".into(),
            );
        }
        for (index, host) in access.allowed_hosts.iter().enumerate() {
            if host.is_empty() || host.contains(['/', ' ', '@']) {
                invalid(
                    &format!("server.control_allowed_hosts[{index}]"),
                    format!("{host:?} is not a host name (write it without scheme or path)"),
                );
            }
        }
        for (index, origin) in access.allowed_origins.iter().enumerate() {
            if !is_origin(origin) {
                invalid(
                    &format!("server.control_allowed_origins[{index}]"),
                    format!("{origin:?} is not an origin: write scheme://host[:port], no path"),
                );
            }
        }
        if let Err((field, message)) = self.load.validate() {
            invalid(&format!("load.{field}"), message);
        }
        if self.picker.fallbacks > MAX_PICKER_FALLBACKS {
            invalid(
                "picker.fallbacks",
                format!("must be at most {MAX_PICKER_FALLBACKS}"),
            );
        }
        if !self.server.listeners.data_plane && self.picker.listen.is_none() {
            invalid(
                "server.data_plane",
                "false needs [picker] listen: there would be nothing to serve".into(),
            );
        }
        let (members, worker_problems) = self.collect_members();
        let picker_problem = self.picker_workers(&members).err();
        problems.extend(
            worker_problems
                .into_iter()
                .chain(picker_problem)
                .chain(self.discovery_problems())
                .map(|e| match e {
                    ConfigError::Invalid { field, message, .. } => ConfigError::Invalid {
                        path: path.map(Path::to_owned),
                        field,
                        message,
                    },
                    other => other,
                }),
        );
        problems
    }

    /// With the endpoint picker on, every worker must be an `http://IP:PORT` URL: Envoy finds the
    /// picked endpoint among its cluster's hosts by address. The error names `workers[N].url`.
    pub fn picker_workers(&self, members: &[Member]) -> Result<(), ConfigError> {
        if self.picker.listen.is_none() {
            return Ok(());
        }
        for (index, member) in members.iter().enumerate() {
            member
                .url
                .picker_endpoint()
                .map_err(|message| ConfigError::Invalid {
                    path: None,
                    field: format!("workers[{index}].url"),
                    message: format!("worker {}: {message}", member.spec.name),
                })?;
        }
        Ok(())
    }

    /// Every problem of the `[[discovery]]` entries (each entry's fields, a name discovered
    /// twice); each names the entry and field, e.g. `discovery[1].port`.
    fn discovery_problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        for (index, source) in self.discovery.iter().enumerate() {
            let invalid = |field: &str, message: String| ConfigError::Invalid {
                path: None,
                field: format!("discovery[{index}].{field}"),
                message,
            };
            if let Err(e) = source.validate() {
                problems.push(invalid(e.field, e.message));
            }
            let name = source.canonical_name();
            if self.discovery[..index]
                .iter()
                .any(|earlier| earlier.canonical_name() == name)
            {
                problems.push(invalid(
                    "dns",
                    format!("{:?} is discovered twice; one entry per name", source.dns),
                ));
            }
        }
        problems
    }

    /// The path a worker is probed at: its own `health_path` when it has one, else `[health] path`.
    pub fn probe_path<'a>(&'a self, worker_health_path: Option<&'a str>) -> &'a str {
        worker_health_path.unwrap_or(&self.health.path)
    }

    /// The worker list validated: names defaulted, URLs parsed, duplicate names, URLs and ring
    /// identities refused, and so is a URL that reaches the same backend as an earlier one (an
    /// alias would give one backend two shares of the ring). The error names the entry and field,
    /// e.g. `workers[2].url`.
    pub fn members(&self) -> Result<Vec<Member>, ConfigError> {
        let (members, problems) = self.collect_members();
        match problems.into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(members),
        }
    }

    /// The valid members and every problem of the worker list. A clash over a name or ring id
    /// the entry did not write (the defaults, derived from the URL) is reported under the entry's
    /// `url`, which is what the operator wrote.
    fn collect_members(&self) -> (Vec<Member>, Vec<ConfigError>) {
        let mut members: Vec<(usize, Member)> = Vec::with_capacity(self.workers.len());
        let mut problems = Vec::new();
        let invalid = |field: String, message: String| ConfigError::Invalid {
            path: None,
            field,
            message,
        };
        for (index, worker) in self.workers.iter().enumerate() {
            let member = match worker.member() {
                Ok(member) => member,
                Err(e) => {
                    problems.push(invalid(format!("workers[{index}].{}", e.field), e.message));
                    continue;
                }
            };
            let spec = &member.spec;
            type Field = fn(&WorkerSpec) -> &str;
            let fields: [(&str, &str, Field, bool); 3] = [
                ("name", &spec.name, |s| &s.name, worker.name.is_none()),
                ("url", &spec.url, |s| &s.url, false),
                (
                    "ring_id",
                    spec.ring_id(),
                    WorkerSpec::ring_id,
                    worker.ring_id.is_none(),
                ),
            ];
            let clash = fields.into_iter().find_map(|(field, value, of, defaulted)| {
                let (other, m) = members.iter().find(|(_, m)| of(&m.spec) == value)?;
                Some(if defaulted {
                    invalid(
                        format!("workers[{index}].url"),
                        format!(
                            "{:?} gets the default {field} {value:?}, already the {field} of workers[{other}] ({:?}); set a distinct {field}",
                            worker.url, m.spec.url
                        ),
                    )
                } else {
                    invalid(
                        format!("workers[{index}].{field}"),
                        format!("duplicate worker {field} {value:?} (also workers[{other}])"),
                    )
                })
            });
            let earlier: Vec<Member> = members.iter().map(|(_, m)| m.clone()).collect();
            let alias = || {
                alias_of(&member, &earlier)
                    .map(|message| invalid(format!("workers[{index}].url"), message))
            };
            match clash.or_else(alias) {
                Some(problem) => problems.push(problem),
                None => members.push((index, member)),
            }
        }
        (members.into_iter().map(|(_, m)| m).collect(), problems)
    }
}

/// `scheme://host[:port]` as a browser sends it in `Origin`.
fn is_origin(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !rest.trim_end_matches('/').is_empty()
        && !rest
            .trim_end_matches('/')
            .contains(['/', '?', '#', '@', ' '])
}

/// Why `member` may not join `members`, when its URL reaches the backend of one of them.
pub fn alias_of(member: &Member, members: &[Member]) -> Option<String> {
    let twin = members
        .iter()
        .find(|m| m.url.backend == member.url.backend)?;
    Some(format!(
        "{:?} reaches the same backend ({}) as worker {:?} ({:?}); one backend registered twice would get two shares of the ring",
        member.spec.url, member.url.backend, twin.spec.name, twin.spec.url
    ))
}

/// Why `member` may not be a worker of a gateway listening on `listeners`: its URL is one of them,
/// so every request routed to it would come back in and loop.
pub fn loop_of(member: &Member, listeners: &[SocketAddr]) -> Option<String> {
    let listener = listeners
        .iter()
        .find(|l| member.url.backend.is_listener(**l))?;
    Some(format!(
        "{:?} is this gateway's own listener {listener}; requests routed to it would loop",
        member.spec.url
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "test.toml".into(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn empty_file_gives_defaults() {
        let config = parse("").unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.policy.kind, PolicyKind::ConsistentHashing);
        assert_eq!(config.policy.spill_order, SpillOrder::Ring);
        let seeded = parse("[policy]\nspill_order = \"hash_seeded\"\n").unwrap();
        assert_eq!(seeded.policy_settings().spill_order, SpillOrder::HashSeeded);
    }

    #[test]
    fn every_problem_is_reported_and_defaulted_names_under_the_url() {
        let config: Config = toml::from_str(
            "[policy]\nmax_load_skew = 0.5\n[health]\ninterval_ms = 0\n\
             [[workers]]\nurl = \"http://h:8000\"\n[[workers]]\nurl = \"http://h:8000/\"\n\
             [[workers]]\nurl = \"ftp://x\"\n",
        )
        .unwrap();
        let problems: Vec<String> = config
            .problems(Some(Path::new("f.toml")))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(
            problems[0].contains("policy.max_load_skew"),
            "{problems:#?}"
        );
        assert!(problems[1].contains("health.interval_ms"), "{problems:#?}");
        assert_eq!(
            problems[2],
            "invalid config f.toml: workers[1].url: \"http://h:8000/\" gets the default name \"h:8000\", already the name of workers[0] (\"http://h:8000\"); set a distinct name"
        );
        assert!(problems[3].contains("workers[2].url"), "{problems:#?}");
        // Port 0 twice is two free ports, not a clash.
        let mut zero = Config::default();
        zero.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
        zero.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
        assert!(zero.problems(None).is_empty());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("[policy]\nmax_load_skew = 0.5\n", "policy.max_load_skew"),
            ("[policy]\nmax_load_skew = nan\n", "policy.max_load_skew"),
            ("[policy]\nmax_load_skew = inf\n", "policy.max_load_skew"),
            ("[policy]\nmin_load_gap = -1\n", "min_load_gap"),
            ("[policy]\nmin_load_gaps = 1\n", "min_load_gaps"),
            ("[policy]\nspill_order = \"next\"\n", "spill_order"),
            ("[[workers]]\nurl = \"not a url\"\n", "workers[0].url"),
            ("[[workers]]\nurl = \"https://a:1\"\n", "workers[0].url"),
            (
                "[[workers]]\nurl = \"http://a:1\"\n[[workers]]\nurl = \"http://a:1\"\n",
                "workers[1].url",
            ),
            (
                "[[workers]]\nname = \"x\"\nurl = \"http://a:1\"\n[[workers]]\nname = \"x\"\nurl = \"http://b:1\"\n",
                "workers[1].name: duplicate worker name \"x\" (also workers[0])",
            ),
            (
                "[server]\nlisten = \"127.0.0.1:9000\"\ncontrol_listen = \"0.0.0.0:9000\"\n",
                "server.control_listen",
            ),
            (
                "[[workers]]\nname = \"x\"\nurl = \"http://a:1\"\n[[workers]]\nname = \"y\"\nurl = \"http://a:1\"\n",
                "workers[1].url",
            ),
            (
                "[[workers]]\nurl = \"http://127.0.0.1:1\"\n[[workers]]\nurl = \"http://localhost:1/\"\n",
                "workers[1].url",
            ),
            ("[server]\nlisten = \"nowhere\"\n", "listen"),
            ("[picker]\nfallbacks = 9\n", "picker.fallbacks"),
            ("[server]\ndata_plane = false\n", "server.data_plane"),
            (
                "[picker]\nlisten = \"127.0.0.1:9002\"\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n[[workers]]\nname = \"gpu-1\"\nurl = \"http://gpu-1.internal:8000\"\n",
                "workers[1].url: worker gpu-1",
            ),
            (
                "[server]\ncontrol_allowed_origins = [\"console.example\"]\n",
                "server.control_allowed_origins[0]",
            ),
            (
                "[server]\ncontrol_allowed_hosts = [\"http://gw\"]\n",
                "server.control_allowed_hosts[0]",
            ),
            (
                "[server]\nrequest_body_timeout_ms = 0\n",
                "server.request_body_timeout_ms",
            ),
            ("[policy\n", "line 1"),
            ("[load]\nsource = \"gpu\"\n", "source"),
            (
                "[load]\nscrape_interval_ms = 0\n",
                "load.scrape_interval_ms",
            ),
            ("[load]\nstale_after_ms = 50\n", "load.stale_after_ms"),
            ("[load]\nmetrics_path = \"metrics\"\n", "load.metrics_path"),
            ("[load]\nrunning_gauge = \"x\"\n", "load.waiting_gauge"),
            (
                "[load]\nrunning_gauge = \"a b\"\nwaiting_gauge = \"c\"\n",
                "load.running_gauge",
            ),
            ("[load]\nmax_scrape_bytes = 0\n", "load.max_scrape_bytes"),
            (
                "[load]\nscrape_interval_ms = 4611686018427387904\nstale_after_ms = 4611686018427387905\n",
                "load.scrape_interval_ms",
            ),
            (
                "[load]\nstale_after_ms = 100000000\n",
                "load.stale_after_ms",
            ),
            (
                "[[workers]]\nurl = \"http://a:1\"\nmetrics_path = \"m\"\n",
                "workers[0].metrics_path",
            ),
            ("[[discovery]]\ndns = \"llm.test\"\n", "discovery[0].port"),
            (
                "[[discovery]]\ndns = \"_h._tcp.a\"\n[[discovery]]\ndns = \"_H._tcp.a.\"\n",
                "discovery[1].dns",
            ),
            ("[[discovery]]\ndns = \"_h._tcp.a\"\nttl = 1\n", "ttl"),
        ];
        for (text, needle) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(
                err.contains(needle),
                "{text:?} gave {err:?}, expected {needle:?}"
            );
        }
    }
}
