//! Admission through the real data plane: capacity per worker, the gateway's queue (fair, bounded,
//! decided again at admission, left at once by clients that go) and clean shedding (503 with
//! `Retry-After`, `X-SMG-Error-Code` and the branch, counted by reason, never against a worker).

#[path = "../common/mod.rs"]
mod common;

mod storm;

use std::time::Duration;

use bch_core::routing_key::{ImplicitKey, ImplicitSource, RoutingKey};
use common::*;
use gatewayd::RunningGateway;
use gatewayd::config::Config;

const ROUTING_KEY: &str = "x-smg-routing-key";
const TARGET: &str = "x-smg-target-worker";

/// A gateway over `workers` with a cap of one request per worker, `queue_timeout_ms` and
/// `max_queued` as given.
async fn capped(workers: &[&FakeWorker], queue_timeout_ms: u64, max_queued: u64) -> RunningGateway {
    let mut config: Config = test_config(workers);
    config.admission.max_in_flight_per_worker = 1;
    config.admission.queue_timeout_ms = queue_timeout_ms;
    config.admission.max_queued = max_queued;
    config.admission.retry_after_ms = 1500;
    start(config).await
}

/// The value of the unlabelled metric `name` (or the series `name{labels}`), 0 when absent.
fn metric(gateway: &RunningGateway, series: &str) -> f64 {
    gateway
        .metrics_text()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn queue_length(gateway: &RunningGateway) -> f64 {
    metric(gateway, "bch_admission_queue_length")
}

/// Waits (bounded) until `n` requests wait in the gateway's queue.
async fn wait_queued(gateway: &RunningGateway, n: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while queue_length(gateway) != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "queue length never reached {n}: {}",
            queue_length(gateway)
        );
        // The queue is filled by other tasks; poll its gauge at a short interval.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `worker` has received `n` requests (each held until the next `release_all`).
async fn wait_requests(worker: &FakeWorker, n: u64) {
    wait_for(&worker.state, |s| {
        s.requests.load(std::sync::atomic::Ordering::SeqCst) == n
    })
    .await;
}

/// Starts a request to `/hold` with `headers` on its own task.
fn send(
    gateway: &RunningGateway,
    headers: &[(&'static str, String)],
) -> tokio::task::JoinHandle<reqwest::Response> {
    let mut request = client().post(format!("http://{}/hold", gateway.data_addr));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    tokio::spawn(async move { request.send().await.expect("an answer") })
}

/// Asserts a clean shed: 503, `Retry-After` (1500 ms → 2 s), the error code header and body, the
/// branch.
fn assert_shed(response: &reqwest::Response, branch: &str) {
    assert_eq!(response.status(), 503);
    let headers = response.headers();
    assert_eq!(headers["retry-after"], "2");
    assert_eq!(
        headers["x-smg-error-code"],
        "worker_overload_protection_shed"
    );
    assert_eq!(headers["x-bch-branch"], branch);
}

#[tokio::test]
async fn without_a_queue_a_request_over_capacity_is_shed_at_once() {
    let w0 = fake_worker("w0").await;
    let gateway = capped(&[&w0], 0, 16).await;
    let held = send(&gateway, &[]);
    wait_requests(&w0, 1).await;
    let shed = send(&gateway, &[]).await.unwrap();
    assert_shed(&shed, "fleet_full");
    let body: serde_json::Value = shed.json().await.unwrap();
    assert_eq!(body["error"]["code"], "worker_overload_protection_shed");
    assert_eq!(body["error"]["type"], "gateway_error");
    assert_eq!(
        metric(&gateway, "bch_admission_shed_total{reason=\"no_queue\"}"),
        1.0
    );
    assert_eq!(metric(&gateway, "bch_worker_full{worker=\"w0\"}"), 1.0);
    assert_eq!(metric(&gateway, "bch_worker_capacity{worker=\"w0\"}"), 1.0);
    // Never counted against the worker.
    let record = worker_record(&gateway, "w0").await.unwrap();
    assert_eq!(record["errors_total"], 0, "{record}");
    assert_eq!(record["requests_total"], 1, "{record}");
    w0.release_all();
    assert_eq!(held.await.unwrap().status(), 200);
    assert_eq!(wait_all_idle(&gateway).await, [("w0".to_owned(), 0)]);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_queued_request_is_admitted_when_the_slot_frees_and_says_how_long_it_waited() {
    let w0 = fake_worker("w0").await;
    let gateway = capped(&[&w0], 10_000, 16).await;
    let first = send(&gateway, &[]);
    wait_requests(&w0, 1).await;
    let second = send(&gateway, &[]);
    wait_queued(&gateway, 1.0).await;
    assert_eq!(
        active_loads(&gateway).await,
        [("w0".to_owned(), 1)],
        "waiting holds nothing"
    );
    w0.release_all();
    let first = first.await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("x-bch-queue-wait-ms").is_none());
    drop(first.bytes().await);
    // The freed slot went to the waiting request, which now holds its own stream.
    wait_requests(&w0, 2).await;
    w0.release_all();
    let second = second.await.unwrap();
    assert_eq!(second.status(), 200);
    assert!(second.headers().contains_key("x-bch-queue-wait-ms"));
    assert_eq!(queue_length(&gateway), 0.0);
    assert_eq!(
        metric(&gateway, "bch_admission_admitted_total{waited=\"true\"}"),
        1.0
    );
    assert_eq!(
        metric(&gateway, "bch_admission_queue_wait_seconds_count"),
        1.0
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_queue_is_bounded_in_length_and_in_time() {
    let w0 = fake_worker("w0").await;
    let gateway = capped(&[&w0], 300, 1).await;
    let held = send(&gateway, &[]);
    wait_requests(&w0, 1).await;
    let waiting = send(&gateway, &[]);
    wait_queued(&gateway, 1.0).await;
    let full = send(&gateway, &[(ROUTING_KEY, "other".into())])
        .await
        .unwrap();
    assert_shed(&full, "fleet_full");
    let timed_out = waiting.await.unwrap();
    assert_shed(&timed_out, "fleet_full");
    assert_eq!(
        metric(&gateway, "bch_admission_shed_total{reason=\"queue_full\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &gateway,
            "bch_admission_shed_total{reason=\"queue_timeout\"}"
        ),
        1.0
    );
    assert_eq!(queue_length(&gateway), 0.0);
    w0.release_all();
    assert_eq!(held.await.unwrap().status(), 200);
    assert_eq!(wait_all_idle(&gateway).await, [("w0".to_owned(), 0)]);
    gateway.shutdown().await;
}

#[tokio::test]
async fn clients_leaving_the_queue_leave_nothing_behind() {
    let w0 = fake_worker("w0").await;
    let gateway = capped(&[&w0], 10_000, 16).await;
    let held = send(&gateway, &[]);
    wait_requests(&w0, 1).await;
    let leavers: Vec<_> = (0..3)
        .map(|i| send(&gateway, &[(ROUTING_KEY, format!("leaver-{i}"))]))
        .collect();
    wait_queued(&gateway, 3.0).await;
    for leaver in &leavers {
        leaver.abort();
    }
    wait_queued(&gateway, 0.0).await;
    assert_eq!(active_loads(&gateway).await, [("w0".to_owned(), 1)]);
    w0.release_all();
    assert_eq!(held.await.unwrap().status(), 200);
    assert_eq!(wait_all_idle(&gateway).await, [("w0".to_owned(), 0)]);
    assert_eq!(
        w0.state.requests.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    gateway.shutdown().await;
}

/// An Authorization value whose implicit key prefers `worker`.
fn implicit_key_for(gateway: &RunningGateway, worker: &str) -> String {
    let table = gateway.routing_table();
    (0..)
        .map(|i| format!("Bearer token-{i}"))
        .find(|value| {
            let key = ImplicitKey::from_value(ImplicitSource::Authorization, value.as_bytes());
            let preferred = table.explain(&RoutingKey::Implicit(key)).preferred;
            preferred.map(|w| table.workers()[w].spec.name.as_str()) == Some(worker)
        })
        .unwrap()
}

/// An explicit key whose preferred worker is `worker`.
async fn explicit_key_for(gateway: &RunningGateway, worker: &str) -> String {
    for i in 0.. {
        let key = format!("key-{i}");
        if preferred_worker(gateway, &key).await == worker {
            return key;
        }
    }
    unreachable!()
}

#[tokio::test]
async fn an_explicit_key_moves_off_a_full_worker_and_an_implicit_key_waits_for_its_own() {
    let (w0, w1) = (fake_worker("w0").await, fake_worker("w1").await);
    let gateway = capped(&[&w0, &w1], 10_000, 16).await;
    let explicit = explicit_key_for(&gateway, "w0").await;
    let implicit = implicit_key_for(&gateway, "w0");
    let filler = send(&gateway, &[(TARGET, "w0".into())]);
    wait_requests(&w0, 1).await;

    let waiting = send(&gateway, &[("authorization", implicit)]);
    wait_queued(&gateway, 1.0).await;
    let moved = send(&gateway, &[(ROUTING_KEY, explicit)]);
    wait_requests(&w1, 1).await;
    assert_eq!(
        queue_length(&gateway),
        1.0,
        "the implicit key still waits, w1 has no room now"
    );

    w1.release_all();
    let moved = moved.await.unwrap();
    assert_eq!(moved.status(), 200);
    assert_eq!(moved.headers()["x-bch-worker"], "w1");
    assert_eq!(
        moved.headers()["x-bch-branch"],
        "explicit_routing_key_capacity_spill"
    );
    drop(moved.bytes().await);
    assert_eq!(
        queue_length(&gateway),
        1.0,
        "a slot on w1 is no slot for a strict key on w0"
    );

    w0.release_all();
    drop(filler.await.unwrap().bytes().await);
    wait_requests(&w0, 2).await;
    w0.release_all();
    let waited = waiting.await.unwrap();
    assert_eq!(waited.status(), 200);
    assert_eq!(waited.headers()["x-bch-worker"], "w0");
    assert!(waited.headers().contains_key("x-bch-queue-wait-ms"));
    assert_eq!(
        wait_all_idle(&gateway)
            .await
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>(),
        0
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_hot_key_cannot_starve_a_cold_one_in_the_queue() {
    let w0 = fake_worker("w0").await;
    let gateway = capped(&[&w0], 10_000, 16).await;
    let held = send(&gateway, &[]);
    wait_requests(&w0, 1).await;
    let mut hot = Vec::new();
    for n in 1..=4 {
        hot.push(send(&gateway, &[(ROUTING_KEY, "hot".into())]));
        wait_queued(&gateway, f64::from(n)).await;
    }
    let cold = send(&gateway, &[(ROUTING_KEY, "cold".into())]);
    wait_queued(&gateway, 5.0).await;
    // One slot: each release admits one request. The hot key's first goes, then the cold key's
    // one, before the hot key's other three.
    w0.release_all();
    drop(held.await.unwrap().bytes().await);
    wait_requests(&w0, 2).await;
    assert_eq!(queue_length(&gateway), 4.0);
    w0.release_all();
    wait_requests(&w0, 3).await;
    assert_eq!(queue_length(&gateway), 3.0);
    // The third request in is the cold one: its head comes while it holds the one slot, and the
    // hot key's other three still wait. (Checked before the release that frees the slot: once
    // the cold stream's last byte is relayed the next hot request is admitted, and whether its
    // head or the cold stream's end reaches its client first is the scheduler's business.)
    let cold = tokio::time::timeout(Duration::from_secs(5), cold)
        .await
        .expect("the cold key was admitted second")
        .unwrap();
    assert_eq!(cold.status(), 200);
    assert!(cold.headers().contains_key("x-bch-queue-wait-ms"));
    assert!(
        hot[1..].iter().all(|h| !h.is_finished()),
        "three hot requests still wait"
    );
    w0.release_all();
    drop(cold.bytes().await);
    for n in 4..=6 {
        wait_requests(&w0, n).await;
        w0.release_all();
    }
    for request in hot {
        assert_eq!(request.await.unwrap().status(), 200);
    }
    assert_eq!(queue_length(&gateway), 0.0);
    assert_eq!(wait_all_idle(&gateway).await, [("w0".to_owned(), 0)]);
    gateway.shutdown().await;
}

/// Shutdown answers the requests waiting in the queue at once with a clean shed (reason
/// `shutdown`), while the request in flight runs on within the grace; before, the waiting ones
/// kept waiting and lost their connections without an answer when the grace ended.
#[tokio::test]
async fn shutdown_sheds_the_waiting_requests_at_once() {
    let w0 = fake_worker("w0").await;
    let gateway = capped(&[&w0], 60_000, 16).await;
    let held = send(&gateway, &[]);
    wait_requests(&w0, 1).await;
    let waiting = send(&gateway, &[]);
    wait_queued(&gateway, 1.0).await;
    let metrics = gateway.metrics_text();
    let stopping = tokio::spawn(gateway.shutdown());
    let shed = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting request is answered during the shutdown grace")
        .unwrap();
    assert_shed(&shed, "fleet_full");
    assert!(metrics.contains("bch_admission_shed_total{reason=\"shutdown\"} 0"));
    w0.release_all();
    assert_eq!(
        held.await.unwrap().status(),
        200,
        "the request in flight ends well"
    );
    stopping.await.unwrap();
}
