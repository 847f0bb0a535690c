//! Test harness: fake workers (real axum servers on 127.0.0.1:0) and a gateway started in-process.
//!
//! These fakes exist beside bch-drill's simulated workers on purpose: a test here needs exact
//! control (hold a stream until told, stall before the first byte, crash mid-body, count
//! cancellations), where the drill's workers model an LLM server's timing instead.
#![allow(dead_code)]

pub mod envoy;
pub mod raw;
pub mod ws;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use futures_util::StreamExt;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};

/// A fake worker: records what it saw and can hold streams open until released.
pub struct FakeWorker {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it saw and the switches that steer it.
    pub state: Arc<WorkerState>,
    task: tokio::task::JoinHandle<()>,
}

/// A fake worker's counters and switches, shared with the test.
pub struct WorkerState {
    /// Its name in the gateway's configuration.
    pub name: String,
    /// Requests it received (health probes excluded).
    pub requests: AtomicU64,
    /// Streams currently held open by `/hold`.
    pub held: AtomicU64,
    /// Requests currently stalled before their first byte by `/stall`.
    pub stalled: AtomicU64,
    /// Upstream requests that were cancelled (the gateway closed the connection).
    pub cancelled: AtomicU64,
    /// Releases one held stream.
    pub release: Notify,
    /// Bumped to release every held stream.
    pub release_all: watch::Sender<u64>,
    /// Notified whenever a counter changes (see [`wait_for`]).
    pub changed: Notify,
    /// When set, `/health` answers 503.
    pub fail_health: std::sync::atomic::AtomicBool,
    /// Health probes it answered.
    pub health_probes: AtomicU64,
    /// Client addresses (one per TCP connection) that sent anything but a health probe.
    pub data_connections: std::sync::Mutex<std::collections::HashSet<SocketAddr>>,
}

impl FakeWorker {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Releases every held stream (current and future until reset).
    pub fn release_all(&self) {
        self.state.release_all.send_modify(|n| *n += 1);
    }

    /// Stops the server and waits until its listener is closed.
    pub async fn stop(mut self) {
        self.task.abort();
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counts a cancellation when dropped before being marked finished (field 1); for stalled requests
/// (field 2) it also lowers `stalled`, so `stalled` means "currently stalled".
struct CountOnDrop(Arc<WorkerState>, bool, bool);
impl Drop for CountOnDrop {
    fn drop(&mut self) {
        if self.2 {
            self.0.stalled.fetch_sub(1, Ordering::SeqCst);
        }
        if !self.1 {
            self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        }
        self.0.changed.notify_waiters();
    }
}

/// A fake worker called `name` on a free loopback port.
pub async fn fake_worker(name: &str) -> FakeWorker {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    fake_worker_on(listener, name).await
}

/// A fake worker called `name` on `listener` (to reuse a port after a restart).
pub async fn fake_worker_on(listener: TcpListener, name: &str) -> FakeWorker {
    let addr = listener.local_addr().unwrap();
    let (release_all, _) = watch::channel(0);
    let state = Arc::new(WorkerState {
        name: name.to_owned(),
        requests: AtomicU64::new(0),
        held: AtomicU64::new(0),
        stalled: AtomicU64::new(0),
        cancelled: AtomicU64::new(0),
        release: Notify::new(),
        release_all,
        changed: Notify::new(),
        fail_health: false.into(),
        health_probes: AtomicU64::new(0),
        data_connections: Default::default(),
    });
    let app = Router::new()
        .route("/health", get(health))
        .route("/hold", any(hold))
        .route("/stall", any(stall))
        .route("/crash", any(crash))
        .route("/status/{code}", any(status))
        .route("/sse", any(sse))
        .route("/echo", any(echo))
        .fallback(any(echo))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            record_connection,
        ))
        .with_state(Arc::clone(&state));
    let task = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    FakeWorker { addr, state, task }
}

async fn record_connection(
    State(state): State<Arc<WorkerState>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    if request.uri().path() != "/health" {
        state.data_connections.lock().unwrap().insert(peer);
    }
    next.run(request).await
}

async fn health(State(state): State<Arc<WorkerState>>) -> StatusCode {
    state.health_probes.fetch_add(1, Ordering::SeqCst);
    if state.fail_health.load(Ordering::SeqCst) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

fn named(state: &WorkerState, response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    response
        .headers_mut()
        .insert("x-worker-name", state.name.parse().unwrap());
    response
}

/// Echoes method, path, headers and body as JSON.
async fn echo(State(state): State<Arc<WorkerState>>, request: Request) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        // The request body broke on its way here (the client of the gateway left, say).
        return StatusCode::BAD_REQUEST.into_response();
    };
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
        .collect();
    named(
        &state,
        axum::Json(serde_json::json!({
            "worker": state.name,
            "method": parts.method.as_str(),
            "uri": parts.uri.to_string(),
            "headers": headers,
            "body_len": body.len(),
            "body": String::from_utf8_lossy(&body),
        })),
    )
}

