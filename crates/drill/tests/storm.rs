//! Storms against simulated workers and tiny fake gateways on 127.0.0.1.
//!
//! These run on real time: the storm's per-request timeout is a timer that paused tokio time would
//! fire early whenever every task waits on socket readiness. The storms are small enough to take a
//! fraction of a second, and no assertion depends on wall-clock speed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use axum::response::IntoResponse as _;
use axum::routing::{get, post};
use bch_drill::sim::SimConfig;
use bch_drill::storm::{StormConfig, TtftBasis, run_storm};
use bch_drill::worker::{WorkerHandle, spawn_worker};
use reqwest::Url;
use serde_json::json;

async fn worker() -> WorkerHandle {
    spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "w",
        SimConfig::default(),
    )
    .await
    .unwrap()
}

async fn serve(app: Router) -> Url {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Url::parse(&format!("http://{addr}")).unwrap()
}

fn small(gateway: Url, stream: bool) -> StormConfig {
    StormConfig {
        gateway,
        groups: 6,
        siblings: 4,
        keys: 2,
        concurrency: 2,
        stream,
        prefix_tokens: 64,
        suffix_tokens: 8,
        max_tokens: 4,
        progress: false,
        ..StormConfig::default()
    }
}

#[tokio::test]
async fn a_streaming_storm_straight_at_a_worker_reports_everything() {
    let w = worker().await;
    let report = run_storm(&small(Url::parse(&w.url()).unwrap(), true))
        .await
        .unwrap();

    assert_eq!(
        (report.requests, report.ok, report.errors),
        (24, 24, 0),
        "{report}"
    );
    assert_eq!(report.status_counts.get(&200), Some(&24));
    // No gateway headers: placement and branch are unknown.
    assert_eq!(report.placement["storm-key-0"]["unknown"], 12);
    assert_eq!(report.placement["storm-key-1"]["unknown"], 12);
    assert_eq!(report.per_worker["unknown"], 24);
    assert_eq!(report.branches["unknown"], 24);
    assert_eq!(
        (report.spill_fraction, report.hottest_worker_share),
        (0.0, 1.0)
    );
    // 64 + 8 tokens per prompt, the usage chunk of every stream counted.
    assert_eq!(report.prompt_tokens, 24 * 72);
    assert_eq!(report.completion_tokens, 24 * 4);
    // Later groups of each key find its 64-token prefix cached (four 16-token blocks).
    assert!(report.cached_tokens >= 16 * 64, "{report}");
    assert!(report.cached_token_fraction > 0.5 && report.cached_token_fraction < 1.0);
    assert_eq!(report.ttft.basis, TtftBasis::FirstSseData);
    assert_eq!(report.ttft.samples, 24);
    assert!(report.ttft.p50_ms > 0.0 && report.ttft.p99_ms >= report.ttft.p50_ms);
    assert!(report.throughput_rps > 0.0 && report.duration_s > 0.0);
    assert_eq!(report.drain, None);
    assert_eq!(w.stats().completed_total, 24);

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["status_counts"]["200"], 24);
    assert_eq!(json["ttft"]["basis"], "first_sse_data");
    let text = report.to_string();
    assert!(
        text.contains("storm-key-0") && text.contains("first SSE data chunk"),
        "{text}"
    );
}

#[tokio::test]
async fn a_non_streaming_storm_measures_the_full_response() {
    let w = worker().await;
    let report = run_storm(&small(Url::parse(&w.url()).unwrap(), false))
        .await
        .unwrap();
    assert_eq!((report.ok, report.errors), (24, 0));
    assert_eq!(report.ttft.basis, TtftBasis::FullResponse);
    assert_eq!(report.prompt_tokens, 24 * 72);
    assert!(report.cached_tokens > 0);
    // Full response includes 3 decode steps of at least 10 ms after the first token.
    assert!(report.ttft.mean_ms >= 30.0, "{}", report.ttft.mean_ms);
}

