//! The composition root: the only module that names all the others. [`start`] validates the
//! configuration, binds the listeners, builds the router, the admin owner, the routing step, the
//! data plane, the endpoint picker, the control plane, telemetry and metrics, hands each part its
//! narrow handle, and spawns the accept loops, the health prober, DNS discovery and the
//! idle-connection sweeper. [`RunningGateway`] stops them.
//!
//! Nothing outside this module holds the whole gateway: the data plane gets a
//! [`DataPlane`](crate::proxy::DataPlane), the endpoint picker a
//! [`PickerPlane`](crate::picker::PickerPlane) (both over one shared
//! [`Routing`](crate::routing::Routing)), the control plane a
//! [`ControlPlane`](crate::control::ControlPlane), health probes the router and the configuration
//! in force, and every change of membership or policy goes through the [`Admin`] owner.

mod logging;
mod signals;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bch_core::router::{Router, RouterError, RoutingTable};
use hyper::service::service_fn;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use logging::init_logging;

use crate::admin::{Admin, ConfigOrigin, ConfigOverrides};
use crate::config::{Config, ConfigError, Member, WorkerConfig};
use crate::control::ControlPlane;
use crate::control::guard::BrowserGuard;
use crate::fleet::ScrapeStats;
use crate::metrics::Metrics;
use crate::picker::PickerPlane;
use crate::proxy::DataPlane;
use crate::routing::Routing;
use crate::server::{ConnectionCap, Listening};
use crate::telemetry::Telemetry;
use crate::upstream::Upstreams;

/// What to start a gateway from. The configuration in force is `config` with `overrides` applied
/// and `pinned_workers` appended, and every reload rebuilds it the same way from the file, so the
/// command line and the demo's workers are in force from the first request on, and stay.
#[derive(Clone)]
pub struct StartOptions {
    config: Config,
    origin: ConfigOrigin,
    handle_signals: bool,
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
        self.config.server.listen.set_port(0);
        self.config.server.control_listen.set_port(0);
        if let Some(picker) = &mut self.config.picker.listen {
            picker.set_port(0);
        }
        self
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
    /// The configuration is invalid; names file and field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `admin_token_file` cannot be read.
    #[error("cannot read admin_token_file {path}: {cause}")]
    TokenFile {
        /// The token file.
        path: PathBuf,
        /// Why it cannot be read.
        cause: std::io::Error,
    },
    /// `admin_token_file` holds nothing but whitespace.
    #[error("admin_token_file {0} is empty")]
    EmptyToken(PathBuf),
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
}

/// A started gateway: its bound addresses, read-only views for its owner, and the way to stop it.
pub struct RunningGateway {
    /// Bound data plane address; the unspecified `0.0.0.0:0` when the data plane is off
    /// (`[server] data_plane = false`).
    pub data_addr: SocketAddr,
    /// Bound control plane address.
    pub control_addr: SocketAddr,
    /// Bound endpoint picker address, when `[picker] listen` is set.
    pub picker_addr: Option<SocketAddr>,
    router: Arc<Router>,
    registry: Arc<prometheus_client::registry::Registry>,
    requires_token: bool,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    grace: Duration,
}

impl RunningGateway {
    /// The routing table in force (workers, health, policy, and each worker's live counters).
    pub fn routing_table(&self) -> Arc<RoutingTable> {
        self.router.table()
    }

    /// `GET /metrics` as it would answer now.
    pub fn metrics_text(&self) -> String {
        crate::metrics::render(&self.registry)
    }

    /// Whether the control plane needs a bearer token.
    pub fn requires_token(&self) -> bool {
        self.requires_token
    }

    /// Stops accepting, lets in-flight requests finish for up to `shutdown_grace_ms`, then returns.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
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

    /// Waits until shutdown was requested (a signal), then shuts down gracefully.
    pub async fn run_until_stopped(self) {
        self.shutdown.cancelled().await;
        self.shutdown().await;
    }
}

