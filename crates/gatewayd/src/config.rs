//! gatewayd configuration: TOML with `deny_unknown_fields`, every field defaulted, validated as a
//! whole before anything is put in force. The annotated reference is `config/gatewayd.toml`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bch_core::policy::{
    DEFAULT_MAX_LOAD_SKEW, DEFAULT_MIN_LOAD_GAP, DEFAULT_VIRTUAL_NODES, PolicyKind, PolicySettings,
};
use bch_core::router::WorkerSpec;
use bch_core::routing_key::{DEFAULT_ROUTING_KEY_HEADER, DEFAULT_TARGET_WORKER_HEADER};
use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listeners, limits and timeouts.
    pub server: ServerConfig,
    /// Routing header names.
    pub routing: RoutingConfig,
    /// Policy and thresholds.
    pub policy: PolicyConfig,
    /// Active health probes.
    pub health: HealthConfig,
    /// Websocket telemetry.
    pub telemetry: TelemetryConfig,
    /// Logging.
    pub log: LogConfig,
    /// Workers, in configuration order (the order target-worker indices refer to).
    pub workers: Vec<WorkerConfig>,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Data plane listen address.
    pub listen: SocketAddr,
    /// Control plane listen address (metrics, admin API, websocket).
    pub control_listen: SocketAddr,
    /// File holding the bearer token for the control plane; empty = no auth (loopback only).
    pub admin_token_file: Option<PathBuf>,
    /// Largest request body accepted, bytes; larger gets 413.
    pub max_body_bytes: u64,
    /// Most concurrent data plane connections; beyond it new connections get a 503 and are closed.
    pub max_connections: usize,
    /// Time a client has to send its request headers, ms (slow-loris protection).
    pub header_read_timeout_ms: u64,
    /// Time to connect to a worker, ms; a failed connect is retried once on the next worker.
    pub connect_timeout_ms: u64,
    /// Time the worker has to send response headers, ms; then 504. LLM prefill of a long prompt on a
    /// busy worker can take a while, so the default is generous.
    pub first_byte_timeout_ms: u64,
    /// Longest silence between two chunks of a streamed response body, ms; then the stream is ended
    /// (with an SSE error event for event streams).
    pub stream_idle_timeout_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight streams may run before the process exits, ms.
    pub shutdown_grace_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("valid"),
            control_listen: "127.0.0.1:9090".parse().expect("valid"),
            admin_token_file: None,
            max_body_bytes: 32 * 1024 * 1024,
            max_connections: 10_000,
            header_read_timeout_ms: 10_000,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 300_000,
            stream_idle_timeout_ms: 300_000,
            shutdown_grace_ms: 30_000,
        }
    }
}

/// `[routing]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Explicit routing key header.
    pub routing_key_header: String,
    /// Target worker header.
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

/// `[policy]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Policy kind. Default `consistent_hashing`: the bounded policy is opt-in (DESIGN.md §5)
    /// because a spill gives up KV-cache locality.
    pub kind: PolicyKind,
    /// Requests (integer ≥ 0).
    pub min_load_gap: u64,
    /// Factor (finite, ≥ 1.0).
    pub max_load_skew: f64,
    /// Points per worker on the ring; 150 gives placement parity with SGLang Model Gateway.
    pub virtual_nodes: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            kind: PolicyKind::ConsistentHashing,
            min_load_gap: DEFAULT_MIN_LOAD_GAP,
            max_load_skew: DEFAULT_MAX_LOAD_SKEW,
            virtual_nodes: DEFAULT_VIRTUAL_NODES,
        }
    }
}

impl PolicyConfig {
    /// As core settings.
    pub fn settings(&self) -> PolicySettings {
        PolicySettings {
            kind: self.kind,
            min_load_gap: self.min_load_gap,
            max_load_skew: self.max_load_skew,
            virtual_nodes: self.virtual_nodes,
        }
    }
}

/// `[health]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Probe path appended to each worker URL (a worker may override it).
    pub path: String,
    /// Time between probes of one worker, ms.
    pub interval_ms: u64,
    /// Probe timeout, ms.
    pub timeout_ms: u64,
    /// Consecutive failures before a worker is marked unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successes before an unhealthy worker is marked healthy again.
    pub healthy_threshold: u32,
    /// Mark a worker unhealthy at once when a connection to it fails (probes bring it back).
    pub passive: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            path: "/health".to_owned(),
            interval_ms: 2_000,
            timeout_ms: 1_000,
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            passive: true,
        }
    }
}

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Tick interval, ms.
    pub interval_ms: u64,
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
            interval_ms: 100,
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

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Output format.
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

