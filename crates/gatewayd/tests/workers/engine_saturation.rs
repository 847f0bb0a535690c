//! Engine-reported saturation through the real gateway: workers whose `/metrics` report waiting
//! requests and KV-cache usage as the test says. With `[admission] max_waiting` or `max_kv_usage`
//! set, an explicit key whose preferred worker's engine reports more than that moves to the next
//! worker with room (`explicit_routing_key_capacity_spill`) and comes back once the gauges drop;
//! the scraper runs for it under `[load] source = "local"` too, and a report nobody renews stops
//! holding its worker full after `stale_after_ms`.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use bch_core::fleet_load::LoadSource;
use common::client;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use tokio::time::Instant;

/// How an engine answers `GET /metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum Answer {
    /// vLLM's gauges with the engine's numbers.
    Gauges,
    /// 404: the scrape fails, the report is not renewed.
    NotFound,
}

/// One simulated engine's gauges, steered by the test.
struct Engine {
    answer: AtomicUsize,
    waiting: AtomicU64,
    /// KV-cache usage in thousandths.
    kv_permille: AtomicU64,
    scrapes: AtomicU64,
}

impl Engine {
    fn report(&self, waiting: u64, kv_usage: f64) {
        self.waiting.store(waiting, Ordering::SeqCst);
        self.kv_permille
            .store((kv_usage * 1000.0).round() as u64, Ordering::SeqCst);
    }
}

async fn metrics(State(engine): State<Arc<Engine>>) -> Response {
    engine.scrapes.fetch_add(1, Ordering::SeqCst);
    if engine.answer.load(Ordering::SeqCst) == Answer::NotFound as usize {
        return (StatusCode::NOT_FOUND, "no metrics").into_response();
    }
    let waiting = engine.waiting.load(Ordering::SeqCst);
    let kv = engine.kv_permille.load(Ordering::SeqCst) as f64 / 1000.0;
    format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 0.0\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}.0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {kv}\n"
    )
    .into_response()
}

