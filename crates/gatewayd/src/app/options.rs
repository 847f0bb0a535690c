//! What a gateway starts from ([`StartOptions`]) and why it did not start ([`StartError`]):
//! shared by the composition root and the start-up checks, so neither imports the other.

use std::net::SocketAddr;
use std::path::PathBuf;

use bch_core::router::RouterError;

use crate::admin::{ConfigOrigin, ConfigOverrides};
use crate::config::{Config, ConfigError, WorkerConfig};

/// What to start a gateway from. The configuration in force is `config` with `overrides` applied
/// and `pinned_workers` appended, and every reload rebuilds it the same way from the file, so the
/// command line and the demo's workers are in force from the first request on, and stay.
#[derive(Clone)]
pub struct StartOptions {
    pub(super) config: Config,
    pub(super) origin: ConfigOrigin,
    pub(super) handle_signals: bool,
}

impl StartOptions {
    /// Start from `config` as it is: no file to reload, no overrides, no pinned workers, no signal
    /// handlers (an embedding program or a test keeps its own).
    pub fn new(config: Config) -> Self {
        Self {
            config,
            origin: ConfigOrigin {
                path: None,
                overrides: None,
                pinned_workers: Vec::new(),
            },
            handle_signals: false,
        }
    }

    /// `config` was read from `path`, which `POST /admin/reload` and SIGHUP re-read.
    pub fn config_file(mut self, path: PathBuf) -> Self {
        self.origin.path = Some(path);
        self
    }

    /// Changes applied to the file's contents at start and on every reload (the command line).
    pub fn overrides(mut self, overrides: ConfigOverrides) -> Self {
        self.origin.overrides = Some(overrides);
        self
    }

    /// Workers added after the file's, at start and on every reload.
    pub fn pinned_workers(mut self, workers: Vec<WorkerConfig>) -> Self {
        self.origin.pinned_workers = workers;
        self
    }

    /// Appends `workers` to the pinned workers.
    pub fn pin_more_workers(mut self, workers: impl IntoIterator<Item = WorkerConfig>) -> Self {
        self.origin.pinned_workers.extend(workers);
        self
    }

    /// Listens on free ports (port 0) instead of the configured ones, keeping the addresses.
    pub fn free_ports(mut self) -> Self {
        self.config.server.listeners.listen.set_port(0);
        self.config.server.listeners.control_listen.set_port(0);
        if let Some(picker) = &mut self.config.picker.listen {
            picker.set_port(0);
        }
        self
    }

    /// The configuration these options put in force (overrides applied, pinned workers appended),
    /// not yet validated: [`check`](super::check) reports every problem of it.
    pub fn effective_unvalidated(&self) -> Config {
        self.origin.effective_unvalidated(self.config.clone())
    }

    /// Installs SIGTERM/SIGINT (graceful shutdown) and SIGHUP (reload) handlers: for the daemon.
    pub fn handle_signals(mut self) -> Self {
        self.handle_signals = true;
        self
    }
}

/// Why a gateway did not start. Nothing is left running.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Every problem the start-up checks found (see [`check`]), one sentence each.
    #[error("{}", problems(.0))]
    Invalid(Vec<String>),
    /// The configuration is invalid; names file and field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A token file (`admin_token_file`, `metrics_token_file`) cannot be read.
    #[error("cannot read {key} {path}: {cause}")]
    TokenFile {
        /// The configuration key that names the file, so the operator knows which token it is.
        key: &'static str,
        /// The token file.
        path: PathBuf,
        /// Why it cannot be read.
        cause: std::io::Error,
    },
    /// A token file holds nothing but whitespace.
    #[error("{key} {path} is empty")]
    EmptyToken {
        /// The configuration key that names the file.
        key: &'static str,
        /// The token file.
        path: PathBuf,
    },
    /// A control plane reachable beyond this host without a token would let anyone rewrite routing.
    #[error(
        "refusing to bind the control plane to {0} without a token: set server.admin_token_file or listen on loopback"
    )]
    UnprotectedControlPlane(SocketAddr),
    /// A listener address cannot be bound (in use, not local, no permission).
    #[error("cannot bind {plane} plane {address}: {cause}")]
    Bind {
        /// `data`, `control` or `picker`.
        plane: &'static str,
        /// The address asked for.
        address: SocketAddr,
        /// Why binding failed.
        cause: std::io::Error,
    },
    /// The router refused the workers or policy (only when the configuration contradicts itself).
    #[error(transparent)]
    Router(#[from] RouterError),
    /// SIGTERM/SIGINT/SIGHUP handlers cannot be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// A listener's certificate, key or client CA cannot be served; names the section and file.
    #[error("{0}")]
    Tls(String),
    /// `[telemetry] record_file` cannot be created or written; names the file.
    #[error("cannot record telemetry ([telemetry] record_file): {0}")]
    Recording(std::io::Error),
    /// The load scraper's thread or its runtime cannot be created.
    #[error("cannot start the load scraper's thread: {0}")]
    Scraper(std::io::Error),
}

fn problems(list: &[String]) -> String {
    match list {
        [one] => one.clone(),
        many => format!("{} problems:\n  {}", many.len(), many.join("\n  ")),
    }
}