/// One `[[workers]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Unique name; defaults to the URL's `host:port`.
    #[serde(default)]
    pub name: Option<String>,
    /// Base URL, `http://host:port` with an optional path prefix.
    pub url: String,
    /// Ring identity; defaults to the URL exactly as written (SGLang Model Gateway parity).
    #[serde(default)]
    pub ring_id: Option<String>,
    /// Health probe path for this worker (llama.cpp's server has no `/health`; use `/v1/models`).
    #[serde(default)]
    pub health_path: Option<String>,
}

/// A configuration error, naming the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {cause}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause. Part of the message, deliberately not the error's `source()`, so `{:#}` chains
        /// print it once.
        cause: std::io::Error,
    },
    /// TOML syntax, unknown field or wrong type (the message gives line, column and key).
    #[error("invalid config {path}: {message}")]
    Parse {
        /// File.
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

/// A worker's URL split into the parts the proxy needs, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerUrl {
    /// `http`.
    pub scheme: Scheme,
    /// `host:port`.
    pub authority: Authority,
    /// Path prefix without a trailing slash (usually empty).
    pub prefix: String,
}

impl WorkerUrl {
    /// Parses and checks a worker URL: `http` scheme, a host, no query or fragment.
    pub fn parse(url: &str) -> Result<WorkerUrl, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| format!("{url:?} has no scheme; write http://host:port"))?;
        if scheme != Scheme::HTTP {
            return Err(format!(
                "{url:?}: only http:// workers are supported (terminate TLS in front of gatewayd's upstreams)"
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("{url:?} has no host"))?;
        if authority.host().is_empty() {
            return Err(format!("{url:?} has no host"));
        }
        if uri.query().is_some() {
            return Err(format!("{url:?} must not have a query"));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(WorkerUrl {
            scheme,
            authority,
            prefix,
        })
    }

    /// The upstream URI for a request path and query.
    pub fn join(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let pq = path_and_query.map(PathAndQuery::as_str).unwrap_or("/");
        let builder = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone());
        if self.prefix.is_empty() {
            builder.path_and_query(pq).build()
        } else {
            builder
                .path_and_query(format!("{}{}", self.prefix, pq))
                .build()
        }
    }

    /// Default worker name: `host:port`.
    pub fn default_name(&self) -> String {
        self.authority.as_str().to_owned()
    }
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.to_owned(),
            cause,
        })?;
        let config: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate().map_err(|e| match e {
            ConfigError::Invalid { field, message, .. } => ConfigError::Invalid {
                path: Some(path.to_owned()),
                field,
                message,
            },
            other => other,
        })?;
        Ok(config)
    }

    /// Checks every value; the first problem is returned, naming its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            path: None,
            field: field.to_owned(),
            message,
        };
        self.policy.settings().validate().map_err(|e| {
            let field = if matches!(e, bch_core::policy::PolicyError::InvalidSkew(_)) {
                "policy.max_load_skew"
            } else {
                "policy.virtual_nodes"
            };
            invalid(field, e.to_string())
        })?;
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
            http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(field, format!("{name:?} is not a valid header name")))?;
        }
        if !self.health.path.starts_with('/') {
            return Err(invalid("health.path", "must start with '/'".into()));
        }
        for (field, value) in [
            ("health.interval_ms", self.health.interval_ms),
            ("health.timeout_ms", self.health.timeout_ms),
            ("telemetry.interval_ms", self.telemetry.interval_ms),
            (
                "server.header_read_timeout_ms",
                self.server.header_read_timeout_ms,
            ),
            ("server.connect_timeout_ms", self.server.connect_timeout_ms),
            (
                "server.first_byte_timeout_ms",
                self.server.first_byte_timeout_ms,
            ),
            (
                "server.stream_idle_timeout_ms",
                self.server.stream_idle_timeout_ms,
            ),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be greater than 0".into()));
            }
        }
        for (field, value) in [
            (
                "health.unhealthy_threshold",
                self.health.unhealthy_threshold,
            ),
            ("health.healthy_threshold", self.health.healthy_threshold),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be at least 1".into()));
            }
        }
        if self.telemetry.client_queue == 0 {
            return Err(invalid(
                "telemetry.client_queue",
                "must be at least 1".into(),
            ));
        }
        if self.server.max_connections == 0 {
            return Err(invalid(
                "server.max_connections",
                "must be at least 1".into(),
            ));
        }
        self.worker_specs()?;
        Ok(())
    }

    /// The worker list as core specs (names defaulted, URLs checked, duplicates refused).
    pub fn worker_specs(&self) -> Result<Vec<WorkerSpec>, ConfigError> {
        let mut specs: Vec<WorkerSpec> = Vec::with_capacity(self.workers.len());
        for (index, worker) in self.workers.iter().enumerate() {
            let spec = worker
                .spec()
                .map_err(|(field, message)| ConfigError::Invalid {
                    path: None,
                    field: format!("workers[{index}].{field}"),
                    message,
                })?;
            let clash = |field: &str, what: &str| ConfigError::Invalid {
                path: None,
                field: format!("workers[{index}].{field}"),
                message: format!("duplicate worker {what} {:?}", what_value(&spec, field)),
            };
            if specs.iter().any(|s| s.name == spec.name) {
                return Err(clash("name", "name"));
            }
            if specs.iter().any(|s| s.url == spec.url) {
                return Err(clash("url", "url"));
            }
            if specs.iter().any(|s| s.ring_id() == spec.ring_id()) {
                return Err(clash("ring_id", "ring_id"));
            }
            specs.push(spec);
        }
        Ok(specs)
    }

    /// The health path for the worker at `url` (its own `health_path`, else `[health] path`).
    pub fn health_path_for(&self, url: &str) -> &str {
        self.workers
            .iter()
            .find(|w| w.url == url)
            .and_then(|w| w.health_path.as_deref())
            .unwrap_or(&self.health.path)
    }
}

