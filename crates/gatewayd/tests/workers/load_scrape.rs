//! The load scraper against real HTTP servers that misbehave on `/metrics`: 404, garbage, a gauge
//! line that does not parse, a huge body (declared and chunked), a hang. Each falls back to local
//! load, counts the failure in `/metrics` by reason, keeps routing (which never waits for a scrape)
//! and recovers when the worker answers well again. The real binary logs each change once, and
//! a worker whose scrapes or probes flap every round within a budget of lines per period.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use bch_core::fleet_load::LoadSource;
use common::client;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use serde_json::Value;
use tokio::time::Instant;

/// How a fake worker answers `GET /metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum Mode {
    /// vLLM gauges reporting `Reporting::load` requests.
    Good,
    NotFound,
    /// A 200 with an HTML page.
    Garbage,
    /// A 200 with a vLLM gauge whose value is not a number.
    Unparsable,
    /// A 200 with a vLLM gauge of 1e300 running requests (above the plausibility bound).
    Absurd,
    /// A 200 declaring 8 MiB.
    HugeDeclared,
    /// A 200 streaming 2 MiB in chunks without a length.
    HugeChunked,
    /// Accepts, then never answers.
    Hang,
    /// 404 and good answers by turns, `Reporting::flaps` of them (404 first), then `Good`.
    Flapping,
}

const MODES: [Mode; 9] = [
    Mode::Good,
    Mode::NotFound,
    Mode::Garbage,
    Mode::Unparsable,
    Mode::Absurd,
    Mode::HugeDeclared,
    Mode::HugeChunked,
    Mode::Hang,
    Mode::Flapping,
];

struct Reporting {
    mode: AtomicUsize,
    load: AtomicU64,
    scrapes: AtomicU64,
    hanging: AtomicUsize,
    /// Answers left to flap (`Mode::Flapping`).
    flaps: AtomicU64,
    /// Health probes answered.
    probes: AtomicU64,
    /// Health answers left to flap: 503 and 200 by turns (503 first), then 200.
    health_flaps: AtomicU64,
}

impl Reporting {
    fn set(&self, mode: Mode) {
        self.mode.store(mode as usize, Ordering::SeqCst);
    }
}

/// Decrements the hanging count when a hung scrape is dropped (the gateway gave up on it).
struct Hung(Arc<Reporting>);

impl Drop for Hung {
    fn drop(&mut self) {
        self.0.hanging.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn metrics(State(state): State<Arc<Reporting>>) -> Response {
    state.scrapes.fetch_add(1, Ordering::SeqCst);
    let load = state.load.load(Ordering::SeqCst);
    let mut mode = MODES[state.mode.load(Ordering::SeqCst)];
    if mode == Mode::Flapping {
        // An even count flaps 404 first and ends on a good answer, then stays good.
        let left = state.flaps.fetch_sub(1, Ordering::SeqCst);
        if left == 1 {
            state.set(Mode::Good);
        }
        mode = if left % 2 == 0 {
            Mode::NotFound
        } else {
            Mode::Good
        };
    }
    match mode {
        Mode::Flapping => unreachable!("resolved above"),
        Mode::Good => format!(
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"m\"}} {load}.0\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"m\"}} 0.0\n"
        )
        .into_response(),
        Mode::NotFound => (StatusCode::NOT_FOUND, "no metrics here").into_response(),
        Mode::Garbage => "<html><body>Welcome to nginx!</body></html>".into_response(),
        Mode::Unparsable => "vllm:num_requests_running lots\n".into_response(),
        Mode::Absurd => "vllm:num_requests_running 1e300\n".into_response(),
        Mode::HugeDeclared => (
            [(header::CONTENT_LENGTH, (8u64 << 20).to_string())],
            Body::from_stream(futures_util::stream::repeat_with(|| {
                Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b'#'; 64 * 1024]))
            })),
        )
            .into_response(),
        Mode::HugeChunked => Body::from_stream(futures_util::stream::iter((0..32).map(|_| {
            Ok::<_, std::io::Error>(axum::body::Bytes::from(
                "# padding padding padding padding\n".repeat(2_000),
            ))
        })))
        .into_response(),
        Mode::Hang => {
            state.hanging.fetch_add(1, Ordering::SeqCst);
            let _hung = Hung(Arc::clone(&state));
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

/// `GET /health`: 200, or 503 and 200 by turns while `Reporting::health_flaps` lasts.
async fn health(State(state): State<Arc<Reporting>>) -> StatusCode {
    state.probes.fetch_add(1, Ordering::SeqCst);
    let flapping = state
        .health_flaps
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        });
    match flapping {
        Ok(left) if left % 2 == 0 => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    }
}

