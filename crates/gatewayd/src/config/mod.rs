//! gatewayd configuration: TOML with `deny_unknown_fields`, every field defaulted, validated as a
//! whole before anything is put in force. The annotated reference is `config/gatewayd.toml`.
//!
//! Each section checks its own fields and reports [`FieldError`]s relative to itself;
//! [`Config::problems`] puts the section's name in front. [`server`] is `[server]` grouped by
//! role; [`sections`] the small sections (`[routing]`, `[policy]`, `[picker]`, `[health]`,
//! `[telemetry]`, `[log]`); [`load_section`] `[load]` (which load the rule reads, and how workers
//! are scraped); [`worker`] one worker entry and its parsed URL; [`members`] the worker list
//! checked as a whole (clashes, aliases, loops, what the picker can name); [`alias`] the canonical
//! backend a URL reaches; [`discovery`] one DNS discovery source; [`millis`] the `_ms` keys as
//! `Duration`s; [`upstream`] `[upstream.tls]`, TLS toward `https://` workers; [`field_error`] the
//! one shape of a field's problem; [`runtime`] the per-request
//! settings derived from a whole configuration; [`diff`] what a reload changed, for its log line;
//! [`persist`] the configuration in force as TOML; [`token_file`] the one reader of token files.
//!
//! Adding a setting: its field (with its doc and default) in its section, its check in the
//! section's `problems`, its line in docs/configuration.md and config/gatewayd.toml, its test.
//! A `[server]` key also gets its line in the flat `ServerKeys` table and its two conversions.

pub mod alias;
pub mod diff;
pub mod discovery;
pub mod field_error;
pub mod load_section;
pub mod members;
pub mod millis;
pub mod models;
pub mod persist;
pub mod runtime;
pub mod sections;
pub mod server;
pub mod tls;
pub mod token_file;
pub mod upstream;
pub mod worker;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;

use bch_core::admission::{AdmissionPatch, AdmissionSettings};
use bch_core::policy::PolicySettings;
use serde::{Deserialize, Serialize};

pub use discovery::{DiscoveryConfig, DnsKind};
pub use field_error::FieldError;
pub use load_section::LoadConfig;
pub use sections::{
    DEFAULT_POLICY_KIND, HealthConfig, LogConfig, LogFormat, MAX_PICKER_FALLBACKS, PickerConfig,
    PolicyConfig, RoutingConfig, TelemetryConfig,
};
pub use server::{ControlAccess, Limits, Listeners, ServerConfig, Timeouts};
pub use tls::{ControlConfig, ListenerTls, TlsListener};
pub use upstream::{UpstreamConfig, UpstreamTlsConfig};
pub use worker::{
    MAX_WORKER_NAME_CHARS, Member, WorkerConfig, WorkerUrl, WorkerUrlError, check_name,
};

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
    /// The control plane's own listener settings (its TLS).
    pub control: ControlConfig,
    /// Routing header names.
    pub routing: RoutingConfig,
    /// Policy and thresholds.
    pub policy: PolicyConfig,
    /// Which load the rule reads, and how workers' own gauges are scraped.
    pub load: LoadConfig,
    /// `[admission]`: capacity per worker, engine-reported saturation, the gateway's queue
    /// (docs/overload.md). Read strictly (an unknown key is an error, like every section);
    /// unset fields keep their defaults.
    #[serde(deserialize_with = "strict_admission")]
    pub admission: AdmissionSettings,
    /// Active health probes.
    pub health: HealthConfig,
    /// Websocket telemetry.
    pub telemetry: TelemetryConfig,
    /// Log format and filter.
    pub log: LogConfig,
    /// Envoy's endpoint picker (ext_proc over gRPC).
    pub picker: PickerConfig,
    /// `[upstream]`: how workers are reached (TLS toward `https://` workers).
    pub upstream: UpstreamConfig,
    /// Workers, in configuration order (the order target-worker indices refer to).
    pub workers: Vec<WorkerConfig>,
    /// DNS names whose records are more workers, after the static ones (docs/discovery.md).
    pub discovery: Vec<DiscoveryConfig>,
}

impl Config {
    /// The router's policy settings: `[policy]`, `[load] source` and `[admission]`.
    pub fn policy_settings(&self) -> PolicySettings {
        PolicySettings {
            kind: self.policy.kind,
            min_load_gap: self.policy.min_load_gap,
            max_load_skew: self.policy.max_load_skew,
            spill_order: self.policy.spill_order,
            virtual_nodes: self.policy.virtual_nodes,
            load_source: self.load.source,
            admission: self.admission,
        }
    }

    /// Puts `settings` in force in this configuration: `[policy]`, `[load] source` and
    /// `[admission]`.
    pub fn set_policy_settings(&mut self, settings: PolicySettings) {
        self.policy.kind = settings.kind;
        self.policy.min_load_gap = settings.min_load_gap;
        self.policy.max_load_skew = settings.max_load_skew;
        self.policy.spill_order = settings.spill_order;
        self.policy.virtual_nodes = settings.virtual_nodes;
        self.load.source = settings.load_source;
        self.admission = settings.admission;
    }
}