fn what_value<'a>(spec: &'a WorkerSpec, field: &str) -> &'a str {
    match field {
        "name" => &spec.name,
        "url" => &spec.url,
        _ => spec.ring_id(),
    }
}

impl WorkerConfig {
    /// A worker entry for a bare URL (the `--worker` flag and the admin API's minimal body).
    pub fn from_url(url: &str) -> WorkerConfig {
        WorkerConfig {
            name: None,
            url: url.to_owned(),
            ring_id: None,
            health_path: None,
        }
    }

    /// Validates the entry into a core spec; errors name the field.
    pub fn spec(&self) -> Result<WorkerSpec, (&'static str, String)> {
        let parsed = WorkerUrl::parse(&self.url).map_err(|m| ("url", m))?;
        let name = match &self.name {
            Some(name) if name.trim().is_empty() => {
                return Err(("name", "must not be empty".into()));
            }
            Some(name) => name.clone(),
            None => parsed.default_name(),
        };
        if name.len() > 128 || name.chars().any(|c| c.is_control() || c == '/') {
            return Err((
                "name",
                format!(
                    "{name:?} must be at most 128 characters, without '/' or control characters"
                ),
            ));
        }
        if let Some(path) = &self.health_path {
            if !path.starts_with('/') {
                return Err(("health_path", "must start with '/'".into()));
            }
        }
        if let Some(ring_id) = &self.ring_id {
            if ring_id.is_empty() {
                return Err(("ring_id", "must not be empty".into()));
            }
        }
        Ok(WorkerSpec {
            name,
            url: self.url.clone(),
            ring_id: self.ring_id.clone(),
        })
    }
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
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("[policy]\nmax_load_skew = 0.5\n", "policy.max_load_skew"),
            ("[policy]\nmax_load_skew = nan\n", "policy.max_load_skew"),
            ("[policy]\nmax_load_skew = inf\n", "policy.max_load_skew"),
            ("[policy]\nmin_load_gap = -1\n", "min_load_gap"),
            ("[policy]\nmin_load_gaps = 1\n", "min_load_gaps"),
            ("[[workers]]\nurl = \"not a url\"\n", "workers[0].url"),
            ("[[workers]]\nurl = \"https://a:1\"\n", "workers[0].url"),
            (
                "[[workers]]\nurl = \"http://a:1\"\n[[workers]]\nurl = \"http://a:1\"\n",
                "workers[1].name",
            ),
            (
                "[[workers]]\nname = \"x\"\nurl = \"http://a:1\"\n[[workers]]\nname = \"y\"\nurl = \"http://a:1\"\n",
                "workers[1].url",
            ),
            ("[server]\nlisten = \"nowhere\"\n", "listen"),
            ("[policy\n", "line 1"),
        ];
        for (text, needle) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(
                err.contains(needle),
                "{text:?} gave {err:?}, expected {needle:?}"
            );
        }
    }

    #[test]
    fn worker_names_default_to_authority_and_urls_join() {
        let config = parse("[[workers]]\nurl = \"http://10.0.0.7:8000/prefix/\"\n").unwrap();
        let specs = config.worker_specs().unwrap();
        assert_eq!(specs[0].name, "10.0.0.7:8000");
        assert_eq!(specs[0].ring_id(), "http://10.0.0.7:8000/prefix/");
        let url = WorkerUrl::parse(&specs[0].url).unwrap();
        let pq: PathAndQuery = "/v1/models?x=1".parse().unwrap();
        assert_eq!(
            url.join(Some(&pq)).unwrap().to_string(),
            "http://10.0.0.7:8000/prefix/v1/models?x=1"
        );
    }
}
