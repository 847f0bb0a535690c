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

mod listener_tls;
mod listeners;
mod logging;
mod options;
#[doc(hidden)]
pub mod picker_harness;
mod prepare;
mod process;
mod routing_parts;
mod signals;
pub mod terminal;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::PoisonError;

use axum::extract::ConnectInfo;
use bch_core::router::{Router, RoutingTable};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use listeners::Listeners;
pub use logging::init_logging;
pub use options::{StartError, StartOptions};
pub use prepare::{Findings, check};
use prepare::{Prepared, prepare};
use routing_parts::assemble_routing;

use crate::admin::Admin;
use crate::config::{ConfigError, FieldError, TlsListener};
use crate::control::ControlPlane;
use crate::control::guard::BrowserGuard;
use crate::discovery::DiscoveryMetrics;
use crate::health::{ProbeFailures, ProbeRequestQueue, ProbeRequests};
use crate::log_limit::{Component, LimitedLog, LineBudget, SuppressedLines};
use crate::metrics::Metrics;
use crate::picker::{PickerMetrics, PickerPlane};
use crate::proxy::DataPlane;
use crate::scraper::ScrapeStats;
use crate::server::{ConnectionCap, Listening};
use crate::telemetry::{RecordingTarget, Telemetry};
use crate::upstream::{Upstreams, WorkerTls};

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
    /// Health probe rounds applied so far.
    probed: tokio::sync::watch::Receiver<u64>,
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

    /// Returns once the health prober has applied its first round: every worker present at
    /// start has had its first probe, and with `[health] wait_for_first_probe` the ones that
    /// passed take traffic (those that failed stay out until a probe passes). Returns at once
    /// after that, and when the prober has stopped.
    pub async fn first_probes_applied(&self) {
        let mut probed = self.probed.clone();
        let _ = probed.wait_for(|rounds| *rounds > 0).await;
    }

    /// Whether the control plane needs a bearer token.
    pub fn requires_token(&self) -> bool {
        self.requires_token
    }

    /// Stops accepting, lets in-flight requests finish for up to `shutdown_grace_ms`, then returns.
    /// With `[telemetry] record_file`, it also waits (within the same grace) for the recorder to
    /// write the last frame and close the file, so the recording on disk is final on return.
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
    process::take_machine();
    let prepared = prepare(options)?;
    let listeners = Listeners::bind(&prepared.config).await?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let grace = prepared.config.server.timeouts.shutdown_grace;
    let handle_signals = prepared.handle_signals;
    let (data_addr, control_addr) = (listeners.data_addr, listeners.control_addr);
    let picker_addr = listeners.picker.as_ref().map(|(_, addr)| *addr);
    let served_data_addr = listeners.data.is_some().then_some(data_addr);
    let secure = |listener| prepared.tls.served.of(listener).is_some();
    let tls = [TlsListener::Data, TlsListener::Control, TlsListener::Picker].map(secure);
    let recording = RecordingTarget::of(&prepared.config.telemetry, control_addr, tls[1]);
    let parts = assemble(prepared, &listeners, &shutdown)?;
    if let Some(target) = recording {
        match parts.telemetry.record(target) {
            // Tracked like a connection: `shutdown` returns once the recorder has written the
            // aggregator's last frame, so the files are whole when the gateway has stopped.
            Ok(recording_written) => drop(tasks.spawn(recording_written)),
            Err(error) => {
                shutdown.cancel();
                return Err(StartError::Recording(error));
            }
        }
    }
    let (router, registry) = (Arc::clone(&parts.router), Arc::clone(&parts.registry));
    let requires_token = parts.control_plane.token.is_some();
    let admin = Arc::clone(&parts.admin);
    let (probe_rounds, probed) = tokio::sync::watch::channel(0);
    if let Err(error) = spawn_services(parts, listeners, probe_rounds, &shutdown, &tasks) {
        shutdown.cancel();
        return Err(error);
    }
    if handle_signals && let Err(error) = signals::install(admin, shutdown.clone()) {
        shutdown.cancel();
        return Err(StartError::Signals(error));
    }
    log_start_up(
        &router,
        served_data_addr,
        control_addr,
        picker_addr,
        requires_token,
        tls,
    );
    Ok(RunningGateway {
        data_addr,
        control_addr,
        picker_addr,
        router,
        registry,
        requires_token,
        probed,
        shutdown,
        tasks,
        grace,
    })
}