impl Config {
    /// `listener`'s TLS settings in force, and whether they are `[server.tls]`'s (inherited by
    /// the control plane and the picker when they have no override); `None` = plain.
    pub fn listener_tls(&self, listener: TlsListener) -> Option<(&ListenerTls, bool)> {
        let own = match listener {
            TlsListener::Data => None,
            TlsListener::Control => self.control.tls.as_ref(),
            TlsListener::Picker => self.picker.tls.as_ref(),
        };
        own.map(|tls| (tls, false))
            .or_else(|| self.server.tls.as_ref().map(|tls| (tls, true)))
    }
}

/// `[admission]` read as the strict patch the admin API takes (same names, unknown keys refused),
/// every unset field at its default. Not validated here: [`Config::problems`] reports the values.
fn strict_admission<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<AdmissionSettings, D::Error> {
    let set = AdmissionPatch::deserialize(deserializer)?;
    let default = AdmissionSettings::default();
    Ok(AdmissionSettings {
        max_in_flight_per_worker: set
            .max_in_flight_per_worker
            .unwrap_or(default.max_in_flight_per_worker),
        queue_timeout_ms: set.queue_timeout_ms.unwrap_or(default.queue_timeout_ms),
        max_queued: set.max_queued.unwrap_or(default.max_queued),
        retry_after_ms: set.retry_after_ms.unwrap_or(default.retry_after_ms),
        max_waiting: set.max_waiting.unwrap_or(default.max_waiting),
        max_kv_usage: set.max_kv_usage.unwrap_or(default.max_kv_usage),
    })
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
    #[error("invalid config{}: {error}", .path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Invalid {
        /// File, when loaded from one.
        path: Option<PathBuf>,
        /// The field, its dotted path from the top (`policy.max_load_skew`, `workers[2].url`), and
        /// what is wrong.
        error: FieldError,
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

    /// Every problem of this configuration, section by section, each naming its field (and
    /// `path`, the file it came from, when given): an operator fixes them all in one pass.
    pub fn problems(&self, path: Option<&Path>) -> Vec<ConfigError> {
        self.problems_and_members(path).0
    }

    /// [`Config::problems`] and the members of the worker list that passed (with no problem,
    /// what [`Config::members`] returns): start-up parses 10,000 workers once, not twice.
    pub(crate) fn problems_and_members(
        &self,
        path: Option<&Path>,
    ) -> (Vec<ConfigError>, Vec<Member>) {
        let mut problems: Vec<FieldError> = Vec::new();
        let mut section = |name: &str, found: Vec<FieldError>| {
            problems.extend(found.into_iter().map(|e| e.within(name)));
        };
        let admission = self.admission;
        section(
            "admission",
            admission
                .validate()
                .err()
                .map(|e| FieldError::new(e.field(), e.to_string()))
                .into_iter()
                .collect(),
        );
        let policy = PolicySettings {
            // Reported under `admission` above.
            admission: AdmissionSettings::default(),
            ..self.policy_settings()
        };
        section(
            "policy",
            policy
                .validate()
                .err()
                .map(FieldError::from)
                .into_iter()
                .collect(),
        );
        section("routing", self.routing.problems());
        section("health", self.health.problems());
        section("telemetry", self.telemetry.problems());
        section("server", self.server.problems());
        if let Some(tls) = &self.control.tls {
            section("control.tls", tls.problems());
        }
        section("load", self.load.validate().err().into_iter().collect());
        section("picker", self.picker.problems());
        section("upstream", self.upstream.tls.problems());
        section("log", self.log.problems());
        if !self.server.listeners.data_plane && self.picker.listen.is_none() {
            problems.push(FieldError::new(
                "server.data_plane",
                "false needs [picker] listen: there would be nothing to serve",
            ));
        }
        let (members, worker_problems) = self.collect_members();
        problems.extend(worker_problems);
        // Every worker the picker could not name, under its index in the file (one that is
        // invalid already was reported above). Only with the picker on: a second parse of every
        // worker is a noticeable part of starting a large fleet.
        if self.picker.listen.is_some() {
            let parsed: Vec<(usize, Member)> = (self.workers.iter().enumerate())
                .filter_map(|(index, worker)| Some((index, worker.member().ok()?)))
                .collect();
            problems.extend(self.picker_worker_problems(parsed.iter().map(|(i, m)| (*i, m))));
        }
        problems.extend(self.discovery_problems());
        problems.extend(self.model_problems());
        let problems = (problems.into_iter())
            .map(|error| ConfigError::Invalid {
                path: path.map(Path::to_owned),
                error,
            })
            .collect();
        (problems, members)
    }

    /// Every problem of the `[[discovery]]` entries (each entry's fields, a name discovered
    /// twice); each names the entry and field, e.g. `discovery[1].port`.
    fn discovery_problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        for (index, source) in self.discovery.iter().enumerate() {
            let entry = format!("discovery[{index}]");
            if let Err(e) = source.validate() {
                problems.push(e.within(&entry));
            }
            let name = source.canonical_name();
            if self.discovery[..index]
                .iter()
                .any(|earlier| earlier.canonical_name() == name)
            {
                problems.push(
                    FieldError::new(
                        "dns",
                        format!("{:?} is discovered twice; one entry per name", source.dns),
                    )
                    .within(&entry),
                );
            }
        }
        problems
    }

    /// The path a worker is probed at: its own `health_path` when it has one, else `[health] path`.
    pub fn probe_path<'a>(&'a self, worker_health_path: Option<&'a str>) -> &'a str {
        worker_health_path.unwrap_or(&self.health.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bch_core::policy::{PolicyKind, SpillOrder};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "test.toml".into(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn admission_is_strict_defaults_what_is_unset_and_reaches_the_policy_and_workers() {
        let config = parse(
            "[admission]\nmax_in_flight_per_worker = 4\nqueue_timeout_ms = 250\n\n\
             [[workers]]\nurl = \"http://10.0.0.1:80\"\nmax_in_flight = 0\n\n\
             [[workers]]\nurl = \"http://10.0.0.2:80\"\n",
        )
        .unwrap();
        let admission = config.policy_settings().admission;
        assert_eq!(admission.max_in_flight_per_worker, 4);
        assert_eq!(admission.queue_timeout_ms, 250);
        assert_eq!(
            admission.max_queued, 1024,
            "unset fields keep their defaults"
        );
        let members = config.members().unwrap();
        assert_eq!(members[0].spec.max_in_flight, Some(0));
        assert_eq!(members[1].spec.max_in_flight, None);
        let unknown = parse("[admission]\nmax_inflight = 4\n").unwrap_err();
        assert!(unknown.to_string().contains("max_inflight"), "{unknown}");
        let invalid = parse("[admission]\nmax_kv_usage = 1.5\n").unwrap_err();
        assert!(
            invalid.to_string().contains("admission.max_kv_usage"),
            "{invalid}"
        );
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
    fn a_log_line_budget_of_nothing_is_refused() {
        let config: Config =
            toml::from_str("[log]\nstate_change_lines = 0\nstate_change_period_ms = 0\n").unwrap();
        let problems: Vec<String> = config
            .problems(None)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(
            problems[0].contains("log.state_change_lines"),
            "{problems:#?}"
        );
        assert!(
            problems[1].contains("log.state_change_period_ms"),
            "{problems:#?}"
        );
        let budget =
            parse("[log]\nstate_change_lines = 2\nstate_change_period_ms = 500\n").unwrap();
        assert_eq!(
            budget.log.state_change_period,
            std::time::Duration::from_millis(500)
        );
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
            ("[[workers]]\nurl = \"ftp://a:1\"\n", "workers[0].url"),
            (
                "[[workers]]\nurl = \"http://a:1\"\nserver_name = \"a\"\n",
                "workers[0].server_name",
            ),
            (
                "[upstream.tls]\nclient_cert_file = \"c.pem\"\n",
                "upstream.tls.client_key_file",
            ),
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
                "[load]\nmax_scrapes_per_second = 0\n",
                "load.max_scrapes_per_second",
            ),
            (
                "[load]\nmax_concurrent_scrapes = 0\n",
                "load.max_concurrent_scrapes",
            ),
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

    #[test]
    fn the_control_plane_and_the_picker_inherit_server_tls_unless_they_override_it() {
        let config: Config = toml::from_str(
            "[server.tls]\ncert_file = \"s.crt\"\nkey_file = \"s.key\"\n\
             [picker.tls]\ncert_file = \"p.crt\"\nkey_file = \"p.key\"\nclient_ca_file = \"ca.crt\"\n",
        )
        .unwrap();
        let (data, inherited) = config.listener_tls(TlsListener::Data).unwrap();
        assert_eq!(
            (data.cert_file.as_path(), inherited),
            (Path::new("s.crt"), true)
        );
        let (control, inherited) = config.listener_tls(TlsListener::Control).unwrap();
        assert_eq!(
            (control.cert_file.as_path(), inherited),
            (Path::new("s.crt"), true)
        );
        assert_eq!(control.client_ca(), None);
        let (picker, inherited) = config.listener_tls(TlsListener::Picker).unwrap();
        assert_eq!(
            (picker.cert_file.as_path(), inherited),
            (Path::new("p.crt"), false)
        );
        assert_eq!(picker.client_ca(), Some(Path::new("ca.crt")));
        assert!(
            Config::default()
                .listener_tls(TlsListener::Control)
                .is_none()
        );
        let written = toml::to_string(&config).unwrap();
        assert_eq!(toml::from_str::<Config>(&written).unwrap(), config);
    }

    #[test]
    fn tls_without_a_certificate_or_key_is_refused_naming_the_key() {
        let config: Config =
            toml::from_str("[control.tls]\ncert_file = \"c.crt\"\nclient_ca_file = \"\"\n")
                .unwrap();
        let problems: Vec<String> = config
            .problems(None)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].contains("control.tls.key_file"),
            "{problems:#?}"
        );
    }
}
