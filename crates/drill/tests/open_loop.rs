//! Open-loop storms against simulated workers and tiny fake gateways on 127.0.0.1: they keep to
//! the rate asked whatever is outstanding, and their reports split answers from clean sheds.
//!
//! These run on real time (as the storm tests do): the arrivals are scheduled on the clock. The
//! rate tolerance is wide enough for a loaded test machine; the schedule is made from the start
//! time, so a slow machine makes sends late rather than fewer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use bch_drill::sim::SimConfig;
use bch_drill::storm::{
    Arrival, OpenLoop, RateStep, StormConfig, SweepConfig, run_storm, run_sweep,
};
use bch_drill::worker::{WorkerHandle, spawn_worker};
use reqwest::Url;
use tokio_util::sync::CancellationToken;

fn open_loop(gateway: Url, rate: f64, seconds: f64) -> StormConfig {
    StormConfig {
        gateway,
        keys: 4,
        prefix_tokens: 32,
        suffix_tokens: 8,
        max_tokens: 5,
        progress: false,
        open_loop: Some(OpenLoop {
            rate,
            arrival: Arrival::Constant,
            duration: Duration::from_secs_f64(seconds),
            burst_size: 1,
        }),
        ..StormConfig::default()
    }
}

/// A simulated worker that serves one request at a time, about 50 ms each: some 20 requests a
/// second, so a storm at a higher rate piles up behind it.
async fn one_at_a_time_worker() -> WorkerHandle {
    let slow = SimConfig {
        max_batch: 1,
        ..SimConfig::default()
    };
    spawn_worker(SocketAddr::from(([127, 0, 0, 1], 0)), "w", slow)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_open_loop_storm_keeps_its_rate_whatever_is_outstanding() {
    // The worker serves some 20 a second, and a storm at 50 a second piles up behind it. A closed
    // loop would never have more in flight than its concurrency; the open loop keeps sending.
    let worker = one_at_a_time_worker().await;
    let config = StormConfig {
        slo_ttft: Some(Duration::from_millis(200)),
        concurrency: 1,
        siblings: 8,
        ..open_loop(Url::parse(&worker.url()).unwrap(), 50.0, 1.0)
    };
    let report = run_storm(&config).await.unwrap();
    let open = report.open_loop.as_ref().expect("an open-loop report");
    assert_eq!(open.sent, 50, "{report}");
    assert!(
        (open.rate_achieved - 50.0).abs() < 50.0 * 0.15,
        "achieved {} of 50 req/s",
        open.rate_achieved
    );
    // Without --rate the same storm would keep `concurrency` groups of `siblings` in flight.
    let closed_loop_in_flight = config.concurrency * config.siblings;
    assert!(
        open.peak_in_flight > closed_loop_in_flight && open.peak_in_flight >= 20,
        "peak in flight {} (closed loop: {closed_loop_in_flight})",
        open.peak_in_flight
    );
    assert_eq!((report.ok, report.overload.answered), (50, 50), "{report}");
    assert_eq!(report.overload.unclean(), 0);
    // The queue behind one slot makes later answers late: goodput counts only those in time.
    let within = report.overload.within_slo.unwrap();
    assert!(within < 50, "{report}");
    assert_eq!(
        report.overload.goodput_rps,
        Some(within as f64 / open.window_s)
    );
    // One record per request, in send order, each sent on schedule or after it.
    assert_eq!(report.records.len(), 50);
    let sent: Vec<f64> = report.records.iter().map(|r| r.sent_ms.unwrap()).collect();
    assert!(sent.windows(2).all(|w| w[0] <= w[1] + 5.0), "{sent:?}");
    for (i, record) in report.records.iter().enumerate() {
        let scheduled = i as f64 * 20.0;
        assert!(record.sent_ms.unwrap() + 1.0 >= scheduled, "{record:?}");
        assert!(record.late_ms.unwrap() >= 0.0);
        assert_eq!((record.class.as_str(), record.status), ("ok", Some(200)));
        assert!(record.ttft_ms.unwrap() <= record.total_ms.unwrap());
    }
    let text = report.to_string();
    assert!(
        text.contains("open loop at 50.0 req/s (constant) for 1 s"),
        "{text}"
    );
    assert!(
        text.contains("answers       200 50   503+Retry-After 0"),
        "{text}"
    );
    assert!(!text.contains("NOT CLEAN"), "{text}");
    worker.shutdown().await.unwrap();
}

/// A gateway that sheds: of every four requests, one answered, two shed with `Retry-After` (one
/// with a queue wait), one 503 without it.
fn shedding_gateway() -> Router {
    let counter = Arc::new(AtomicU64::new(0));
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            post(move || {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                async move {
                    let sse = ("content-type", "text/event-stream");
                    let branch = ("x-bch-branch", "shed_queue_timeout");
                    let code = ("x-smg-error-code", "worker_overload_protection_shed");
                    match n % 4 {
                        0 => (
                            StatusCode::OK,
                            [sse, branch, sse, sse],
                            "data: {}\n\ndata: [DONE]\n\n",
                        ),
                        1 => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            [branch, code, ("retry-after", "1"), sse],
                            "{}",
                        ),
                        2 => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            [
                                branch,
                                code,
                                ("retry-after", "1"),
                                ("x-bch-queue-wait-ms", "250"),
                            ],
                            "{}",
                        ),
                        _ => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            [sse, sse, sse, sse],
                            "busy",
                        ),
                    }
                }
            }),
        )
}