/// A fake gateway: answers like a worker but names a worker per key and marks every other request
/// as spilled.
fn fake_gateway() -> Router {
    let counter = Arc::new(AtomicU64::new(0));
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(move |headers: HeaderMap| {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                async move {
                    let key = headers["x-smg-routing-key"].to_str().unwrap().to_owned();
                    let (worker, branch) = if n.is_multiple_of(2) {
                        (format!("home-of-{key}"), "explicit_routing_key_hit")
                    } else {
                        ("spare".to_owned(), "explicit_routing_key_spillover")
                    };
                    let body = json!({"usage": {"prompt_tokens": 100, "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 25}}});
                    (
                        [
                            ("x-bch-worker", worker),
                            ("x-bch-branch", branch.to_owned()),
                        ],
                        axum::Json(body),
                    )
                }
            }),
        )
}

fn fake_control(active: u64) -> Router {
    Router::new().route(
        "/admin/workers",
        get(move || async move {
            axum::Json(json!({"workers": [
                {"name": "a", "url": "http://a", "healthy": true, "active": 0, "requests_total": 1,
                 "spilled_in_total": 0, "spilled_out_total": 0, "errors_total": 0},
                {"name": "b", "url": "http://b", "healthy": true, "active": active, "requests_total": 1,
                 "spilled_in_total": 0, "spilled_out_total": 0, "errors_total": 0},
            ]}))
        }),
    )
}

#[tokio::test]
async fn placement_branches_spill_and_drain_come_from_the_gateway() {
    let gateway = serve(fake_gateway()).await;
    let control = serve(fake_control(0)).await;
    let config = StormConfig {
        control: Some(control),
        ..small(gateway, false)
    };
    let report = run_storm(&config).await.unwrap();

    assert_eq!(report.ok, 24);
    assert_eq!(report.spill_fraction, 0.5);
    assert_eq!(report.branches["explicit_routing_key_spillover"], 12);
    assert_eq!(report.branches["explicit_routing_key_hit"], 12);
    assert_eq!(report.per_worker["spare"], 12);
    assert_eq!(report.hottest_worker_share, 0.5);
    let key0 = &report.placement["storm-key-0"];
    assert_eq!(
        key0.get("home-of-storm-key-0").copied().unwrap_or(0) + key0["spare"],
        12
    );
    assert_eq!(report.cached_token_fraction, 0.25);
    let drain = report.drain.unwrap();
    assert!(drain.all_zero);
    assert_eq!(drain.active["b"], 0);
}

#[tokio::test]
async fn a_worker_that_never_drains_is_reported() {
    let gateway = serve(fake_gateway()).await;
    let control = serve(fake_control(3)).await;
    let config = StormConfig {
        control: Some(control),
        drain_timeout: Duration::from_millis(100),
        ..small(gateway, false)
    };
    let report = run_storm(&config).await.unwrap();
    let drain = report.drain.clone().unwrap();
    assert!(!drain.all_zero);
    assert_eq!(drain.active["b"], 3);
    assert!(report.to_string().contains("NOT DRAINED"));
}

#[tokio::test]
async fn an_unreachable_gateway_is_one_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    drop(listener);
    let error = run_storm(&small(url.clone(), true)).await.unwrap_err();
    let text = format!("{error:#}");
    assert!(
        text.contains(&format!("gateway {url} is unreachable")),
        "{text}"
    );
    assert!(!text.contains('\n'));
}

/// A fake gateway whose answers cycle through the ways a request can end: a 503, a 200 whose stream
/// never reaches `data: [DONE]`, no answer before the storm's timeout, and a complete stream.
fn mixed_gateway() -> Router {
    let counter = Arc::new(AtomicU64::new(0));
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(move || {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                async move {
                    let sse = [("content-type", "text/event-stream")];
                    match n % 4 {
                        0 => (axum::http::StatusCode::SERVICE_UNAVAILABLE, sse, "busy\n"),
                        1 => (axum::http::StatusCode::OK, sse, "data: {}\n\n"),
                        2 => {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            (axum::http::StatusCode::OK, sse, "")
                        }
                        _ => (
                            axum::http::StatusCode::OK,
                            sse,
                            "data: {}\n\ndata: [DONE]\n\n",
                        ),
                    }
                }
            }),
        )
}

