//! Admission in picker mode: a shed is an ImmediateResponse 503 with the data plane's headers, and
//! a request with no room waits with its answer held back, so the picker is Envoy's flow control.

use crate::common;

use std::time::Duration;

use common::envoy::*;
use common::*;
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use gatewayd::RunningGateway;

const SILENCE: Duration = Duration::from_millis(300);

/// A picker over `worker` with room for one request, and `queue_timeout_ms`; a stream silent for
/// 300 ms is ended (so a wait longer than that shows the silence is counted from the answer).
async fn capped_picker(worker: &FakeWorker, queue_timeout_ms: u64) -> RunningGateway {
    let mut config = test_config(&[worker]);
    config.picker.silent_stream_timeout = SILENCE;
    config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
    config.admission.max_in_flight_per_worker = 1;
    config.admission.queue_timeout_ms = queue_timeout_ms;
    start(config).await
}

fn queue_length(gateway: &RunningGateway) -> String {
    gateway
        .metrics_text()
        .lines()
        .find_map(|l| Some(l.strip_prefix("bch_admission_queue_length ")?.to_owned()))
        .unwrap_or_default()
}

/// Waits (bounded) until the queue's gauge reads `n`.
async fn wait_queued(gateway: &RunningGateway, n: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while queue_length(gateway) != n {
        assert!(tokio::time::Instant::now() < deadline, "queue never at {n}");
        // Filled by the picker's streams; poll its gauge at a short interval.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn set_headers(answer: &ProcessingResponse) -> Vec<(String, String)> {
    let mutation = match &answer.response {
        Some(Response::ImmediateResponse(immediate)) => immediate.headers.clone(),
        Some(Response::ResponseHeaders(headers)) => headers
            .response
            .as_ref()
            .and_then(|r| r.header_mutation.clone()),
        other => panic!("no headers in {other:?}"),
    };
    mutation
        .unwrap()
        .set_headers
        .into_iter()
        .filter_map(|o| o.header)
        .map(|h| (h.key, String::from_utf8(h.raw_value).unwrap()))
        .collect()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn a_shed_is_an_immediate_503_with_retry_after_and_the_error_code() {
    let w0 = fake_worker("w0").await;
    let gateway = capped_picker(&w0, 0).await;
    let picker = gateway.picker_addr.unwrap();
    let mut holder = FakeEnvoy::open(picker).await;
    let pick = holder.exchange(request_headers(&[])).await;
    assert!(matches!(pick.response, Some(Response::RequestHeaders(_))));
    let mut shed = FakeEnvoy::open(picker).await;
    let answer = shed.exchange(request_headers(&[])).await;
    let Some(Response::ImmediateResponse(immediate)) = &answer.response else {
        panic!("not an immediate response: {answer:?}");
    };
    assert_eq!(immediate.status.unwrap().code, 503);
    let body: serde_json::Value = serde_json::from_slice(&immediate.body).unwrap();
    assert_eq!(body["error"]["code"], "worker_overload_protection_shed");
    let headers = set_headers(&answer);
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(
        header(&headers, "x-smg-error-code"),
        Some("worker_overload_protection_shed")
    );
    assert_eq!(header(&headers, "x-bch-branch"), Some("fleet_full"));
    drop(holder);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_request_without_room_waits_for_its_pick_and_a_leaver_leaves_nothing() {
    let w0 = fake_worker("w0").await;
    let gateway = capped_picker(&w0, 10_000).await;
    let picker = gateway.picker_addr.unwrap();
    // The one slot is taken through the data plane, which has no silence bound.
    let hold = client()
        .post(format!("http://{}/hold", gateway.data_addr))
        .send();
    let holder = tokio::spawn(hold);
    wait_for(&w0.state, |s| {
        s.requests.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let mut leaver = FakeEnvoy::open(picker).await;
    leaver.send(request_headers(&[])).await;
    wait_queued(&gateway, "1").await;
    drop(leaver);
    wait_queued(&gateway, "0").await;

    let mut waiter = FakeEnvoy::open(picker).await;
    waiter.send(request_headers(&[])).await;
    wait_queued(&gateway, "1").await;
    // Longer than the silence bound: the waiting is the picker's, and must not end the stream.
    tokio::time::sleep(SILENCE * 2).await;
    // The holder's response ends: its slot goes to the waiting stream, which gets its pick now.
    w0.release_all();
    assert_eq!(holder.await.unwrap().unwrap().status(), 200);
    let pick = waiter.answer().await;
    assert!(
        matches!(pick.response, Some(Response::RequestHeaders(_))),
        "{pick:?}"
    );
    let annotated = waiter.exchange(response_headers(None, true)).await;
    let headers = set_headers(&annotated);
    assert!(
        header(&headers, "x-bch-queue-wait-ms").is_some(),
        "{headers:?}"
    );
    assert_eq!(queue_length(&gateway), "0");
    assert_eq!(wait_all_idle(&gateway).await, [("w0".to_owned(), 0)]);
    gateway.shutdown().await;
}