#[tokio::test]
async fn the_report_splits_answers_clean_sheds_and_unclean_ones() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, shedding_gateway()).await.unwrap() });
    let gateway = Url::parse(&format!("http://{addr}")).unwrap();
    let report = run_storm(&open_loop(gateway, 80.0, 0.5)).await.unwrap();
    let s = &report.overload;
    assert_eq!(
        (s.answered, s.shed, s.shed_without_retry_after, s.other),
        (10, 20, 10, 0),
        "{report}"
    );
    assert_eq!(s.shed_by_branch["shed_queue_timeout"], 20);
    assert_eq!(s.shed_by_error_code["worker_overload_protection_shed"], 20);
    let wait = s.queue_wait.as_ref().expect("queue waits were reported");
    assert_eq!((wait.samples, wait.max_ms), (10, 250.0));
    // The outcome classes still count every request once.
    assert_eq!(report.outcomes.total(), 40);
    assert_eq!(report.outcomes.http_status[&503], 30);
    let classes: Vec<&str> = report.records.iter().map(|r| r.class.as_str()).collect();
    assert_eq!(classes.iter().filter(|c| **c == "http_503").count(), 30);
    assert_eq!(report.records.iter().filter(|r| r.retry_after).count(), 20);
    let text = report.to_string();
    assert!(
        text.contains("NOT CLEAN     10 requests were neither answered nor shed with Retry-After"),
        "{text}"
    );
    assert!(text.contains("(sheds: shed_queue_timeout 20)"), "{text}");
}

#[tokio::test]
async fn a_sweep_ramps_the_rate_until_the_fleet_saturates_and_estimates_its_capacity() {
    let worker = one_at_a_time_worker().await;
    let config = SweepConfig {
        storm: StormConfig {
            slo_ttft: Some(Duration::from_millis(250)),
            ..open_loop(Url::parse(&worker.url()).unwrap(), 1.0, 0.5)
        },
        start_rate: 5.0,
        step: RateStep::Multiply(2.0),
        max_steps: 5,
        saturated_steps: 1,
    };
    let mut seen = Vec::new();
    let report = run_sweep(&config, &CancellationToken::new(), |step| {
        seen.push(step.rate_asked)
    })
    .await
    .unwrap();
    assert_eq!(
        seen,
        report
            .steps
            .iter()
            .map(|s| s.rate_asked)
            .collect::<Vec<_>>()
    );
    assert_eq!(&seen[..2], [5.0, 10.0], "{report:?}");
    // 80 a second is four times what the worker serves: the sweep stopped by then.
    assert!(seen.len() < 5, "{report:?}");
    let last = report.steps.last().unwrap();
    assert!(last.saturated, "{report:?}");
    assert!(report.stopped.contains("saturated"), "{report:?}");
    assert!(!report.steps[0].saturated, "{report:?}");
    let knee = report.knee_rps.unwrap();
    assert!((5.0..40.0).contains(&knee), "{report:?}");
    assert!(
        report.capacity_rps > 0.0 && report.capacity_rps < 30.0,
        "{report:?}"
    );
    assert!(report.steps.iter().all(|s| s.unclean == 0 && s.shed == 0));
    worker.shutdown().await.unwrap();
}
