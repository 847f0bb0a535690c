//! The endpoint picker and the data plane count and report requests the same way: one request
//! sequence (a held same-key burst that spills, implicit, keyless and ignored keys, a target-worker
//! miss) is played through gatewayd's own data plane and through a picker-only gateway with the
//! same configuration and workers (a tonic client playing Envoy), and `/metrics`, the telemetry
//! snapshot (workers, keys, spill log, totals) and `GET /admin/explain` must come out equal.

use crate::common;

use std::time::Duration;

use bch_core::policy::PolicyKind;
use bch_core::telemetry::{ServerFrame, ServerMessage, Snapshot};
use common::envoy::*;
use common::*;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use futures_util::StreamExt;
use gatewayd::RunningGateway;
use gatewayd::config::Config;
use tokio_tungstenite::tungstenite::Message;

/// One request of the sequence: its headers, and whether it stays open until the end.
struct Step {
    headers: Vec<(&'static str, String)>,
    held: bool,
}

fn step(headers: &[(&'static str, &str)], held: bool) -> Step {
    Step {
        headers: headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        held,
    }
}

/// The sequence both front ends get.
fn sequence() -> Vec<Step> {
    let too_long = "k".repeat(bch_core::routing_key::MAX_EXPLICIT_KEY_BYTES + 1);
    let mut steps: Vec<Step> = (0..8)
        .map(|_| step(&[("x-smg-routing-key", "session-a")], true))
        .collect();
    steps.push(step(&[("authorization", "Bearer sk-parity")], false));
    steps.push(step(&[("x-forwarded-for", "10.1.2.3")], true));
    steps.push(step(&[], false));
    steps.push(step(&[("x-smg-routing-key", &too_long)], false));
    steps.push(step(&[("x-smg-target-worker", "nope")], false));
    steps.push(step(&[("x-smg-routing-key", "session-b")], false));
    steps
}

fn config(workers: &[&FakeWorker]) -> Config {
    let mut config = test_config(workers);
    config.policy.kind = PolicyKind::BoundedConsistentHashing;
    config.policy.min_load_gap = 2;
    config.health.interval = Duration::from_millis(60_000);
    config
}

fn total_active(gateway: &RunningGateway) -> u64 {
    let table = gateway.routing_table();
    table.workers().iter().map(|w| w.stats.active()).sum()
}

/// Waits (bounded) until exactly `held` requests hold load: the previous request has ended, so
/// the next decision sees the same loads on both front ends.
async fn settle(gateway: &RunningGateway, held: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while total_active(gateway) != held {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {held} in flight, have {:?}",
            active_loads(gateway).await
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Plays the sequence through the data plane; returns once every request has ended.
async fn through_data_plane(gateway: &RunningGateway, workers: &[&FakeWorker]) {
    let client = client();
    let mut open = Vec::new();
    for step in sequence() {
        let path = if step.held { "/hold" } else { "/echo" };
        let mut request = client.get(format!("http://{}{path}", gateway.data_addr));
        for (name, value) in &step.headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.unwrap();
        if step.held && response.status() == 200 {
            open.push(response);
        } else {
            response.bytes().await.unwrap();
        }
        settle(gateway, open.len() as u64).await;
    }
    for worker in workers {
        worker.release_all();
    }
    for response in open {
        response.bytes().await.unwrap();
    }
    settle(gateway, 0).await;
}

/// Plays the sequence through the picker as Envoy would: request headers, then (unless refused)
/// response headers from the chosen endpoint; held requests keep their stream open.
async fn through_picker(gateway: &RunningGateway) {
    let picker = gateway.picker_addr.expect("picker listening");
    let mut open = Vec::new();
    for step in sequence() {
        let headers: Vec<(&str, &str)> =
            step.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut envoy = FakeEnvoy::open(picker).await;
        let answer = envoy.exchange(request_headers(&headers)).await;
        if !matches!(answer.response, Some(Response::ImmediateResponse(_))) {
            let (endpoints, _) = picked(&answer);
            let chosen = endpoints.split(',').next().unwrap().to_owned();
            envoy
                .exchange(response_headers(Some(&chosen), !step.held))
                .await;
        }
        if step.held {
            open.push(envoy);
        } else {
            envoy.close();
        }
        settle(gateway, open.len() as u64).await;
    }
    for mut envoy in open {
        envoy.close();
    }
    settle(gateway, 0).await;
}

/// The `/metrics` lines about placing and counting requests, in order (timings' sums and
/// buckets left out: only how many were observed).
fn routing_metrics(gateway: &RunningGateway) -> Vec<String> {
    let counted = [
        "bch_branch_total",
        "bch_ignored_routing_keys_total",
        "bch_retries_total",
        "bch_client_body_errors_total",
        "bch_worker_active",
        "bch_worker_requests_total",
        "bch_worker_spilled_in_total",
        "bch_worker_spilled_out_total",
        "bch_worker_errors_total",
        "bch_worker_healthy",
        "bch_request_duration_seconds_count",
        "bch_response_headers_seconds_count",
        "bch_responses_total",
    ];
    gateway
        .metrics_text()
        .lines()
        .filter(|line| {
            counted.iter().any(|name| {
                line.strip_prefix(name)
                    .is_some_and(|r| r.starts_with([' ', '{']))
            })
        })
        .map(str::to_owned)
        .collect()
}

/// The telemetry snapshot once the aggregator has seen all `requests` (refusals included) end, with its clocks and
/// rates zeroed (the two runs happen at different moments).
async fn settled_snapshot(gateway: &RunningGateway, requests: u64) -> Snapshot {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (mut socket, _) =
            tokio_tungstenite::connect_async(format!("ws://{}/ws", gateway.control_addr))
                .await
                .expect("websocket upgrade");
        let Some(Ok(Message::Text(text))) = socket.next().await else {
            panic!("no first frame");
        };
        let frame: ServerFrame = serde_json::from_str(&text).unwrap();
        let ServerMessage::Snapshot(mut snapshot) = frame.message else {
            panic!("the first frame is a snapshot");
        };
        let ended = snapshot.workers.iter().all(|w| w.active == 0);
        if (snapshot.totals.requests_total == requests && ended)
            || tokio::time::Instant::now() > deadline
        {
            snapshot.ts_ms = 0;
            snapshot.totals.requests_per_s = 0.0;
            snapshot.totals.spills_per_s = 0.0;
            snapshot.keys.iter_mut().for_each(|k| k.last_seen_ms = 0);
            snapshot.spills.iter_mut().for_each(|s| s.ts_ms = 0);
            return snapshot;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn explain(gateway: &RunningGateway, key: &str) -> serde_json::Value {
    client()
        .get(format!(
            "http://{}/admin/explain?routing_key={key}",
            gateway.control_addr
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn metrics_telemetry_and_explain_are_the_same_through_the_picker_and_the_data_plane() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let data = start(config(&[&a, &b])).await;
    let picker = start({
        let mut config = config(&[&a, &b]);
        config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
        config.server.listeners.data_plane = false;
        config
    })
    .await;
    through_data_plane(&data, &[&a, &b]).await;
    through_picker(&picker).await;

    let metrics = routing_metrics(&data);
    assert!(
        metrics.iter().any(|l| l
            .starts_with("bch_branch_total{branch=\"explicit_routing_key_spillover\"}")
            && !l.ends_with(" 0")),
        "the burst spilled: {metrics:#?}"
    );
    assert_eq!(metrics, routing_metrics(&picker), "/metrics");

    let requests = sequence().len() as u64;
    let (on_data, on_picker) = (
        settled_snapshot(&data, requests).await,
        settled_snapshot(&picker, requests).await,
    );
    assert_eq!(on_data.totals.requests_total, requests);
    assert!(!on_data.spills.is_empty(), "the spill log has the burst");
    assert!(on_data.keys.len() >= 4, "keys tracked: {:?}", on_data.keys);
    assert_eq!(on_data.workers, on_picker.workers, "telemetry workers");
    assert_eq!(on_data.keys, on_picker.keys, "telemetry keys");
    assert_eq!(on_data.spills, on_picker.spills, "telemetry spill log");
    assert_eq!(on_data.totals, on_picker.totals, "telemetry totals");

    for key in ["session-a", "session-b"] {
        assert_eq!(
            explain(&data, key).await,
            explain(&picker, key).await,
            "{key}"
        );
    }
    data.shutdown().await;
    picker.shutdown().await;
}