/// The one line that says what started: version, addresses, the policy and the workers.
/// `data_addr` is `None` without a data plane: the line then says `data_plane=-`, as it says
/// `picker=-` without a picker, rather than the placeholder address nothing listens on.
fn log_start_up(
    router: &Router,
    data_addr: Option<SocketAddr>,
    control_addr: SocketAddr,
    picker_addr: Option<SocketAddr>,
    requires_token: bool,
    [data_tls, control_tls, picker_tls]: [bool; 3],
) {
    let scheme = |tls: bool, plain: &'static str, secure: &'static str| {
        if tls { secure } else { plain }
    };
    let (http, ws) = (
        scheme(control_tls, "http", "https"),
        scheme(control_tls, "ws", "wss"),
    );
    let table = router.table();
    let policy = table.policy();
    let workers: Vec<&str> = table
        .workers()
        .iter()
        .map(|w| w.spec.name.as_str())
        .collect();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        data_plane = %data_addr.map_or_else(
            || "-".to_owned(),
            |a| format!("{}://{a}", scheme(data_tls, "http", "https"))
        ),
        control_plane = %format!("{http}://{control_addr}"),
        telemetry = %format!("{ws}://{control_addr}/ws"),
        picker = %picker_addr.map_or_else(
            || "-".to_owned(),
            |a| format!("{}://{a}", scheme(picker_tls, "grpc", "grpcs"))
        ),
        token_required = requires_token,
        policy = %policy.kind,
        min_load_gap = policy.min_load_gap,
        max_load_skew = policy.max_load_skew,
        virtual_nodes = policy.virtual_nodes,
        worker_count = workers.len(),
        workers = %workers.join(","),
        "gatewayd started"
    );
}

/// The parts of a gateway, each with its narrow handle, before anything runs.
struct Parts {
    router: Arc<Router>,
    scrapes: Arc<ScrapeStats>,
    probe_failures: Arc<ProbeFailures>,
    discovery: Arc<DiscoveryMetrics>,
    /// `bch_log_lines_suppressed_total`, shared by the scraper, the prober and discovery.
    suppressed: Arc<SuppressedLines>,
    registry: Arc<prometheus_client::registry::Registry>,
    metrics: Arc<Metrics>,
    upstreams: Arc<Upstreams>,
    admin: Arc<Admin>,
    data_plane: Arc<DataPlane>,
    picker_plane: Arc<PickerPlane>,
    control_plane: Arc<ControlPlane>,
    telemetry: Telemetry,
    probe_now: Arc<Notify>,
    probe_requests: ProbeRequestQueue,
    tls: listener_tls::ListenerTlsParts,
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
        metrics_token,
        tls,
        worker_tls,
        ..
    } = prepared;
    let own = listeners.own_addresses();
    for (index, member) in members.iter().enumerate() {
        if let Some(message) = crate::config::members::loop_of(member, &own) {
            return Err(StartError::Config(ConfigError::Invalid {
                path: origin.path.clone(),
                error: FieldError::new("url", message).within(&format!("workers[{index}]")),
            }));
        }
    }
    let parts = assemble_routing(
        &config,
        &members,
        !config.health.wait_for_first_probe,
        shutdown,
    )?;
    let router = Arc::clone(&parts.router);
    let metrics = Arc::clone(&parts.metrics);
    let telemetry = parts.telemetry.clone();
    let probe_now = Arc::new(Notify::new());
    let (probe_requests, probe_queue) = ProbeRequests::channel();
    let picker_metrics = Arc::new(PickerMetrics::default());
    let scrapes = Arc::new(ScrapeStats::default());
    let probe_failures = Arc::new(ProbeFailures::default());
    let discovery = Arc::new(DiscoveryMetrics::default());
    let suppressed = Arc::new(SuppressedLines::default());
    // Each component registers its own families.
    let mut registry = crate::metrics::registry(Arc::clone(&metrics), Arc::clone(&router));
    scrapes.register(&mut registry, Arc::clone(&router));
    probe_failures.register(&mut registry, Arc::clone(&router));
    discovery.register(&mut registry, Arc::clone(&router));
    picker_metrics.register(&mut registry);
    suppressed.register(&mut registry);
    parts.queue.register(&mut registry, Arc::clone(&router));
    tls.register(&mut registry);
    crate::pool_metrics::register(&mut registry, Arc::clone(&router));
    let registry = Arc::new(registry);
    let upstreams = Arc::new(Upstreams::new(
        config.server.timeouts.connect,
        config.server.timeouts.upstream_idle,
        Arc::new(WorkerTls::from_config(worker_tls)),
    ));
    upstreams.publish(&members);
    let owned = crate::admin::Owned {
        router: Arc::clone(&router),
        upstreams: Arc::clone(&upstreams),
        telemetry: telemetry.clone(),
        probe_now: Arc::clone(&probe_now),
    };
    let admin = Arc::new(
        Admin::new(owned, origin, config, members)
            .listening_on(own)
            .serving_certificates(Arc::clone(&tls.served)),
    );
    let routing = parts.routing(admin.settings());
    let data_plane = Arc::new(DataPlane {
        routing: Arc::clone(&routing),
        upstreams: Arc::clone(&upstreams),
        via: crate::proxy::request::own_via(),
    });
    let picker_plane = Arc::new(PickerPlane::new(
        routing,
        admin.members(),
        probe_requests,
        picker_metrics,
        LimitedLog::new(
            Component::Picker,
            LineBudget::of(&admin.config().load().log),
            Arc::clone(&suppressed),
        ),
    ));
    let in_force = admin.config().load_full();
    let guard = BrowserGuard::new(
        listeners.control_addr,
        token.is_none(),
        &in_force.server.control_access.allowed_hosts,
        &in_force.server.control_access.allowed_origins,
    );
    let control_plane = Arc::new(ControlPlane {
        admin: Arc::clone(&admin),
        router: Arc::clone(&router),
        telemetry: telemetry.clone(),
        registry: Arc::clone(&registry),
        token,
        guard,
        metrics_token,
        shutdown: shutdown.clone(),
    });
    Ok(Parts {
        router,
        scrapes,
        probe_failures,
        discovery,
        suppressed,
        registry,
        metrics,
        upstreams,
        admin,
        data_plane,
        picker_plane,
        control_plane,
        telemetry,
        probe_now,
        probe_requests: probe_queue,
        tls,
    })
}