/// Starts a gateway: see the module documentation.
pub async fn start(options: StartOptions) -> Result<RunningGateway, StartError> {
    let prepared = prepare(options)?;
    let listeners = Listeners::bind(&prepared.config).await?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let grace = Duration::from_millis(prepared.config.server.shutdown_grace_ms);
    let handle_signals = prepared.handle_signals;
    let (data_addr, control_addr) = (listeners.data_addr, listeners.control_addr);
    let picker_addr = listeners.picker.as_ref().map(|(_, addr)| *addr);
    let parts = assemble(prepared, &listeners, &shutdown)?;
    let (router, registry) = (Arc::clone(&parts.router), Arc::clone(&parts.registry));
    let requires_token = parts.control_plane.token.is_some();
    let admin = Arc::clone(&parts.admin);
    spawn_services(parts, listeners, &shutdown, &tasks);
    if handle_signals && let Err(error) = signals::install(admin, shutdown.clone()) {
        shutdown.cancel();
        return Err(StartError::Signals(error));
    }
    match picker_addr {
        Some(picker_addr) => {
            tracing::info!(%data_addr, %control_addr, %picker_addr, "gatewayd listening")
        }
        None => tracing::info!(%data_addr, %control_addr, "gatewayd listening"),
    }
    Ok(RunningGateway {
        data_addr,
        control_addr,
        picker_addr,
        router,
        registry,
        requires_token,
        shutdown,
        tasks,
        grace,
    })
}

/// A configuration checked for everything that needs no socket: in force, with its members and
/// token.
struct Prepared {
    config: Config,
    origin: ConfigOrigin,
    members: Vec<Member>,
    token: Option<String>,
    handle_signals: bool,
}

/// Every start-up check that needs no socket: the effective configuration validates, the token
/// file reads, and a control plane beyond loopback has a token.
fn prepare(options: StartOptions) -> Result<Prepared, StartError> {
    let StartOptions {
        config,
        origin,
        handle_signals,
    } = options;
    let config = origin.effective(config)?;
    let members = config.members()?;
    let token = admin_token(&config)?;
    if token.is_none() && !config.server.control_listen.ip().is_loopback() {
        return Err(StartError::UnprotectedControlPlane(
            config.server.control_listen,
        ));
    }
    Ok(Prepared {
        config,
        origin,
        members,
        token,
        handle_signals,
    })
}

/// The listeners, bound, with the addresses they got: the data plane's (unless it is off), the
/// control plane's, and the endpoint picker's (when configured).
struct Listeners {
    data: Option<TcpListener>,
    control: TcpListener,
    picker: Option<(TcpListener, SocketAddr)>,
    data_addr: SocketAddr,
    control_addr: SocketAddr,
    header_read_timeout: Duration,
    max_connections: usize,
    client_stall_timeout: Duration,
    upstream_idle_timeout: Duration,
}

impl Listeners {
    async fn bind(config: &Config) -> Result<Self, StartError> {
        let (data, data_addr) = if config.server.data_plane {
            let data = bind("data", config.server.listen).await?;
            let addr = local_addr("data", &data, config.server.listen)?;
            (Some(data), addr)
        } else {
            (None, SocketAddr::from(([0, 0, 0, 0], 0)))
        };
        let control = bind("control", config.server.control_listen).await?;
        let picker = match config.picker.listen {
            Some(address) => {
                let picker = bind("picker", address).await?;
                let addr = local_addr("picker", &picker, address)?;
                Some((picker, addr))
            }
            None => None,
        };
        Ok(Self {
            control_addr: local_addr("control", &control, config.server.control_listen)?,
            data,
            control,
            picker,
            data_addr,
            header_read_timeout: Duration::from_millis(config.server.header_read_timeout_ms),
            max_connections: config.server.max_connections,
            client_stall_timeout: Duration::from_millis(config.server.client_stall_timeout_ms),
            upstream_idle_timeout: Duration::from_millis(config.server.upstream_idle_timeout_ms),
        })
    }