/// A worker that answers every inference request at once and whose `/metrics` is `engine`'s.
async fn worker() -> (SocketAddr, Arc<Engine>) {
    let engine = Arc::new(Engine {
        answer: AtomicUsize::new(Answer::Gauges as usize),
        waiting: AtomicU64::new(0),
        kv_permille: AtomicU64::new(0),
        scrapes: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/{*path}", any(|| async { "{\"ok\":true}" }))
        .with_state(Arc::clone(&engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, engine)
}

/// Three workers `w0`..`w2` and a gateway over them: bounded policy, `source` as given, scraping
/// every 30 ms, samples stale after `stale_after_ms`.
struct Fleet {
    gateway: RunningGateway,
    engines: Vec<(String, Arc<Engine>)>,
}

impl Fleet {
    async fn start(
        source: LoadSource,
        stale_after_ms: u64,
        admission: impl FnOnce(&mut Config),
    ) -> Fleet {
        let mut config = Config::default();
        config.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
        config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
        config.health.wait_for_first_probe = false;
        config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
        config.load.source = source;
        config.load.scrape_interval = Duration::from_millis(30);
        config.load.stale_after = Duration::from_millis(stale_after_ms);
        let mut engines = Vec::new();
        for i in 0..3 {
            let (addr, engine) = worker().await;
            let name = format!("w{i}");
            config.workers.push(WorkerConfig {
                name: Some(name.clone()),
                ..WorkerConfig::from_url(&format!("http://{addr}"))
            });
            engines.push((name, engine));
        }
        admission(&mut config);
        let gateway = common::start(config).await;
        Fleet { gateway, engines }
    }

    /// The engine of the worker called `name`.
    fn engine(&self, name: &str) -> &Engine {
        &self.engines.iter().find(|(n, _)| n == name).unwrap().1
    }

    /// A line of the gateway's `/metrics` for `worker` in `family`, if any.
    fn metric(&self, family: &str, worker: &str) -> Option<f64> {
        let needle = format!("{family}{{worker=\"{worker}\"}} ");
        self.gateway
            .metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix(&needle)?.parse().ok())
    }

    /// Waits (bounded) until `/metrics` shows `value` in `family` for `worker` (`None`: no line):
    /// the engine cell was published before the line, so routing reads the same report.
    async fn until_metric(&self, family: &str, worker: &str, value: Option<f64>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.metric(family, worker) != value {
            assert!(
                Instant::now() < deadline,
                "{family} of {worker} never became {value:?}: {}",
                self.gateway.metrics_text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends one chat request with the explicit routing key `key`; answers the worker that served
    /// it and the decision's branch.
    async fn send(&self, key: &str) -> (String, String) {
        let response = client()
            .post(format!(
                "http://{}/v1/chat/completions",
                self.gateway.data_addr
            ))
            .header("x-smg-routing-key", key)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
        (header("x-bch-worker"), header("x-bch-branch"))
    }

    /// Sends `key` and asserts that `worker` served it as the key's plain hit (not full).
    async fn assert_hit(&self, key: &str, worker: &str) {
        let (served, branch) = self.send(key).await;
        assert_eq!(
            (served.as_str(), branch.as_str()),
            (worker, "explicit_routing_key_hit")
        );
    }

    /// Sends `key` and asserts that `worker`, its preferred worker, was skipped as full (`why`)
    /// and another served it as the key's capacity spill.
    async fn assert_spilled(&self, key: &str, worker: &str, why: &str) {
        let (served, branch) = self.send(key).await;
        assert_ne!(served, worker, "{why}");
        assert_eq!(branch, SPILL, "{why}");
    }

    /// Waits (bounded) until `/metrics` counts at least `at_least` failed scrapes of `worker`
    /// for `reason`.
    async fn until_failures(&self, worker: &str, reason: &str, at_least: u64) {
        let needle =
            format!("bch_load_scrape_failures_total{{worker=\"{worker}\",reason=\"{reason}\"}} ");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let metrics = self.gateway.metrics_text();
            let counted = metrics
                .lines()
                .find_map(|l| l.strip_prefix(&needle)?.parse::<u64>().ok())
                .unwrap_or(0);
            if counted >= at_least {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{reason} failures of {worker} never reached {at_least}: {metrics}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Puts `json` in force as the admission patch (`PUT /admin/policy`).
    async fn set_admission(&self, json: &str) {
        let response = client()
            .put(format!("http://{}/admin/policy", self.gateway.control_addr))
            .header("content-type", "application/json")
            .body(format!("{{\"admission\":{json}}}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
    }
}

const SPILL: &str = "explicit_routing_key_capacity_spill";

/// `max_waiting` under `[load] source = "local"`: no scraping until an engine limit is set at run
/// time; then a preferred worker whose engine reports more waiting requests than the limit is
/// skipped by its explicit key, and taken again once its gauge drops to the limit.
#[tokio::test]
async fn max_waiting_moves_an_explicit_key_and_brings_it_back() {
    let fleet = Fleet::start(LoadSource::Local, 500, |_| {}).await;
    let preferred = common::preferred_worker(&fleet.gateway, "k").await;
    fleet.engine(&preferred).report(5, 0.0);
    fleet.assert_hit("k", &preferred).await;
    for (name, engine) in &fleet.engines {
        assert_eq!(
            engine.scrapes.load(Ordering::SeqCst),
            0,
            "{name}: local load without an engine limit scrapes nothing"
        );
    }
    fleet.set_admission(r#"{"max_waiting":2}"#).await;
    fleet
        .until_metric("bch_worker_engine_waiting", &preferred, Some(5.0))
        .await;
    for _ in 0..3 {
        fleet
            .assert_spilled("k", &preferred, "5 waiting > max_waiting 2: full")
            .await;
    }
    // The rule reads local load: no load sample is published for engine reports alone.
    let metrics = fleet.gateway.metrics_text();
    assert!(!metrics.contains("bch_worker_reported_load{"), "{metrics}");
    // At the limit is not over it.
    fleet.engine(&preferred).report(2, 0.0);
    fleet
        .until_metric("bch_worker_engine_waiting", &preferred, Some(2.0))
        .await;
    fleet.assert_hit("k", &preferred).await;
    // No engine limit any more: scraping stops and the reports are forgotten.
    fleet.set_admission(r#"{"max_waiting":0}"#).await;
    let workers = fleet.engines.iter().map(|(n, _)| n.clone());
    for name in workers {
        fleet
            .until_metric("bch_worker_engine_waiting", &name, None)
            .await;
    }
    fleet.gateway.shutdown().await;
}

/// `max_kv_usage` under `worker_metrics` (set in the configuration): a KV usage at the limit is
/// full, below it is not.
#[tokio::test]
async fn max_kv_usage_moves_an_explicit_key_and_brings_it_back() {
    let fleet = Fleet::start(LoadSource::WorkerMetrics, 500, |config| {
        config.admission.max_kv_usage = 0.9;
    })
    .await;
    let preferred = common::preferred_worker(&fleet.gateway, "k").await;
    fleet.engine(&preferred).report(0, 0.9);
    fleet
        .until_metric("bch_worker_engine_kv_usage", &preferred, Some(0.9))
        .await;
    fleet
        .assert_spilled("k", &preferred, "KV usage 0.9 at max_kv_usage 0.9: full")
        .await;
    assert_eq!(
        fleet.metric("bch_worker_engine_waiting", &preferred),
        Some(0.0)
    );
    fleet.engine(&preferred).report(0, 0.5);
    fleet
        .until_metric("bch_worker_engine_kv_usage", &preferred, Some(0.5))
        .await;
    fleet.assert_hit("k", &preferred).await;
    fleet.gateway.shutdown().await;
}

/// A saturated worker whose scrapes start failing stays full while its last report is fresh (a
/// timeout is what an overloaded engine's metrics endpoint gives first), and is taken again once
/// the report is `stale_after_ms` old: a report nobody renews never holds a worker full for good.
#[tokio::test]
async fn a_report_nobody_renews_stops_holding_its_worker_full() {
    // A long staleness bound first: failures alone do not free the worker.
    let fleet = Fleet::start(LoadSource::Local, 60_000, |config| {
        config.admission.max_waiting = 1;
    })
    .await;
    let preferred = common::preferred_worker(&fleet.gateway, "k").await;
    fleet.engine(&preferred).report(3, 0.0);
    fleet
        .until_metric("bch_worker_engine_waiting", &preferred, Some(3.0))
        .await;
    fleet
        .engine(&preferred)
        .answer
        .store(Answer::NotFound as usize, Ordering::SeqCst);
    fleet.until_failures(&preferred, "http_status", 3).await;
    fleet
        .assert_spilled("k", &preferred, "the last report is still fresh")
        .await;
    fleet.gateway.shutdown().await;

    // A short one: the report is forgotten, and the worker takes its key again.
    let fleet = Fleet::start(LoadSource::Local, 200, |config| {
        config.admission.max_waiting = 1;
    })
    .await;
    let preferred = common::preferred_worker(&fleet.gateway, "k").await;
    fleet.engine(&preferred).report(3, 0.0);
    fleet
        .until_metric("bch_worker_engine_waiting", &preferred, Some(3.0))
        .await;
    fleet
        .assert_spilled("k", &preferred, "3 waiting > max_waiting 1: full")
        .await;
    fleet
        .engine(&preferred)
        .answer
        .store(Answer::NotFound as usize, Ordering::SeqCst);
    fleet
        .until_metric("bch_worker_engine_waiting", &preferred, None)
        .await;
    fleet.assert_hit("k", &preferred).await;
    fleet.gateway.shutdown().await;
}

/// A KV usage outside 0..1 is refused like a NaN load: the scrape fails as `bad_value`, and the
/// engine report is not renewed from it.
#[tokio::test]
async fn a_kv_usage_outside_zero_to_one_is_a_bad_value() {
    let fleet = Fleet::start(LoadSource::WorkerMetrics, 500, |_| {}).await;
    let name = fleet.engines[0].0.clone();
    fleet.engine(&name).report(0, 42.0);
    fleet.until_failures(&name, "bad_value", 2).await;
    // The report of a scrape before the bad value stays until it is stale, then goes: a bad
    // value never renews it.
    fleet
        .until_metric("bch_worker_engine_kv_usage", &name, None)
        .await;
    fleet.engine(&name).report(0, 0.25);
    fleet
        .until_metric("bch_worker_engine_kv_usage", &name, Some(0.25))
        .await;
    fleet.gateway.shutdown().await;
}
