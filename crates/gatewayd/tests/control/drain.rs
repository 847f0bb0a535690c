//! Worker maintenance: drain and undrain over the admin API and the websocket, against real fake
//! workers. A draining worker keeps its stream, gets no new request (its keys go where an
//! unhealthy worker's would), stays listed with its in-flight count and state, is announced idle
//! once (a `drained` frame and a log line), and leaves the membership then if the drain asked.

use crate::common;

use std::time::Duration;

use bch_core::telemetry::ServerMessage;
use common::ws::Client;
use common::*;
use gatewayd::RunningGateway;
use serde_json::{Value, json};

const ROUTING_KEY: &str = "x-smg-routing-key";

fn control(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.control_addr)
}

fn data(gateway: &RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gateway.data_addr)
}

/// A routing key whose preferred worker is `worker`.
async fn key_for(gateway: &RunningGateway, worker: &str) -> String {
    for i in 0..1_000 {
        let key = format!("drain-key-{i}");
        if preferred_worker(gateway, &key).await == worker {
            return key;
        }
    }
    panic!("no key prefers {worker}");
}

async fn post(gateway: &RunningGateway, path: &str, body: &str) -> (u16, Value) {
    let mut request = client().post(control(gateway, path));
    if !body.is_empty() {
        request = request.header("content-type", "application/json");
    }
    let response = request.body(body.to_owned()).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Which worker served a keyed GET.
async fn served_by(gateway: &RunningGateway, header: (&str, &str)) -> (u16, String) {
    let response = client()
        .get(data(gateway, "/v1/models"))
        .header(header.0, header.1)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let worker = response
        .headers()
        .get("x-bch-worker")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    response.bytes().await.unwrap();
    (status, worker)
}

/// The `drained` frame for `worker`, bounded by the client's own deadline.
async fn drained(ws: &mut Client, worker: &str) -> bool {
    ws.until(|m| match m {
        ServerMessage::Drained(d) if d.worker == worker => Some(d.removed),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn a_drained_worker_finishes_its_stream_takes_nothing_new_and_is_announced_idle() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let key = key_for(&gateway, "a").await;
    let mut ws = Client::connect(&gateway).await;
    // A stream in flight on a.
    let held = client()
        .get(data(&gateway, "/hold"))
        .header(ROUTING_KEY, &key)
        .send()
        .await
        .unwrap();
    assert_eq!(held.headers()["x-bch-worker"], "a");
    wait_for(&a.state, |s| {
        s.held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;

    let (status, record) = post(&gateway, "/admin/workers/a/drain", "").await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["state"], "draining");
    assert_eq!(record["active"], 1);
    assert_eq!(record["remove_when_idle"], false);
    // A drain survives a reload (the router keeps worker states over it): the note must not
    // say it is lost there, or an operator drains again after every reload.
    let note = record["note"].as_str().unwrap();
    assert!(
        note.contains("kept across reloads") && !note.contains("lost on the next reload"),
        "{note}"
    );
    let listed = worker_record(&gateway, "a").await.expect("still listed");
    assert_eq!(
        (listed["state"].clone(), listed["active"].clone()),
        (json!("draining"), json!(1))
    );
    let metrics = client()
        .get(control(&gateway, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("bch_worker_draining{worker=\"a\"} 1"),
        "{metrics}"
    );

    // No new request reaches a: its key goes where an unhealthy worker's would, a target-worker
    // request is refused like one for an unhealthy worker.
    assert_eq!(
        served_by(&gateway, (ROUTING_KEY, &key)).await,
        (200, "b".into())
    );
    assert_eq!(
        served_by(&gateway, ("x-smg-target-worker", "a")).await.0,
        503
    );

    // The stream ends: a is announced idle once, stays listed, state draining.
    a.release_all();
    held.bytes().await.unwrap();
    assert!(!drained(&mut ws, "a").await, "not removed");
    let listed = worker_record(&gateway, "a").await.expect("still listed");
    assert_eq!(
        (listed["state"].clone(), listed["active"].clone()),
        (json!("draining"), json!(0))
    );

    // Undrained, the key comes home.
    let (status, record) = post(&gateway, "/admin/workers/a/undrain", "").await;
    assert_eq!((status, record["state"].clone()), (200, json!("active")));
    assert_eq!(
        served_by(&gateway, (ROUTING_KEY, &key)).await,
        (200, "a".into())
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_drain_that_asks_for_removal_removes_the_worker_once_idle() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let key = key_for(&gateway, "a").await;
    let mut ws = Client::connect(&gateway).await;
    let held = client()
        .get(data(&gateway, "/hold"))
        .header(ROUTING_KEY, &key)
        .send()
        .await
        .unwrap();
    wait_for(&a.state, |s| {
        s.held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let (status, record) = post(&gateway, "/admin/workers/a/drain", r#"{"remove": true}"#).await;
    assert_eq!(
        (status, record["remove_when_idle"].clone()),
        (200, json!(true))
    );
    assert!(
        worker_record(&gateway, "a").await.is_some(),
        "listed while its stream runs"
    );
    a.release_all();
    held.bytes().await.unwrap();
    assert!(drained(&mut ws, "a").await, "removed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while worker_record(&gateway, "a").await.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "a was not removed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn undrain_cancels_a_pending_removal_and_bad_requests_are_refused() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let key = key_for(&gateway, "a").await;
    let held = client()
        .get(data(&gateway, "/hold"))
        .header(ROUTING_KEY, &key)
        .send()
        .await
        .unwrap();
    wait_for(&a.state, |s| {
        s.held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(
        post(&gateway, "/admin/workers/a/drain", r#"{"remove":true}"#)
            .await
            .0,
        200
    );
    assert_eq!(post(&gateway, "/admin/workers/a/undrain", "").await.0, 200);
    a.release_all();
    held.bytes().await.unwrap();
    // Give the watcher several polls: a stays, active.
    let mut ws = Client::connect(&gateway).await;
    for _ in 0..10 {
        ws.until(|m| matches!(m, ServerMessage::Tick(_)).then_some(()))
            .await;
    }
    let listed = worker_record(&gateway, "a").await.expect("not removed");
    assert_eq!(listed["state"], "active");

    let (status, body) = post(&gateway, "/admin/workers/nobody/drain", "").await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, json!("unknown_worker"))
    );
    let (status, body) = post(&gateway, "/admin/workers/a/drain", r#"{"remov": true}"#).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (400, json!("invalid_json"))
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_console_drains_and_undrains_over_the_websocket() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let mut ws = Client::connect(&gateway).await;
    ws.send(json!({"type": "drain", "id": 5, "worker": "b"}))
        .await;
    let ack = ws.next_ack().await;
    assert_eq!(ack.id, Some(bch_core::telemetry::CommandId::Number(5)));
    let worker = ack.worker.expect("the worker's record");
    assert_eq!(worker.state, bch_core::telemetry::WorkerState::Draining);
    // Idle from the start: announced at once.
    assert!(!drained(&mut ws, "b").await);
    ws.send(json!({"type": "undrain", "id": 6, "worker": "nobody"}))
        .await;
    let refused = ws.next_error().await;
    assert!(refused.message.contains("nobody"), "{}", refused.message);
    gateway.shutdown().await;
}