    /// The addresses this gateway serves on (the data plane's only when it runs): a worker URL
    /// that is one of them would send requests back here.
    fn own_addresses(&self) -> Vec<SocketAddr> {
        let data = self.data.is_some().then_some(self.data_addr);
        let picker = self.picker.as_ref().map(|(_, addr)| *addr);
        data.into_iter()
            .chain([self.control_addr])
            .chain(picker)
            .collect()
    }
}

/// The parts of a gateway, each with its narrow handle, before anything runs.
struct Parts {
    router: Arc<Router>,
    scrapes: Arc<ScrapeStats>,
    registry: Arc<prometheus_client::registry::Registry>,
    metrics: Arc<Metrics>,
    upstreams: Arc<Upstreams>,
    admin: Arc<Admin>,
    data_plane: Arc<DataPlane>,
    picker_plane: Arc<PickerPlane>,
    control_plane: Arc<ControlPlane>,
}

/// Builds every part from the prepared configuration; the telemetry aggregator starts here and
/// stops with `shutdown`. A worker that is one of the bound listeners is refused here, the first
/// moment their addresses are known.
fn assemble(
    prepared: Prepared,
    listeners: &Listeners,
    shutdown: &CancellationToken,
) -> Result<Parts, StartError> {
    let Prepared {
        config,
        origin,
        members,
        token,
        ..
    } = prepared;
    let own = listeners.own_addresses();
    for (index, member) in members.iter().enumerate() {
        if let Some(message) = crate::config::loop_of(member, &own) {
            return Err(StartError::Config(ConfigError::Invalid {
                path: origin.path.clone(),
                field: format!("workers[{index}].url"),
                message,
            }));
        }
    }
    let router = Arc::new(Router::new(
        members.iter().map(|m| m.spec.clone()).collect(),
        config.policy_settings(),
    )?);
    let metrics = Arc::new(Metrics::default());
    let scrapes = Arc::new(ScrapeStats::default());
    let registry = Arc::new(crate::metrics::registry(
        Arc::clone(&metrics),
        Arc::clone(&router),
        Arc::clone(&scrapes),
    ));
    let telemetry = Telemetry::start(
        Arc::clone(&router),
        &config.telemetry,
        Arc::clone(&metrics),
        shutdown.clone(),
    );
    let upstreams = Arc::new(Upstreams::new(
        Duration::from_millis(config.server.connect_timeout_ms),
        Duration::from_millis(config.server.upstream_idle_timeout_ms),
    ));
    upstreams.publish(&members);
    let admin = Arc::new(
        Admin::new(
            Arc::clone(&router),
            Arc::clone(&upstreams),
            telemetry.clone(),
            origin,
            config,
            members,
        )
        .listening_on(own),
    );
    let routing = Arc::new(Routing {
        router: Arc::clone(&router),
        settings: admin.settings(),
        metrics: Arc::clone(&metrics),
        telemetry: telemetry.clone(),
    });
    let data_plane = Arc::new(DataPlane {
        routing: Arc::clone(&routing),
        upstreams: Arc::clone(&upstreams),
        via: crate::proxy::request::own_via(),
    });
    let picker_plane = Arc::new(PickerPlane::new(routing));
    let in_force = admin.config().load_full();
    let guard = BrowserGuard::new(
        listeners.control_addr,
        token.is_none(),
        &in_force.server.control_allowed_hosts,
        &in_force.server.control_allowed_origins,
    );
    let control_plane = Arc::new(ControlPlane {
        admin: Arc::clone(&admin),
        router: Arc::clone(&router),
        telemetry,
        registry: Arc::clone(&registry),
        token,
        guard,
        shutdown: shutdown.clone(),
    });
    Ok(Parts {
        router,
        scrapes,
        registry,
        metrics,
        upstreams,
        admin,
        data_plane,
        picker_plane,
        control_plane,
    })
}