/// Every `NAME: N` count on the report's lines before `duration`, apart from the first line (the
/// storm's shape) and the error samples.
fn outcome_counts(text: &str) -> Vec<(String, u64)> {
    let mut counts = Vec::new();
    for line in text.lines().skip(1) {
        let line = line.trim();
        if line.starts_with("duration") {
            break;
        }
        if line.starts_with("error:") {
            continue;
        }
        let mut rest = line;
        while let Some(colon) = rest.find(": ") {
            let name = rest[..colon].rsplit(&[',', ' '][..]).next().unwrap_or("");
            let after = &rest[colon + 2..];
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = digits.parse() {
                counts.push((name.to_owned(), n));
            }
            rest = after;
        }
    }
    counts
}

#[tokio::test]
async fn every_request_lands_in_exactly_one_line_of_the_report() {
    let gateway = serve(mixed_gateway()).await;
    let config = StormConfig {
        groups: 4,
        siblings: 4,
        concurrency: 4,
        request_timeout: Duration::from_millis(500),
        ..small(gateway, true)
    };
    let report = run_storm(&config).await.unwrap();
    let text = report.to_string();
    let counts = outcome_counts(&text);
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    assert_eq!(total, report.requests, "{counts:?} in\n{text}");
    assert_eq!(report.requests, 16);
    assert_eq!(report.ok, 4, "{text}");
    let o = &report.outcomes;
    assert_eq!(
        (o.ok, o.http_status.get(&503), o.broken, o.timed_out),
        (4, Some(&4), 4, 4),
        "{text}"
    );
    assert_eq!((o.total(), report.errors), (16, 8));
    // Status counts stay what they were: every response by its status, broken ones included.
    assert_eq!(report.status_counts.get(&200), Some(&8));
    assert!(
        text.contains("outcomes      ok: 4, HTTP 503: 4, 2xx then broken: 4, timed out: 4"),
        "{text}"
    );
}

#[tokio::test]
async fn a_replica_that_refuses_the_preflight_is_ejected_only_when_asked() {
    let live = serve(fake_gateway()).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    drop(listener);
    let config = StormConfig {
        replicas: vec![dead.clone()],
        ..small(live, false)
    };
    let error = format!("{:#}", run_storm(&config).await.unwrap_err());
    assert!(
        error.contains(&format!("gateway {dead} is unreachable")),
        "{error}"
    );

    let ejecting = StormConfig {
        eject_refused_replicas: true,
        ..config.clone()
    };
    let report = run_storm(&ejecting).await.unwrap();
    assert_eq!((report.ok, report.outcomes.total()), (24, 24), "{report}");
    assert_eq!(report.per_replica[0].outcomes.ok, 24);
    let ejected = &report.per_replica[1];
    assert_eq!(ejected.gateway, dead.as_str());
    assert_eq!(ejected.outcomes.total(), 0);
    assert!(ejected.ejected_after_s.is_some_and(|s| s < 1.0), "{report}");

    // Two replicas, both refusing (one URL named twice is refused as such).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let also_dead = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    drop(listener);
    let nobody = StormConfig {
        gateway: also_dead,
        ..ejecting
    };
    let error = format!("{:#}", run_storm(&nobody).await.unwrap_err());
    assert!(
        error.contains("every gateway refuses connections"),
        "{error}"
    );
}

