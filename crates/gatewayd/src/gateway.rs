//! The running gateway: shared state, start-up and shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use bch_core::router::Router;
use bch_core::routing_key::RoutingHeaders;
use bch_core::telemetry::ChangeSource;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, WorkerConfig};
use crate::metrics::Metrics;
use crate::telemetry::Telemetry;

/// Settings the data path reads per request, derived from the configuration and swapped as a
/// whole on reload.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Routing header names.
    pub routing_headers: RoutingHeaders,
    /// Largest request body, bytes.
    pub max_body_bytes: u64,
    /// Time the worker has to send response headers.
    pub first_byte_timeout: Duration,
    /// Longest silence inside a streamed response body.
    pub stream_idle_timeout: Duration,
    /// Mark workers unhealthy on connect failure.
    pub passive_health: bool,
    /// Show explicit keys hashed in telemetry.
    pub redact_keys: bool,
}

impl RuntimeSettings {
    fn from_config(config: &Config) -> Self {
        Self {
            routing_headers: RoutingHeaders {
                routing_key: config.routing.routing_key_header.to_ascii_lowercase(),
                target_worker: config.routing.target_worker_header.to_ascii_lowercase(),
            },
            max_body_bytes: config.server.max_body_bytes,
            first_byte_timeout: Duration::from_millis(config.server.first_byte_timeout_ms),
            stream_idle_timeout: Duration::from_millis(config.server.stream_idle_timeout_ms),
            passive_health: config.health.passive,
            redact_keys: config.telemetry.redact_keys,
        }
    }
}

/// Changes applied to the configuration file's contents before it is put in force (the command
/// line's flags).
pub type ConfigOverrides = Box<dyn Fn(&mut Config) + Send + Sync>;

/// Shared state of one gateway process.
pub struct Gateway {
    /// Routing table and selection.
    pub router: Arc<Router>,
    /// Per-request settings.
    pub settings: ArcSwap<RuntimeSettings>,
    /// Current configuration (as loaded, plus `--worker` flags and admin API changes to workers).
    pub config: ArcSwap<Config>,
    /// File to re-read on reload; `None` when started without `--config`.
    pub config_path: Option<PathBuf>,
    /// CLI-given workers, kept across reloads.
    pub cli_workers: Vec<WorkerConfig>,
    /// Command-line overrides of file values, re-applied on every reload (set once by the CLI).
    pub config_overrides: OnceLock<ConfigOverrides>,
    /// How requests reach workers: parsed targets of the current membership generation and each
    /// worker's pool of keep-alive connections.
    pub upstreams: crate::upstream::Upstreams,
    /// Data path metrics.
    pub metrics: Arc<Metrics>,
    /// Prometheus registry.
    pub registry: prometheus_client::registry::Registry,
    /// Telemetry hub.
    pub telemetry: Telemetry,
    /// Control plane bearer token.
    pub admin_token: Option<String>,
    /// Serialises membership and reload changes so the config's worker list and the router agree.
    pub admin_lock: Mutex<()>,
    /// Cancelled on shutdown.
    pub shutdown: CancellationToken,
}

/// A started gateway: its bound addresses and a handle to stop it.
pub struct RunningGateway {
    /// Shared state.
    pub gateway: Arc<Gateway>,
    /// Bound data plane address.
    pub data_addr: SocketAddr,
    /// Bound control plane address.
    pub control_addr: SocketAddr,
    tasks: TaskTracker,
    grace: Duration,
}

impl RunningGateway {
    /// Stops accepting, lets in-flight requests finish for up to `shutdown_grace_ms`, then returns.
    pub async fn shutdown(self) {
        self.gateway.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(self.grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms = self.grace.as_millis() as u64,
                "shutdown grace expired with requests still in flight"
            );
        }
    }

    /// Waits until shutdown was requested (signal or token), then shuts down gracefully.
    pub async fn run_until_stopped(self) {
        self.gateway.shutdown.cancelled().await;
        self.shutdown().await;
    }
}

