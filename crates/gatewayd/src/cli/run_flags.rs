//! The proxy's flags ([`RunArgs`]), grouped by the part of the configuration they override, and
//! their one application to a configuration ([`RunArgs::apply`]), at start and on every reload.
//! A new flag goes into its group's struct and that group's `apply`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bch_core::fleet_load::LoadSource;
use bch_core::policy::{PolicyKind, SpillOrder};
use clap::Args;

use super::value_parsers::{parse_addr, parse_load_source, parse_policy, parse_spill_order};
use crate::config::{Config, DiscoveryConfig, DnsKind, LogFormat, WorkerConfig};

/// Options of the proxy. Flags override the configuration file, at start and on every reload.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Configuration file (TOML; see config/gatewayd.toml).
    #[arg(long, short = 'c', env = "GATEWAYD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listeners and the control plane's token: `[server]` and `[picker] listen`.
    #[command(flatten)]
    pub server: ServerFlags,
    /// Workers: static, discovered by DNS, and how they are probed.
    #[command(flatten)]
    pub workers: WorkerFlags,
    /// The routing policy: `[policy]` and `[load] source`.
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// Log format: text for people, json for log shippers.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Run the demo: embedded simulated workers, a gentle background storm, bounded policy.
    #[arg(long)]
    pub demo: bool,
    /// How many simulated workers the demo starts (1 to 64).
    #[arg(long, default_value_t = 4, requires = "demo")]
    pub demo_workers: usize,
}

/// Flags of the listeners and the control plane's token.
#[derive(Debug, Clone, Args)]
pub struct ServerFlags {
    /// Data plane listen address [default: 127.0.0.1:8080].
    #[arg(long, env = "GATEWAYD_LISTEN", value_name = "IP:PORT", value_parser = parse_addr)]
    pub listen: Option<SocketAddr>,
    /// Control plane listen address (metrics, admin API, /ws) [default: 127.0.0.1:9090].
    #[arg(long, env = "GATEWAYD_CONTROL_LISTEN", value_name = "IP:PORT", value_parser = parse_addr)]
    pub control_listen: Option<SocketAddr>,
    /// Serve Envoy's endpoint picker (ext_proc over plaintext gRPC) on this address; workers must
    /// then be http(s)://IP:PORT URLs.
    #[arg(long, env = "GATEWAYD_PICKER_LISTEN", value_name = "IP:PORT", value_parser = parse_addr)]
    pub picker_listen: Option<SocketAddr>,
    /// Serve no data plane: run only as Envoy's endpoint picker (needs --picker-listen).
    #[arg(long)]
    pub no_data_plane: bool,
    /// File holding the control plane's bearer token.
    #[arg(long, env = "GATEWAYD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
}

/// Flags that add workers, find them by DNS, or say how they are probed.
#[derive(Debug, Clone, Args)]
pub struct WorkerFlags {
    /// Worker base URL; repeat for more workers (added after the file's workers, kept on reload).
    #[arg(long = "worker", value_name = "URL")]
    pub workers: Vec<String>,
    /// DNS name whose records are workers: SRV when it begins with '_', else A/AAAA; repeat for
    /// more names (added after the file's [[discovery]] entries, kept on reload).
    #[arg(long = "discover-dns", value_name = "NAME")]
    pub discover_dns: Vec<String>,
    /// The workers' port for the A/AAAA names of --discover-dns (SRV records carry their own).
    #[arg(long, value_name = "PORT", requires = "discover_dns")]
    pub discover_port: Option<u16>,
    /// The DNS server the --discover-dns names are resolved with, as IP:PORT [default: the
    /// system's resolver configuration].
    #[arg(long, value_name = "IP:PORT", value_parser = parse_addr, requires = "discover_dns")]
    pub dns_resolver: Option<SocketAddr>,
    /// Longest time between two resolutions of a --discover-dns name, in milliseconds; an answer
    /// whose TTL runs out sooner is asked again sooner [default: 5000].
    #[arg(long, value_name = "MS", requires = "discover_dns")]
    pub discovery_interval_ms: Option<u64>,
    /// Health probe path for every worker without its own (e.g. /v1/models for llama.cpp).
    #[arg(long)]
    pub health_path: Option<String>,
}

