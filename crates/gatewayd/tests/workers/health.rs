//! Workers wait for their first probe before they get traffic (`[health] wait_for_first_probe`,
//! on by default), a membership change is probed at once, and probe failures are counted by
//! reason.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use gatewayd::RunningGateway;
use gatewayd::config::WorkerConfig;
use serde_json::{Value, json};

fn control(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.control_addr)
}

fn data(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.data_addr)
}

/// A config with the default `wait_for_first_probe` and probe rounds far apart, so only the
/// first round (at start-up) and the ones a membership change triggers happen in a test.
fn waiting_config(workers: &[&FakeWorker]) -> gatewayd::config::Config {
    let mut config = test_config(workers);
    config.health.wait_for_first_probe =
        gatewayd::config::HealthConfig::default().wait_for_first_probe;
    config.health.interval = Duration::from_millis(60_000);
    config
}

async fn healthy(gateway: &RunningGateway, name: &str) -> Option<bool> {
    worker_record(gateway, name).await?["healthy"].as_bool()
}

async fn metric(gateway: &RunningGateway, series: &str) -> Option<f64> {
    let text = client()
        .get(control(gateway, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Polls `cond` until it holds, for at most 5 s (well under the 60 s probe interval: only a probe
/// triggered by start-up or a membership change can make it true).
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !$cond {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out: {}",
                $what
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }};
}

#[test]
fn waiting_for_the_first_probe_is_the_default() {
    assert!(
        gatewayd::config::Config::default()
            .health
            .wait_for_first_probe
    );
}

#[tokio::test]
async fn a_dead_worker_never_gets_the_first_request_and_readiness_waits() {
    // Nothing listens on port 9. Started healthy, it would take the first request and answer 502.
    let mut config = waiting_config(&[]);
    config.workers.push(WorkerConfig {
        name: Some("dead".into()),
        ..WorkerConfig::from_url("http://127.0.0.1:9")
    });
    let gateway = start(config).await;
    let response = client()
        .get(data(&gateway, "/v1/models"))
        .header("x-smg-target-worker", "dead")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503, "refused, not sent to a dead worker");
    let readiness = client()
        .get(data(&gateway, "/readiness"))
        .send()
        .await
        .unwrap();
    assert_eq!(readiness.status(), 503);
    eventually!(
        "the refused probe counted",
        metric(
            &gateway,
            "bch_probe_failures_total{worker=\"dead\",reason=\"refused\"}"
        )
        .await
        .is_some()
    );
    assert_eq!(healthy(&gateway, "dead").await, Some(false));
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_live_worker_is_let_in_by_its_first_probe_and_an_added_one_is_probed_at_once() {
    let (a, sick, c) = (
        fake_worker("a").await,
        fake_worker("sick").await,
        fake_worker("c").await,
    );
    sick.state.fail_health.store(true, Ordering::SeqCst);
    let gateway = start(waiting_config(&[&a, &sick])).await;
    eventually!("a let in", healthy(&gateway, "a").await == Some(true));
    let readiness = client()
        .get(data(&gateway, "/readiness"))
        .send()
        .await
        .unwrap();
    assert_eq!(readiness.status(), 200);
    eventually!(
        "sick's 503 counted as a status failure",
        metric(
            &gateway,
            "bch_probe_failures_total{worker=\"sick\",reason=\"status\"}"
        )
        .await
        .is_some()
    );
    assert_eq!(healthy(&gateway, "sick").await, Some(false));

    let probes_of_a = a.state.health_probes.load(Ordering::SeqCst);
    let added = client()
        .post(control(&gateway, "/admin/workers"))
        .json(&json!({"name": "c", "url": c.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let record: Value = added.json().await.unwrap();
    assert_eq!(record["healthy"], false, "waits for its first probe");
    eventually!(
        "c probed at once, not at the next 60 s round",
        healthy(&gateway, "c").await == Some(true)
    );
    assert_eq!(
        a.state.health_probes.load(Ordering::SeqCst),
        probes_of_a,
        "a membership change probes the new worker only: a DNS source that changes every second must not turn the 60 s round into a 1 s one"
    );
    gateway.shutdown().await;
}