/// Sends a first SSE chunk, then holds the stream open until `release_all`.
async fn hold(State(state): State<Arc<WorkerState>>) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    state.held.fetch_add(1, Ordering::SeqCst);
    state.changed.notify_waiters();
    let mut release = state.release_all.subscribe();
    let start = *release.borrow_and_update();
    let s = Arc::clone(&state);
    let stream = async_stream(move |tx| async move {
        let guard = CountOnDrop(Arc::clone(&s), false, false);
        let _ = tx
            .send(Ok(Bytes::from_static(b"data: {\"first\":true}\n\n")))
            .await;
        while *release.borrow_and_update() == start {
            if release.changed().await.is_err() {
                break;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
        s.held.fetch_sub(1, Ordering::SeqCst);
        let mut guard = guard;
        guard.1 = true;
    });
    named(
        &state,
        (
            [("content-type", "text/event-stream")],
            Body::from_stream(stream),
        ),
    )
}

/// Never answers until released; counts a cancellation when the gateway drops the connection.
async fn stall(State(state): State<Arc<WorkerState>>) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    state.stalled.fetch_add(1, Ordering::SeqCst);
    let mut guard = CountOnDrop(Arc::clone(&state), false, true);
    state.changed.notify_waiters();
    let mut release = state.release_all.subscribe();
    let start = *release.borrow_and_update();
    while *release.borrow_and_update() == start {
        if release.changed().await.is_err() {
            break;
        }
    }
    guard.1 = true;
    named(&state, "released")
}

/// Sends one chunk, then breaks the stream with an error (connection aborted mid-body).
async fn crash(State(state): State<Arc<WorkerState>>) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let stream = futures_util::stream::iter([0, 1]).then(|i| async move {
        if i == 0 {
            Ok(Bytes::from_static(b"data: {\"n\":1}\n\n"))
        } else {
            // Give the first chunk time to leave before the connection is torn down, as a real
            // crash mid-generation would.
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(std::io::Error::other("worker crashed"))
        }
    });
    named(
        &state,
        (
            [("content-type", "text/event-stream")],
            Body::from_stream(stream),
        ),
    )
}

async fn status(
    State(state): State<Arc<WorkerState>>,
    axum::extract::Path(code): axum::extract::Path<u16>,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    named(
        &state,
        (
            StatusCode::from_u16(code).unwrap(),
            axum::Json(serde_json::json!({"error": "injected"})),
        ),
    )
}

/// Streams `n` (query `n`, default 5) SSE chunks, `gap_ms` apart (default 20).
async fn sse(
    State(state): State<Arc<WorkerState>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, u64>>,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let n = q.get("n").copied().unwrap_or(5);
    let gap = Duration::from_millis(q.get("gap_ms").copied().unwrap_or(20));
    let stream = futures_util::stream::iter(0..n)
        .then(move |i| async move {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            Ok::<_, std::io::Error>(Bytes::from(format!("data: {{\"chunk\":{i}}}\n\n")))
        })
        .chain(futures_util::stream::once(async {
            Ok(Bytes::from_static(b"data: [DONE]\n\n"))
        }));
    named(
        &state,
        (
            [("content-type", "text/event-stream")],
            Body::from_stream(stream),
        ),
    )
}

/// A tiny channel-backed stream builder (avoids a dependency on async-stream).
fn async_stream<F, Fut>(f: F) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    tokio_stream_from(rx)
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A config for tests: both listeners on 127.0.0.1:0, quick health probes.
pub fn test_config(workers: &[&FakeWorker]) -> Config {
    let mut config = Config::default();
    config.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
    config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
    config.server.timeouts.shutdown_grace = Duration::from_millis(2_000);
    config.health.interval = Duration::from_millis(100);
    config.health.timeout = Duration::from_millis(500);
    // Tests decide health themselves (dead workers, passive marking): workers start healthy.
    config.health.wait_for_first_probe = false;
    config.telemetry.interval = Duration::from_millis(50);
    config.workers = workers
        .iter()
        .map(|w| WorkerConfig {
            name: Some(w.state.name.clone()),
            url: w.url(),
            ring_id: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            server_name: None,
            models: Vec::new(),
        })
        .collect();
    config
}