impl Gateway {
    /// Validates `config`, binds both listeners and starts serving, health probes and telemetry.
    pub async fn start(
        config: Config,
        config_path: Option<PathBuf>,
        cli_workers: Vec<WorkerConfig>,
    ) -> anyhow::Result<RunningGateway> {
        let mut config = config;
        config.workers.extend(cli_workers.iter().cloned());
        config.validate()?;
        let admin_token = match &config.server.admin_token_file {
            Some(path) => {
                let token = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read admin_token_file {}", path.display()))?;
                let token = token.trim().to_owned();
                if token.is_empty() {
                    bail!("admin_token_file {} is empty", path.display());
                }
                Some(token)
            }
            None => None,
        };
        if admin_token.is_none() && !config.server.control_listen.ip().is_loopback() {
            bail!(
                "refusing to bind the control plane to {} without a token: set server.admin_token_file or listen on loopback",
                config.server.control_listen
            );
        }
        let router = Arc::new(Router::new(
            config.worker_specs()?,
            config.policy.settings(),
        )?);
        let metrics = Arc::new(Metrics::default());
        let registry = crate::metrics::registry(Arc::clone(&metrics), Arc::clone(&router));
        let shutdown = CancellationToken::new();
        let telemetry = Telemetry::start(
            Arc::clone(&router),
            config.telemetry.clone(),
            Arc::clone(&metrics),
            shutdown.clone(),
        );
        let data_listener = TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("cannot bind data plane {}", config.server.listen))?;
        let control_listener = TcpListener::bind(config.server.control_listen)
            .await
            .with_context(|| {
                format!("cannot bind control plane {}", config.server.control_listen)
            })?;
        let data_addr = data_listener.local_addr()?;
        let control_addr = control_listener.local_addr()?;
        let grace = Duration::from_millis(config.server.shutdown_grace_ms);
        let connect_timeout = Duration::from_millis(config.server.connect_timeout_ms);
        let server_limits = crate::server::Limits::from_config(&config);

        let gateway = Arc::new(Gateway {
            router,
            settings: ArcSwap::from_pointee(RuntimeSettings::from_config(&config)),
            config: ArcSwap::from_pointee(config),
            config_path,
            cli_workers,
            config_overrides: OnceLock::new(),
            upstreams: crate::upstream::Upstreams::new(connect_timeout),
            metrics,
            registry,
            telemetry,
            admin_token,
            admin_lock: Mutex::new(()),
            shutdown: shutdown.clone(),
        });
        let tasks = TaskTracker::new();
        tasks.spawn(crate::server::serve_data_plane(
            data_listener,
            Arc::clone(&gateway),
            server_limits.clone(),
            tasks.clone(),
        ));
        tasks.spawn(crate::server::serve_control_plane(
            control_listener,
            Arc::clone(&gateway),
            server_limits,
            tasks.clone(),
        ));
        tokio::spawn(crate::health::run(Arc::clone(&gateway)));
        tokio::spawn(sweep_idle_connections(Arc::clone(&gateway)));
        tracing::info!(%data_addr, %control_addr, "gatewayd listening");
        Ok(RunningGateway {
            gateway,
            data_addr,
            control_addr,
            tasks,
            grace,
        })
    }

    /// Re-reads the configuration file and applies policy and workers atomically; on any error
    /// nothing changes. Listener addresses and the admin token need a restart.
    pub fn reload(&self) -> anyhow::Result<()> {
        let Some(path) = &self.config_path else {
            bail!("gatewayd was started without --config; nothing to reload");
        };
        let _admin = self
            .admin_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut config = Config::load(path)?;
        if let Some(overrides) = self.config_overrides.get() {
            overrides(&mut config);
        }
        config.workers.extend(self.cli_workers.iter().cloned());
        config.validate()?;
        let specs = config.worker_specs()?;
        let current = self.router.table().policy().to_owned();
        let applied = config.policy.settings();
        // One swap: no request sees the new workers with the old thresholds or the reverse.
        self.router.reconfigure(specs, applied)?;
        self.settings
            .store(Arc::new(RuntimeSettings::from_config(&config)));
        self.config.store(Arc::new(config));
        if applied != current {
            self.telemetry.policy_changed(ChangeSource::Reload);
        }
        tracing::info!(path = %path.display(), "configuration reloaded");
        Ok(())
    }
}

/// Closes worker connections that sat idle past [`crate::upstream::IDLE_TIMEOUT`], every
/// 30 s until shutdown (busy pools also expire them whenever a connection is checked in).
async fn sweep_idle_connections(gateway: Arc<Gateway>) {
    let mut every = tokio::time::interval(Duration::from_secs(30));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = gateway.shutdown.cancelled() => return,
            _ = every.tick() => gateway.upstreams.sweep(),
        }
    }
}