#[tokio::test]
async fn a_replica_named_twice_is_refused_before_the_first_request() {
    // Named twice, one control plane would be asked twice, its `active` counted double, and the
    // report would say "all 3 replicas" drained while the third replica was never asked.
    let gateway = serve(fake_gateway()).await;
    let control = serve(fake_control(0)).await;
    let other = serve(fake_control(0)).await;
    let config = StormConfig {
        control: Some(control.clone()),
        replica_controls: vec![
            other,
            Url::parse(control.as_str().trim_end_matches('/')).unwrap(),
        ],
        ..small(gateway.clone(), false)
    };
    let text = format!("{:#}", run_storm(&config).await.unwrap_err());
    assert!(
        text.contains(&format!("--control names {control} twice")),
        "{text}"
    );

    let config = StormConfig {
        replicas: vec![gateway.clone()],
        ..small(gateway.clone(), false)
    };
    let text = format!("{:#}", run_storm(&config).await.unwrap_err());
    assert!(
        text.contains(&format!("--gateway names {gateway} twice")),
        "{text}"
    );
}

#[tokio::test]
async fn a_storm_without_one_completed_request_reports_no_ttft() {
    // Every request answered 503: there is no time to first token to report, and 0.0 ms would
    // read as an instant answer.
    let failing = Router::new().route("/health", get(|| async { "" })).route(
        "/v1/chat/completions",
        post(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }),
    );
    let report = run_storm(&small(serve(failing).await, true)).await.unwrap();
    assert_eq!(report.ttft.samples, 0);
    let text = report.to_string();
    assert!(
        text.contains("  TTFT          n/a: no request completed\n"),
        "{text}"
    );
}

/// A gateway that refuses every other request itself (503 with a branch but no worker, as
/// gatewayd answers without a healthy worker) and routes the others to worker `w` with `branch`.
fn half_refused_gateway(branch: &'static str) -> Router {
    let counter = Arc::new(AtomicU64::new(0));
    Router::new().route("/health", get(|| async { "" })).route(
        "/v1/chat/completions",
        post(move || {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            async move {
                let mut headers = HeaderMap::new();
                if n.is_multiple_of(2) {
                    headers.insert("x-bch-branch", "no_healthy_workers".parse().unwrap());
                    let status = axum::http::StatusCode::SERVICE_UNAVAILABLE;
                    return (status, headers, "").into_response();
                }
                headers.insert("x-bch-worker", "w".parse().unwrap());
                headers.insert("x-bch-branch", branch.parse().unwrap());
                (headers, axum::Json(json!({"usage": {"prompt_tokens": 1}}))).into_response()
            }
        }),
    )
}

#[tokio::test]
async fn a_gateways_own_503_is_no_placement_on_a_worker() {
    // `w` is the only worker that served anything, not one of two with "unknown" the other.
    let gateway = serve(half_refused_gateway("explicit_routing_key_hit")).await;
    let report = run_storm(&small(gateway, false)).await.unwrap();
    assert_eq!((report.ok, report.outcomes.http_status[&503]), (12, 12));
    assert_eq!(report.per_worker.len(), 1, "{:?}", report.per_worker);
    assert_eq!(report.per_worker["w"], 12);
    assert_eq!(report.hottest_worker_share, 1.0);
    let placed: u64 = report.placement.values().flat_map(|w| w.values()).sum();
    assert_eq!(placed, 12);
    // The branches still name every response, the gateway's refusals included.
    assert_eq!(report.branches["no_healthy_workers"], 12);
}

#[tokio::test]
async fn the_spill_fraction_is_over_the_requests_a_worker_served() {
    // Every request the gateway routed spilled; the others it refused itself.
    let gateway = serve(half_refused_gateway("explicit_routing_key_spillover")).await;
    let report = run_storm(&small(gateway, false)).await.unwrap();
    assert_eq!(report.outcomes.http_status[&503], 12);
    assert_eq!(report.spill_fraction, 1.0, "{report}");
}

#[tokio::test]
async fn capacity_spills_count_as_spills() {
    // A request moved off its full preferred worker left home like a spill by the bound: the
    // overload A/B's spill column must not read 0 while every answer came from elsewhere.
    let gateway = serve(half_refused_gateway("explicit_routing_key_capacity_spill")).await;
    let report = run_storm(&small(gateway, false)).await.unwrap();
    assert_eq!(report.branches["explicit_routing_key_capacity_spill"], 12);
    assert_eq!(report.spill_fraction, 1.0, "{report}");
}