/// A gateway started in-process from `config`.
pub async fn start(config: Config) -> RunningGateway {
    gatewayd::start(gatewayd::StartOptions::new(config))
        .await
        .expect("gateway starts")
}

/// The worker the gateway names as preferred for the explicit key `key` right now
/// (`/admin/explain`; keys here are plain ASCII, so the query needs no encoding).
pub async fn preferred_worker(gateway: &RunningGateway, key: &str) -> String {
    let explain: serde_json::Value = client()
        .get(format!(
            "http://{}/admin/explain?routing_key={key}",
            gateway.control_addr
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    explain["preferred"].as_str().unwrap().to_owned()
}

/// An HTTP client that opens a new connection per request (no pooling between test steps).
pub fn client() -> reqwest::Client {
    bch_drill::tls::http_client()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// Every worker record of `GET /admin/workers`.
pub async fn worker_records(gateway: &RunningGateway) -> Vec<serde_json::Value> {
    let mut body: serde_json::Value =
        bch_drill::tls::get(format!("http://{}/admin/workers", gateway.control_addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    match body["workers"].take() {
        serde_json::Value::Array(records) => records,
        other => panic!("/admin/workers without a workers list: {other}"),
    }
}

/// The record of worker `name` in `GET /admin/workers`, if it is listed.
pub async fn worker_record(gateway: &RunningGateway, name: &str) -> Option<serde_json::Value> {
    worker_records(gateway)
        .await
        .into_iter()
        .find(|w| w["name"] == name)
}

/// Active loads per worker name from `GET /admin/workers`.
pub async fn active_loads(gateway: &RunningGateway) -> Vec<(String, u64)> {
    worker_records(gateway)
        .await
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap().to_owned(),
                w["active"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Waits (bounded) until every worker's active load is 0; returns the last loads seen.
pub async fn wait_all_idle(gateway: &RunningGateway) -> Vec<(String, u64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let loads = active_loads(gateway).await;
        if loads.iter().all(|(_, n)| *n == 0) || tokio::time::Instant::now() > deadline {
            return loads;
        }
        // Loads drop when the gateway notices the end of a stream; poll at a short interval.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `cond` holds on the worker state (signalled by `changed`), bounded.
pub async fn wait_for(state: &WorkerState, cond: impl Fn(&WorkerState) -> bool) {
    let deadline = Duration::from_secs(5);
    tokio::time::timeout(deadline, async {
        loop {
            let notified = state.changed.notified();
            if cond(state) {
                return;
            }
            notified.await;
        }
    })
    .await
    .expect("condition reached in time");
}

/// A copy of a response's headers.
pub fn headers_of(response: &reqwest::Response) -> HeaderMap {
    response.headers().clone()
}

/// The state-change lines the real binary's log budget left out for `subject` (a worker's name,
/// or `dns:NAME` for a discovery source), as its summary lines (`repeated state-change lines of
/// SUBJECT were not logged`, with `suppressed=N`) count them, summed over `lines`.
pub fn suppressed_in_summaries<'a>(
    lines: impl IntoIterator<Item = &'a String>,
    subject: &str,
) -> u64 {
    let summary = format!("repeated state-change lines of {subject} were not logged");
    lines
        .into_iter()
        .filter(|l| l.contains(&summary))
        .map(|l| {
            let count = l.split("suppressed=").nth(1).unwrap();
            count
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// The answers of an overload storm, as `(status, has Retry-After)`, sorted into the two a clean
/// shed allows and the rest.
#[derive(Debug, Default)]
pub struct StormAnswers {
    /// `200`s.
    pub ok: usize,
    /// `503`s with `Retry-After`: clean sheds.
    pub shed: usize,
    /// Anything else, as received.
    pub other: Vec<(u16, bool)>,
}

impl StormAnswers {
    /// Sorts `answers`.
    pub fn of(answers: impl IntoIterator<Item = (u16, bool)>) -> StormAnswers {
        let mut sorted = StormAnswers::default();
        for answer in answers {
            match answer {
                (200, _) => sorted.ok += 1,
                (503, true) => sorted.shed += 1,
                unexpected => sorted.other.push(unexpected),
            }
        }
        sorted
    }

    /// Asserts a clean overload: nothing but 200 and 503 with `Retry-After`, and some of each
    /// (a storm that shed nothing was not over capacity).
    pub fn assert_clean_overload(&self) {
        assert!(
            self.other.is_empty(),
            "answers other than 200 and 503 with Retry-After: {:?}",
            self.other
        );
        assert!(
            self.ok > 0 && self.shed > 0,
            "{} ok, {} shed: the storm was not over capacity",
            self.ok,
            self.shed
        );
    }
}