/// Flags of the routing policy.
#[derive(Debug, Clone, Args)]
pub struct PolicyFlags {
    /// Routing policy: consistent_hashing (default), bounded_consistent_hashing, round_robin or
    /// random.
    #[arg(long, value_parser = parse_policy)]
    pub policy: Option<PolicyKind>,
    /// Bounded policy: in-flight requests the preferred worker may exceed the fleet minimum by
    /// before a key can spill.
    #[arg(long)]
    pub min_load_gap: Option<u64>,
    /// Bounded policy: factor over the fleet mean load the preferred worker must exceed before a
    /// key can spill (finite, at least 1.0).
    #[arg(long)]
    pub max_load_skew: Option<f64>,
    /// Bounded policy: where a spilled request goes among the workers under the bound: ring (the
    /// next one clockwise, the default) or hash_seeded (a per-key pseudo-random order).
    #[arg(long, value_parser = parse_spill_order)]
    pub spill_order: Option<SpillOrder>,
    /// Which load the bounded rule reads: local (this process's in-flight requests) or
    /// worker_metrics (the workers' own gauges, so several replicas decide as one).
    #[arg(long, value_parser = parse_load_source)]
    pub load_source: Option<LoadSource>,
}

impl RunArgs {
    /// Refuses flags that make no sense together, naming the flag (the `[[discovery]]` error a
    /// flag would otherwise turn into names a field the operator never wrote).
    pub fn check(&self) -> anyhow::Result<()> {
        if self.workers.discover_port.is_none()
            && let Some(name) = self
                .workers
                .discover_dns
                .iter()
                .find(|n| !n.starts_with('_'))
        {
            anyhow::bail!(
                "--discover-dns {name} is an A/AAAA name: give the workers' port with --discover-port PORT (or use an SRV name, which begins with '_')"
            );
        }
        Ok(())
    }

    /// Overrides the file's values with the flags that were given. Applied to the file at start
    /// and on every reload, so a flag keeps winning over the file after SIGHUP or
    /// `POST /admin/reload`. The `--worker`s are not here: they are pinned workers
    /// ([`WorkerFlags::pinned`]), appended after the overrides.
    pub fn apply(&self, config: &mut Config) {
        self.server.apply(config);
        self.workers.apply(config);
        self.policy.apply(config);
        if let Some(format) = self.log_format {
            config.log.format = format;
        }
    }
}

impl ServerFlags {
    fn apply(&self, config: &mut Config) {
        let listeners = &mut config.server.listeners;
        if let Some(listen) = self.listen {
            listeners.listen = listen;
        }
        if let Some(control) = self.control_listen {
            listeners.control_listen = control;
        }
        if self.no_data_plane {
            listeners.data_plane = false;
        }
        if let Some(picker) = self.picker_listen {
            config.picker.listen = Some(picker);
        }
        if let Some(file) = &self.admin_token_file {
            config.server.control_access.admin_token_file = Some(file.clone());
        }
    }
}

impl WorkerFlags {
    fn apply(&self, config: &mut Config) {
        if let Some(path) = &self.health_path {
            config.health.path = path.clone();
        }
        config.discovery.extend(
            self.discover_dns
                .iter()
                .map(|name| self.discovery_source(name)),
        );
    }

    /// The workers of the `--worker` flags, kept across reloads.
    pub fn pinned(&self) -> Vec<WorkerConfig> {
        self.workers
            .iter()
            .map(|url| WorkerConfig::from_url(url))
            .collect()
    }

    /// The `[[discovery]]` entry of one `--discover-dns NAME`.
    fn discovery_source(&self, name: &str) -> DiscoveryConfig {
        let mut source = DiscoveryConfig::new(name);
        if source.kind() == DnsKind::Address {
            source.port = self.discover_port;
        }
        source.resolver = self.dns_resolver;
        if let Some(interval) = self.discovery_interval_ms {
            source.interval = Duration::from_millis(interval);
        }
        source
    }
}

impl PolicyFlags {
    fn apply(&self, config: &mut Config) {
        let policy = &mut config.policy;
        if let Some(kind) = self.policy {
            policy.kind = kind;
        }
        if let Some(gap) = self.min_load_gap {
            policy.min_load_gap = gap;
        }
        if let Some(skew) = self.max_load_skew {
            policy.max_load_skew = skew;
        }
        if let Some(order) = self.spill_order {
            policy.spill_order = order;
        }
        if let Some(source) = self.load_source {
            config.load.source = source;
        }
    }
}