/// A worker whose inference and health routes work and whose `/metrics` answers as told.
async fn misbehaving_worker(mode: Mode) -> (SocketAddr, Arc<Reporting>) {
    let state = Arc::new(Reporting {
        mode: AtomicUsize::new(mode as usize),
        load: AtomicU64::new(0),
        scrapes: AtomicU64::new(0),
        hanging: AtomicUsize::new(0),
        flaps: AtomicU64::new(0),
        probes: AtomicU64::new(0),
        health_flaps: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/{*path}", any(|| async { "{\"ok\":true}" }))
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, state)
}

fn config(addr: SocketAddr) -> Config {
    let mut config = Config::default();
    config.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
    config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    config.load.source = LoadSource::WorkerMetrics;
    config.load.scrape_interval = Duration::from_millis(50);
    config.load.stale_after = Duration::from_millis(300);
    config.workers = vec![WorkerConfig {
        name: Some("w".into()),
        ..WorkerConfig::from_url(&format!("http://{addr}"))
    }];
    config
}

async fn get_json(gateway: &RunningGateway, path: &str) -> Value {
    client()
        .get(format!("http://{}{path}", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn record(gateway: &RunningGateway) -> Value {
    get_json(gateway, "/admin/workers").await["workers"][0].clone()
}

/// `bch_load_scrape_failures_total{worker="w",reason=…}` in the gateway's `/metrics`.
fn failures(gateway: &RunningGateway, reason: &str) -> u64 {
    let needle = format!("bch_load_scrape_failures_total{{worker=\"w\",reason=\"{reason}\"}} ");
    gateway
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&needle)?.parse().ok())
        .unwrap_or(0)
}

/// Polls `cond` on the gateway's worker record until it holds (bounded).
async fn wait_record(gateway: &RunningGateway, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let record = record(gateway).await;
        if cond(&record) {
            return record;
        }
        assert!(Instant::now() < deadline, "{what}: {record}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn chat(gateway: &RunningGateway) -> reqwest::Response {
    client()
        .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
        .header("x-smg-routing-key", "k")
        .body("{}")
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn each_bad_answer_falls_back_to_local_load_and_is_counted() {
    for (mode, reason) in [
        (Mode::NotFound, "http_status"),
        (Mode::Garbage, "no_gauges"),
        (Mode::Unparsable, "unparsable"),
        (Mode::Absurd, "bad_value"),
        (Mode::HugeDeclared, "too_large"),
        (Mode::HugeChunked, "too_large"),
        (Mode::Hang, "timeout"),
    ] {
        let (addr, reporting) = misbehaving_worker(mode).await;
        let gateway = gatewayd::start(gatewayd::StartOptions::new(config(addr)))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while failures(&gateway, reason) < 3 {
            assert!(
                Instant::now() < deadline,
                "{mode:?}: no {reason} failures counted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let record = record(&gateway).await;
        assert_eq!(record["load_stale"], true, "{mode:?}: {record}");
        assert!(record.get("reported_load").is_none(), "{mode:?}: {record}");
        let explain = get_json(&gateway, "/admin/explain?routing_key=k").await;
        assert_eq!(explain["fleet_loads"][0]["signal"], "local", "{mode:?}");
        assert_eq!(explain["load_signal"], "local", "{mode:?}");
        // Routing goes on, on local load.
        let response = chat(&gateway).await;
        assert_eq!(response.status(), 200, "{mode:?}");
        assert_eq!(response.headers()["x-bch-worker"], "w");
        if mode == Mode::Hang {
            // Every hung scrape was given up (timeout below the 50 ms interval), not piled up.
            assert!(reporting.hanging.load(Ordering::SeqCst) <= 1);
            assert!(reporting.scrapes.load(Ordering::SeqCst) >= 3);
        }
        // The worker answers well again: its report is used at once.
        reporting.load.store(4, Ordering::SeqCst);
        reporting.set(Mode::Good);
        let record = wait_record(&gateway, "recovery", |r| r["load_stale"] == false).await;
        assert_eq!(record["reported_load"], 4, "{mode:?}");
        assert_eq!(record["load"], 4, "{mode:?}: the rule reads the report");
        gateway.shutdown().await;
    }
}

/// A request is routed and answered while a scrape of its worker hangs: the decision reads the
/// last published numbers and never waits for the scraper.
#[tokio::test]
async fn routing_never_waits_for_a_hung_scrape() {
    let (addr, reporting) = misbehaving_worker(Mode::Good).await;
    reporting.load.store(2, Ordering::SeqCst);
    let mut config = config(addr);
    // A long interval and timeout, so a hung scrape is in progress for a long time.
    config.load.scrape_interval = Duration::from_millis(5_000);
    config.load.stale_after = Duration::from_millis(60_000);
    let gateway = gatewayd::start(gatewayd::StartOptions::new(config))
        .await
        .unwrap();
    wait_record(&gateway, "first scrape", |r| r["reported_load"] == 2).await;
    reporting.set(Mode::Hang);
    let deadline = Instant::now() + Duration::from_secs(10);
    while reporting.hanging.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no scrape hung");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..5 {
        let response = chat(&gateway).await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            reporting.hanging.load(Ordering::SeqCst),
            1,
            "answered while the scrape still hangs"
        );
    }
    let record = record(&gateway).await;
    assert_eq!(
        record["load_stale"], false,
        "the last good sample is still fresh"
    );
    assert_eq!(record["reported_load"], 2);
    gateway.shutdown().await;
}

/// A good worker that starts hanging keeps its last sample until `stale_after_ms`, then falls
/// back to local load; a good answer brings the report back.
#[tokio::test]
async fn a_sample_goes_stale_after_stale_after_ms() {
    let (addr, reporting) = misbehaving_worker(Mode::Good).await;
    reporting.load.store(7, Ordering::SeqCst);
    let gateway = gatewayd::start(gatewayd::StartOptions::new(config(addr)))
        .await
        .unwrap();
    wait_record(&gateway, "first scrape", |r| r["load"] == 7).await;
    reporting.set(Mode::NotFound);
    let stale = wait_record(&gateway, "stale", |r| r["load_stale"] == true).await;
    assert_eq!(stale["load"], 0, "local load once stale: {stale}");
    assert_eq!(stale["reported_load"], 7, "the last report stays visible");
    assert!(stale["scrape_age_ms"].as_u64().unwrap() >= 300, "{stale}");
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains("bch_worker_load_stale{worker=\"w\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("bch_worker_reported_load{worker=\"w\"} 7"),
        "{metrics}"
    );
    reporting.set(Mode::Good);
    wait_record(&gateway, "fresh again", |r| r["load_stale"] == false).await;
    gateway.shutdown().await;
}

/// Switching the load source at run time through `PUT /admin/policy`: scraping starts, and stops
/// (with the samples forgotten) when the source goes back to local.
#[tokio::test]
async fn the_load_source_switches_at_run_time() {
    let (addr, reporting) = misbehaving_worker(Mode::Good).await;
    reporting.load.store(3, Ordering::SeqCst);
    let mut config = config(addr);
    config.load.source = LoadSource::Local;
    let gateway = gatewayd::start(gatewayd::StartOptions::new(config))
        .await
        .unwrap();
    let put = |source: &'static str| {
        let url = format!("http://{}/admin/policy", gateway.control_addr);
        async move {
            let response = client()
                .put(url)
                .header("content-type", "application/json")
                .body(format!("{{\"load_source\":\"{source}\"}}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.unwrap()
        }
    };
    let record = record(&gateway).await;
    assert!(record.get("reported_load").is_none() && record["load_stale"] == false);
    assert_eq!(
        reporting.scrapes.load(Ordering::SeqCst),
        0,
        "no scraping in local mode"
    );
    assert_eq!(put("worker_metrics").await["load_source"], "worker_metrics");
    wait_record(&gateway, "scraped", |r| r["load"] == 3).await;
    assert!(
        gateway
            .metrics_text()
            .contains("bch_load_source{source=\"worker_metrics\"} 1")
    );
    assert_eq!(put("local").await["load_source"], "local");
    let record = wait_record(&gateway, "forgotten", |r| r.get("reported_load").is_none()).await;
    assert_eq!(record["load"], 0);
    let refused = client()
        .put(format!("http://{}/admin/policy", gateway.control_addr))
        .header("content-type", "application/json")
        .body("{\"load_source\":\"prometheus\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body = refused.text().await.unwrap();
    assert!(body.contains("load_source"), "{body}");
    gateway.shutdown().await;
}

/// The real binary warns once per change of a worker's scrape state, not once per scrape.
#[tokio::test]
async fn the_daemon_warns_once_per_change_of_state() {
    let (addr, reporting) = misbehaving_worker(Mode::NotFound).await;
    let daemon = LoggedDaemon::start(&format!(
        "[load]\nsource = \"worker_metrics\"\nscrape_interval_ms = 20\nstale_after_ms = 100\n[[workers]]\nname = \"w\"\nurl = \"http://{addr}\"\n"
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    // 404 for at least 20 rounds, then garbage for 20, then good.
    for (next, scrapes) in [(Mode::Garbage, 20), (Mode::Good, 40), (Mode::Good, 60)] {
        while reporting.scrapes.load(Ordering::SeqCst) < scrapes {
            assert!(Instant::now() < deadline, "the daemon stopped scraping");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        reporting.set(next);
    }
    // Stopping asserts that nothing panicked.
    let lines = daemon.stop();
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("reason=http_status"), 1, "{lines:#?}");
    assert_eq!(count("reason=no_gauges"), 1, "{lines:#?}");
    assert_eq!(count("load scrape works again"), 1, "{lines:#?}");
}

/// The real binary started on `toml` (free ports), its stderr collected line by line.
struct LoggedDaemon {
    child: std::process::Child,
    control: String,
    stderr: std::sync::mpsc::Receiver<String>,
    lines: Vec<String>,
}

impl LoggedDaemon {
    async fn start(toml: &str) -> LoggedDaemon {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gatewayd.toml");
        std::fs::write(
            &path,
            format!("[server]\nlisten = \"127.0.0.1:0\"\ncontrol_listen = \"127.0.0.1:0\"\n{toml}"),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gatewayd"))
            .args(["--config", path.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut daemon = LoggedDaemon {
            child,
            control: String::new(),
            stderr: rx,
            lines: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while daemon.control.is_empty() {
            daemon.read();
            if let Some(control) = daemon.lines.iter().find_map(|l| {
                let rest = l.split("control_plane=http://").nth(1)?;
                Some(rest.split_whitespace().next()?.to_owned())
            }) {
                daemon.control = control;
            }
            assert!(
                Instant::now() < deadline,
                "no start-up line: {:#?}",
                daemon.lines
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        daemon
    }

    fn read(&mut self) {
        self.lines.extend(self.stderr.try_iter());
    }

    /// Lines containing any of `needles`.
    fn count(&self, needles: &[&str]) -> usize {
        self.lines
            .iter()
            .filter(|l| needles.iter().any(|n| l.contains(n)))
            .count()
    }

    /// The `/metrics` text.
    async fn metrics(&self) -> String {
        client()
            .get(format!("http://{}/metrics", self.control))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits (bounded) until `component`'s suppressed lines (a positive count) are all summed up
    /// in the summary lines of worker `w` (the last period's when it ends); answers the count and
    /// the `/metrics` text it was read from.
    async fn all_suppressed_summed_up(&mut self, component: &str) -> (u64, String) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = self.metrics().await;
            let suppressed = value_of(
                &text,
                &format!("bch_log_lines_suppressed_total{{component=\"{component}\"}}"),
            );
            self.read();
            let summed = common::suppressed_in_summaries(&self.lines, "w");
            if suppressed > 0 && summed == suppressed {
                return (suppressed, text);
            }
            assert!(
                Instant::now() < deadline,
                "suppressed {suppressed}, summed up {summed}: {:#?}",
                self.lines
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stop(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.read();
        assert!(
            self.lines.iter().all(|l| !l.contains("panicked")),
            "{:#?}",
            self.lines
        );
        self.lines
    }
}

/// The value of the series `needle` (name and labels) in a `/metrics` text; 0 when absent.
fn value_of(text: &str, needle: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(needle)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (bounded) until `done`; answers how long the wait took.
async fn timed(what: &str, done: impl Fn() -> bool) -> Duration {
    let began = Instant::now();
    while !done() {
        assert!(began.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    began.elapsed()
}

const FLAPS: u64 = 120;
const LINES: usize = 2;
const PERIOD: Duration = Duration::from_millis(500);

/// Asserts that a flood of `FLAPS` changes over `lasted` logged at most `LINES` lines per
/// `PERIOD` (`logged`), and that every change was logged or counted (`suppressed`). A late answer
/// is a timeout, a change as well unless two in a row were late, and a check given up before the
/// worker saw it is one more: the total is within a quarter of `FLAPS`.
fn assert_bounded(logged: usize, suppressed: u64, lasted: Duration, lines: &[String]) {
    assert!(
        lasted > 2 * PERIOD,
        "the flood outlasts several periods: {lasted:?}"
    );
    let periods = (lasted.as_millis() / PERIOD.as_millis()) as usize + 2;
    assert!(
        logged <= LINES * periods,
        "{logged} lines in {lasted:?}: {lines:#?}"
    );
    let changes = logged as u64 + suppressed;
    assert!(
        (FLAPS * 3 / 4..=FLAPS * 5 / 4).contains(&changes),
        "{logged} logged + {suppressed} suppressed of {FLAPS} changes"
    );
}

/// The real binary with the flood tests' log budget (`LINES` per `PERIOD`), `section` (the
/// scraper's or prober's settings, TOML) and the one worker `w` at `addr`.
async fn flood_daemon(section: &str, addr: SocketAddr) -> LoggedDaemon {
    LoggedDaemon::start(&format!(
        "[log]\nstate_change_lines = {LINES}\nstate_change_period_ms = {}\n{section}[[workers]]\nname = \"w\"\nurl = \"http://{addr}\"\n",
        PERIOD.as_millis()
    ))
    .await
}

/// Worker `w`'s failures in the metrics `text`: the counter `family` summed over `reasons`.
fn failures_of_w(text: &str, family: &str, reasons: &[&str]) -> u64 {
    reasons
        .iter()
        .map(|reason| {
            value_of(
                text,
                &format!("{family}{{worker=\"w\",reason=\"{reason}\"}}"),
            )
        })
        .sum()
}

/// A worker whose scrapes alternate 404 and good answers changes state every round; the real
/// binary logs at most `[log] state_change_lines` of those changes per `state_change_period_ms`,
/// over several periods, and `bch_log_lines_suppressed_total{component="scraper"}` and the
/// summary lines account for every one it did not log. The worker's state still changes every
/// round: every 404 is counted as a failure.
#[tokio::test]
async fn a_flapping_worker_logs_a_bounded_number_of_lines_and_counts_the_rest() {
    let (addr, reporting) = misbehaving_worker(Mode::Good).await;
    let mut daemon = flood_daemon(
        "[load]\nsource = \"worker_metrics\"\nscrape_interval_ms = 25\nstale_after_ms = 2000\n",
        addr,
    )
    .await;
    timed("the daemon does not scrape", || {
        reporting.scrapes.load(Ordering::SeqCst) >= 3
    })
    .await;
    reporting.flaps.store(FLAPS, Ordering::SeqCst);
    reporting.set(Mode::Flapping);
    let lasted = timed("the daemon stopped scraping", || {
        MODES[reporting.mode.load(Ordering::SeqCst)] != Mode::Flapping
    })
    .await;
    let (suppressed, text) = daemon.all_suppressed_summed_up("scraper").await;
    let changes = ["load scrape failed", "load scrape works again"];
    let logged = daemon.count(&changes);
    let lines = daemon.stop();
    assert_bounded(logged, suppressed, lasted, &lines);
    let failed = failures_of_w(
        &text,
        "bch_load_scrape_failures_total",
        &["http_status", "timeout"],
    );
    assert!(failed >= FLAPS / 2, "every 404 is counted: {failed}");
    // The log's last word on the worker is the state it ended in: good (a line of its own, or
    // the summary of the last period naming it).
    let last = lines
        .iter()
        .rev()
        .find(|l| changes.iter().any(|c| l.contains(c)) || l.contains("it is now"))
        .unwrap();
    assert!(
        last.contains("load scrape works again") || last.contains("it is now scraped well"),
        "{last}"
    );
}

/// A worker whose health probes alternate 503 and 200 (thresholds of 1) flips its health every
/// round; the prober's lines have the same budget per worker
/// (`bch_log_lines_suppressed_total{component="prober"}`), and its health still flips each time.
#[tokio::test]
async fn a_worker_flapping_its_health_logs_a_bounded_number_of_lines_and_counts_the_rest() {
    let (addr, reporting) = misbehaving_worker(Mode::Good).await;
    let mut daemon = flood_daemon(
        "[health]\ninterval_ms = 25\ntimeout_ms = 20\nunhealthy_threshold = 1\nhealthy_threshold = 1\n",
        addr,
    )
    .await;
    timed("the daemon does not probe", || {
        reporting.probes.load(Ordering::SeqCst) >= 3
    })
    .await;
    reporting.health_flaps.store(FLAPS, Ordering::SeqCst);
    let lasted = timed("the daemon stopped probing", || {
        reporting.health_flaps.load(Ordering::SeqCst) == 0
    })
    .await;
    let (suppressed, text) = daemon.all_suppressed_summed_up("prober").await;
    let logged = daemon.count(&["worker marked unhealthy", "worker healthy again"]);
    let lines = daemon.stop();
    assert_bounded(logged, suppressed, lasted, &lines);
    let failed = failures_of_w(&text, "bch_probe_failures_total", &["status", "timeout"]);
    assert!(failed >= FLAPS / 2, "every 503 is counted: {failed}");
}
