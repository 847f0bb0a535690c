//! The picker's bounds on ext_proc streams, each of which holds a request's load for its life: a
//! stream Envoy leaves silent is ended, and streams over the cap are refused.

use crate::common;
use crate::sessions::{picker_gateway, total_active, wait_released};

use std::time::Duration;

use common::envoy::*;
use common::*;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, ProcessingRequest};
use futures_util::StreamExt;
use gatewayd::RunningGateway;

fn body_chunk() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseBody(HttpBody {
            body: b"data: {}\n\n".to_vec(),
            end_of_stream: false,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// Waits (bounded) until `/metrics` holds `line`.
async fn wait_metric(gateway: &RunningGateway, line: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = gateway.metrics_text();
        if metrics.contains(line) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {line:?}: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_silent_stream_is_ended_and_its_load_released_while_a_talking_one_lives_on() {
    let a = fake_worker("a").await;
    let gateway = picker_gateway(&[&a], |config| {
        config.picker.silent_stream_timeout = Duration::from_millis(2_000);
    })
    .await;
    let picker = gateway.picker_addr.unwrap();
    let mut silent = FakeEnvoy::open(picker).await;
    silent
        .exchange(request_headers(&[("x-smg-routing-key", "quiet")]))
        .await;
    let mut talking = FakeEnvoy::open(picker).await;
    talking
        .exchange(request_headers(&[("x-smg-routing-key", "chatty")]))
        .await;
    talking.exchange(response_headers(None, false)).await;
    assert_eq!(total_active(&gateway), 2);
    // The talking stream goes on for 1.5 times the bound, a message every tenth of it.
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        talking.exchange(body_chunk()).await;
    }
    let end = tokio::time::timeout(Duration::from_secs(5), silent.answers.next())
        .await
        .expect("the silent stream ended");
    assert!(
        end.is_none(),
        "ended normally, Envoy goes on without it: {end:?}"
    );
    assert_eq!(total_active(&gateway), 1, "only the talking stream's load");
    wait_metric(&gateway, "bch_picker_silent_streams_total 1").await;
    talking.close();
    wait_released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn streams_over_the_cap_are_refused_and_counted_and_the_others_unaffected() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = picker_gateway(&[&a, &b], |config| config.picker.max_streams = 3).await;
    let picker = gateway.picker_addr.unwrap();
    let mut open = Vec::new();
    for i in 0..3 {
        let mut envoy = FakeEnvoy::open(picker).await;
        envoy
            .exchange(request_headers(&[(
                "x-smg-routing-key",
                &format!("held-{i}"),
            )]))
            .await;
        open.push(envoy);
    }
    let refused = FakeEnvoy::try_open(picker).await.err().expect("refused");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains("bch_picker_refused_streams_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("bch_picker_streams 3"), "{metrics}");
    for envoy in &mut open {
        let answer = envoy.exchange(response_headers(None, false)).await;
        assert_eq!(set_headers(&answer)[1].0, "x-bch-branch");
    }
    assert_eq!(
        total_active(&gateway),
        3,
        "the open streams hold their load"
    );
    // A stream that ends gives its slot back.
    drop(open.pop());
    wait_metric(&gateway, "bch_picker_streams 2").await;
    let mut next = FakeEnvoy::try_open(picker).await.expect("a slot again");
    picked(
        &next
            .exchange(request_headers(&[("x-smg-routing-key", "next")]))
            .await,
    );
    drop(open);
    next.close();
    wait_released(&gateway).await;
    gateway.shutdown().await;
}