/// Spawns the accept loops (tracked by `tasks`, so shutdown can wait for their connections), the
/// load scraper, the health prober, DNS discovery and the idle-connection sweeper.
fn spawn_services(
    parts: Parts,
    listeners: Listeners,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) {
    let listening = |plane| Listening {
        header_read_timeout: listeners.header_read_timeout,
        shutdown: shutdown.clone(),
        tasks: tasks.clone(),
        plane,
    };
    let discovery_metrics = Arc::clone(&parts.metrics.discovery);
    let metrics = parts.metrics;
    let cap = ConnectionCap {
        max_connections: listeners.max_connections,
        write_stall_timeout: listeners.client_stall_timeout,
        response: crate::error::over_capacity_response(),
        on_reject: Arc::new(move || metrics.record_rejected_connection()),
    };
    let data_plane = parts.data_plane;
    if let Some(data) = listeners.data {
        tasks.spawn(crate::server::serve_capped(
            data,
            listening("data"),
            cap,
            move || {
                let plane = Arc::clone(&data_plane);
                service_fn(move |request| {
                    // Boxed per request: hyper keeps one slot the size of the handler's future
                    // for the connection's whole life, and the proxy's future is ~3.5 KiB. A box
                    // that is freed once the response head is out costs a held stream nothing.
                    Box::pin(crate::proxy::handle(Arc::clone(&plane), request))
                })
            },
        ));
    }
    if let Some((picker, _)) = listeners.picker {
        tasks.spawn(crate::picker::serve(
            picker,
            parts.picker_plane,
            shutdown.clone(),
        ));
    }
    let control_app = crate::control::router(parts.control_plane);
    tasks.spawn(crate::server::serve_upgradable(
        listeners.control,
        listening("control"),
        move || TowerToHyperService::new(control_app.clone()),
    ));
    tokio::spawn(crate::fleet::run(
        Arc::clone(&parts.router),
        parts.admin.config(),
        parts.scrapes,
        shutdown.clone(),
    ));
    tokio::spawn(crate::health::run(
        parts.router,
        parts.admin.config(),
        parts.admin.members(),
        shutdown.clone(),
    ));
    tokio::spawn(crate::discovery::run(
        Arc::clone(&parts.admin),
        discovery_metrics,
        shutdown.clone(),
    ));
    tokio::spawn(sweep_idle_connections(
        parts.upstreams,
        listeners.upstream_idle_timeout,
        shutdown.clone(),
    ));
}

/// The bearer token from `admin_token_file`, trimmed; `None` when no file is configured.
fn admin_token(config: &Config) -> Result<Option<String>, StartError> {
    let Some(path) = &config.server.admin_token_file else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(path).map_err(|cause| StartError::TokenFile {
        path: path.clone(),
        cause,
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(StartError::EmptyToken(path.clone()));
    }
    Ok(Some(token.to_owned()))
}

async fn bind(plane: &'static str, address: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(address)
        .await
        .map_err(|cause| StartError::Bind {
            plane,
            address,
            cause,
        })
}

fn local_addr(
    plane: &'static str,
    listener: &TcpListener,
    address: SocketAddr,
) -> Result<SocketAddr, StartError> {
    listener.local_addr().map_err(|cause| StartError::Bind {
        plane,
        address,
        cause,
    })
}

/// Closes worker connections that sat idle past `upstream_idle_timeout_ms`, once per that timeout
/// (at most every 30 s, at least every second) until shutdown; busy pools also expire them
/// whenever a connection is checked in, and no pool ever hands out an expired one.
async fn sweep_idle_connections(
    upstreams: Arc<Upstreams>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut every =
        tokio::time::interval(every.clamp(Duration::from_secs(1), Duration::from_secs(30)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => upstreams.sweep(),
        }
    }
}