/// Spawns the accept loops (tracked by `tasks`, so shutdown can wait for their connections), the
/// load scraper, the health prober, DNS discovery and the idle-connection sweeper.
fn spawn_services(
    parts: Parts,
    listeners: Listeners,
    probe_rounds: tokio::sync::watch::Sender<u64>,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<(), StartError> {
    let listening = |listener: TlsListener| Listening {
        header_read_timeout: listeners.header_read_timeout,
        shutdown: shutdown.clone(),
        tasks: tasks.clone(),
        plane: listener.name(),
        tls: parts.tls.acceptance(listener),
    };
    let metrics = Arc::clone(&parts.metrics);
    let refusals = RefusalLog::default();
    let cap = ConnectionCap {
        max_connections: listeners.max_connections,
        write_stall_timeout: listeners.client_stall_timeout,
        response: crate::error::over_capacity_response(),
        on_reject: Arc::new(move || {
            metrics.record_rejected_connection();
            refusals.refused(listeners.max_connections);
        }),
    };
    let data_plane = parts.data_plane;
    if let Some(data) = listeners.data {
        tasks.spawn(crate::server::serve_capped(
            data,
            listening(TlsListener::Data),
            cap,
            move |_peer, stall| {
                let plane = Arc::clone(&data_plane);
                move |request| {
                    // Boxed per request: the proxy's future is ~3.5 KiB, and the connection's
                    // future would otherwise keep a slot that size for its whole life. A box that
                    // is freed once the response head is out costs a held stream nothing.
                    Box::pin(crate::proxy::serve(
                        Arc::clone(&plane),
                        request,
                        stall.clone(),
                    ))
                }
            },
        ));
    }
    if let Some((picker, _)) = listeners.picker {
        tasks.spawn(crate::picker::serve(
            picker,
            parts.tls.acceptance(TlsListener::Picker),
            parts.picker_plane,
            shutdown.clone(),
        ));
    }
    let control_app = crate::control::router(parts.control_plane);
    tasks.spawn(crate::server::serve_upgradable(
        listeners.control,
        listening(TlsListener::Control),
        move |peer| {
            // Handlers name the client that changed something (`ConnectInfo`).
            TowerToHyperService::new(control_app.clone().map_request(
                move |mut request: http::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    request
                },
            ))
        },
    ));
    crate::scraper::spawn(
        Arc::clone(&parts.router),
        parts.admin.config(),
        parts.admin.members(),
        parts.scrapes,
        Arc::clone(&parts.suppressed),
        Arc::clone(parts.upstreams.tls()),
        shutdown,
    )
    .map_err(StartError::Scraper)?;
    tokio::spawn(crate::health::run(crate::health::Prober {
        router: Arc::clone(&parts.router),
        config: parts.admin.config(),
        members: parts.admin.members(),
        probe_now: parts.probe_now,
        requests: parts.probe_requests,
        failures: parts.probe_failures,
        suppressed: Arc::clone(&parts.suppressed),
        rounds: probe_rounds,
        shutdown: shutdown.clone(),
        tls: Arc::clone(parts.upstreams.tls()),
    }));
    tokio::spawn(crate::drain_watch::run(
        Arc::clone(&parts.admin),
        parts.router,
        parts.telemetry,
        shutdown.clone(),
    ));
    tokio::spawn(crate::discovery::run(
        Arc::clone(&parts.admin),
        parts.discovery,
        parts.suppressed,
        shutdown.clone(),
    ));
    tokio::spawn(sweep_idle_connections(
        parts.upstreams,
        listeners.upstream_idle_timeout,
        shutdown.clone(),
    ));
    Ok(())
}

/// Connections refused at `max_connections`, logged at most once a second with how many there
/// were: each refusal is a response no access log line shows, and one line per refusal would
/// flood the log exactly when the gateway is overloaded.
#[derive(Default)]
struct RefusalLog {
    /// The second (since the log was made) of the last line, and refusals since it.
    state: std::sync::Mutex<(u64, u64)>,
    since: std::sync::OnceLock<std::time::Instant>,
}

impl RefusalLog {
    fn refused(&self, max_connections: usize) {
        let since = *self.since.get_or_init(std::time::Instant::now);
        let second = since.elapsed().as_secs() + 1;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.1 += 1;
        if state.0 != second {
            tracing::warn!(
                refused = state.1,
                max_connections,
                status = 503,
                "connections refused at max_connections (503 too_many_connections)"
            );
            *state = (second, 0);
        }
    }
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
