//! The endpoint picker's ext_proc state machine, driven by a tonic client that plays Envoy: what it
//! answers to each message, where the load sits while the stream lives, and that every way a
//! stream ends releases it exactly once. (tests/envoy/run.sh runs the same picker behind a real
//! Envoy.)

use crate::common;

use std::time::Duration;

use bch_core::routing_key::{ExplicitKey, RoutingKey};
use common::envoy::*;
use common::*;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProtocolConfiguration,
};
use futures_util::StreamExt;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};

pub(crate) async fn picker_gateway(
    workers: &[&FakeWorker],
    tweak: impl FnOnce(&mut Config),
) -> RunningGateway {
    let mut config = test_config(workers);
    config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
    tweak(&mut config);
    start(config).await
}

/// Where the router would put `key` and the ring-order fallbacks after it, as `IP:PORT`s.
fn expected_endpoints(gateway: &RunningGateway, key: &str, fallbacks: usize) -> String {
    let table = gateway.routing_table();
    let explicit = ExplicitKey::parse(key.as_bytes()).unwrap();
    let chosen = table
        .explain(&RoutingKey::Explicit(explicit))
        .worker
        .unwrap();
    let addr = |w: usize| {
        table.workers()[w]
            .spec
            .url
            .trim_start_matches("http://")
            .to_owned()
    };
    let mut list = vec![addr(chosen)];
    for worker in table.ring().workers_from(explicit.position()) {
        if worker != chosen && list.len() <= fallbacks {
            list.push(addr(worker));
        }
    }
    list.join(",")
}

pub(crate) fn active(gateway: &RunningGateway, name: &str) -> u64 {
    let table = gateway.routing_table();
    let index = table.index_of(name).unwrap();
    table.workers()[index].stats.active()
}

pub(crate) fn total_active(gateway: &RunningGateway) -> u64 {
    gateway
        .routing_table()
        .workers()
        .iter()
        .map(|w| w.stats.active())
        .sum()
}

/// Waits (bounded) until no worker holds load.
pub(crate) async fn wait_released(gateway: &RunningGateway) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while total_active(gateway) != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "load never released: {:?}",
            active_loads(gateway).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(crate) fn name_at(gateway: &RunningGateway, endpoint: &str) -> String {
    let table = gateway.routing_table();
    table
        .workers()
        .iter()
        .find(|w| w.spec.url == format!("http://{endpoint}"))
        .unwrap()
        .spec
        .name
        .clone()
}

#[tokio::test]
async fn the_pick_is_the_routers_choice_then_ring_order_fallbacks_held_until_the_stream_ends() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let gateway = picker_gateway(&[&a, &b, &c], |_| {}).await;
    let picker = gateway.picker_addr.expect("picker listening");
    for key in ["session-1", "session-2", "session-3", "session-4"] {
        let mut envoy = FakeEnvoy::open(picker).await;
        let answer = envoy
            .exchange(request_headers(&[("x-smg-routing-key", key)]))
            .await;
        let (header, metadata) = picked(&answer);
        assert_eq!(
            header, metadata,
            "header and metadata name the same endpoints"
        );
        assert_eq!(header, expected_endpoints(&gateway, key, 2));
        let chosen = name_at(&gateway, header.split(',').next().unwrap());
        assert_eq!(chosen, preferred_worker(&gateway, key).await);
        assert_eq!(active(&gateway, &chosen), 1, "the decision reserved load");
        let served = header.split(',').next().unwrap().to_owned();
        let answer = envoy.exchange(response_headers(Some(&served), false)).await;
        assert_eq!(
            set_headers(&answer),
            [
                ("x-bch-worker".to_owned(), chosen.clone()),
                (
                    "x-bch-branch".to_owned(),
                    "explicit_routing_key_hit".to_owned()
                )
            ]
        );
        assert_eq!(active(&gateway, &chosen), 1, "held while the body streams");
        envoy.close();
        wait_released(&gateway).await;
    }
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains("bch_branch_total{branch=\"explicit_routing_key_hit\"} 4"),
        "{metrics}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_served_fallback_moves_the_load_and_names_the_server_but_blames_no_one_on_its_word() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let gateway = picker_gateway(&[&a, &b, &c], |_| {}).await;
    let mut envoy = FakeEnvoy::open(gateway.picker_addr.unwrap()).await;
    let (list, _) = picked(
        &envoy
            .exchange(request_headers(&[("x-smg-routing-key", "moving")]))
            .await,
    );
    let endpoints: Vec<&str> = list.split(',').collect();
    let (chosen, fallback) = (
        name_at(&gateway, endpoints[0]),
        name_at(&gateway, endpoints[1]),
    );
    let answer = envoy
        .exchange(response_headers(Some(endpoints[1]), false))
        .await;
    assert_eq!(
        set_headers(&answer)[0],
        ("x-bch-worker".to_owned(), fallback.clone())
    );
    assert_eq!(
        active(&gateway, &chosen),
        0,
        "the load left the chosen worker"
    );
    assert_eq!(
        active(&gateway, &fallback),
        1,
        "and is on the worker that served"
    );
    // The report is Envoy's word, which anyone on the picker port can give: it is counted and
    // asks for a probe of the chosen worker (alive here), and nothing is counted against it.
    let table = gateway.routing_table();
    let chosen_index = table.index_of(&chosen).unwrap();
    assert_eq!(table.workers()[chosen_index].stats.errors_total(), 0);
    assert!(table.healthy_flags()[chosen_index]);
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains("bch_picker_fallback_reports_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("bch_retries_total 0"), "{metrics}");
    envoy.close();
    wait_released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_endpoint_envoy_was_not_given_moves_the_load_without_blaming_the_chosen_worker() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    // No fallbacks: any other endpoint Envoy serves from is one it chose itself (its cluster did
    // not hold the pick, and override_host fell back to round robin).
    let gateway = picker_gateway(&[&a, &b, &c], |c| c.picker.fallbacks = 0).await;
    let mut envoy = FakeEnvoy::open(gateway.picker_addr.unwrap()).await;
    let (list, _) = picked(
        &envoy
            .exchange(request_headers(&[("x-smg-routing-key", "unfollowed")]))
            .await,
    );
    assert!(!list.contains(','), "no fallbacks listed: {list}");
    let chosen = name_at(&gateway, &list);
    let other = [&a, &b, &c]
        .into_iter()
        .find(|w| w.state.name != chosen)
        .unwrap();
    let answer = envoy
        .exchange(response_headers(Some(&other.addr.to_string()), false))
        .await;
    assert_eq!(
        set_headers(&answer)[0],
        ("x-bch-worker".to_owned(), other.state.name.clone())
    );
    assert_eq!(active(&gateway, &chosen), 0);
    assert_eq!(
        active(&gateway, &other.state.name),
        1,
        "the load follows Envoy"
    );
    let table = gateway.routing_table();
    let chosen_index = table.index_of(&chosen).unwrap();
    assert_eq!(table.workers()[chosen_index].stats.errors_total(), 0);
    assert!(
        table.healthy_flags()[chosen_index],
        "nothing said the chosen worker failed"
    );
    assert!(gateway.metrics_text().contains("bch_retries_total 0"));
    envoy.close();
    wait_released(&gateway).await;

    // An endpoint that is no worker at all: the load is released, nothing is counted.
    let mut envoy = FakeEnvoy::open(gateway.picker_addr.unwrap()).await;
    envoy
        .exchange(request_headers(&[("x-smg-routing-key", "unfollowed")]))
        .await;
    envoy
        .exchange(response_headers(Some("127.0.0.1:1"), false))
        .await;
    assert_eq!(total_active(&gateway), 0);
    assert_eq!(table.workers()[chosen_index].stats.errors_total(), 0);
    envoy.close();
    gateway.shutdown().await;
}

#[tokio::test]
async fn refusals_are_immediate_openai_shaped_responses_that_hold_nothing() {
    let a = fake_worker("a").await;
    let gateway = picker_gateway(&[&a], |config| config.server.limits.max_body_bytes = 10).await;
    let picker = gateway.picker_addr.unwrap();
    for (headers, status, code, branch) in [
        (
            vec![("x-smg-target-worker", "nope")],
            503,
            "target_worker_miss",
            Some("target_worker_miss"),
        ),
        (
            vec![("x-smg-routing-key", "k"), ("content-length", "11")],
            413,
            "payload_too_large",
            None,
        ),
    ] {
        let mut envoy = FakeEnvoy::open(picker).await;
        let answer = envoy.exchange(request_headers(&headers)).await;
        let Some(Response::ImmediateResponse(immediate)) = answer.response else {
            panic!("not an immediate response: {answer:?}");
        };
        assert_eq!(immediate.status.unwrap().code, status);
        let body: serde_json::Value = serde_json::from_slice(&immediate.body).unwrap();
        assert_eq!(body["error"]["code"], code);
        assert_eq!(body["error"]["type"], "gateway_error");
        let headers: Vec<(String, Vec<u8>)> = immediate
            .headers
            .unwrap()
            .set_headers
            .into_iter()
            .filter_map(|o| o.header)
            .map(|h| (h.key, h.raw_value))
            .collect();
        assert!(headers.contains(&("content-type".to_owned(), b"application/json".to_vec())));
        assert_eq!(
            headers
                .iter()
                .find(|(k, _)| k == "x-bch-branch")
                .map(|(_, v)| std::str::from_utf8(v).unwrap()),
            branch
        );
        assert_eq!(total_active(&gateway), 0);
    }
    gateway.shutdown().await;

    let empty = picker_gateway(&[], |_| {}).await;
    let mut envoy = FakeEnvoy::open(empty.picker_addr.unwrap()).await;
    let answer = envoy
        .exchange(request_headers(&[("x-smg-routing-key", "k")]))
        .await;
    let Some(Response::ImmediateResponse(immediate)) = answer.response else {
        panic!("not an immediate response: {answer:?}");
    };
    assert_eq!(immediate.status.unwrap().code, 503);
    let body: serde_json::Value = serde_json::from_slice(&immediate.body).unwrap();
    assert_eq!(body["error"]["code"], "no_healthy_workers");
    empty.shutdown().await;
}

#[tokio::test]
async fn every_end_of_a_response_releases_the_load_exactly_once() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = picker_gateway(&[&a, &b], |_| {}).await;
    let picker = gateway.picker_addr.unwrap();
    let routed = |gateway: &RunningGateway| -> u64 {
        gateway
            .routing_table()
            .workers()
            .iter()
            .map(|w| w.stats.requests_total())
            .sum()
    };

    // A last body chunk ends the response while the stream is still open.
    let mut envoy = FakeEnvoy::open(picker).await;
    envoy
        .exchange(request_headers(&[("x-smg-routing-key", "k1")]))
        .await;
    envoy.exchange(response_headers(None, false)).await;
    assert_eq!(total_active(&gateway), 1);
    let answer = envoy
        .exchange(ProcessingRequest {
            request: Some(Request::ResponseBody(HttpBody {
                body: b"data: [DONE]\n\n".to_vec(),
                end_of_stream: true,
                ..HttpBody::default()
            })),
            ..ProcessingRequest::default()
        })
        .await;
    assert!(matches!(answer.response, Some(Response::ResponseBody(_))));
    assert_eq!(total_active(&gateway), 0, "released at the last chunk");

    // Trailers end it too.
    let mut envoy = FakeEnvoy::open(picker).await;
    envoy
        .exchange(request_headers(&[("x-smg-routing-key", "k2")]))
        .await;
    envoy.exchange(response_headers(None, false)).await;
    let answer = envoy
        .exchange(ProcessingRequest {
            request: Some(Request::ResponseTrailers(HttpTrailers::default())),
            ..ProcessingRequest::default()
        })
        .await;
    assert!(matches!(
        answer.response,
        Some(Response::ResponseTrailers(_))
    ));
    assert_eq!(total_active(&gateway), 0, "released at the trailers");

    // A response without a body ends with its headers.
    let mut envoy = FakeEnvoy::open(picker).await;
    envoy
        .exchange(request_headers(&[("x-smg-routing-key", "k3")]))
        .await;
    envoy.exchange(response_headers(None, true)).await;
    assert_eq!(
        total_active(&gateway),
        0,
        "released with end-of-stream headers"
    );

    // Envoy gives up before the response (client abort, upstream error, timeout): the stream is
    // reset, here by dropping the whole client.
    let mut aborted = Vec::new();
    for i in 0..50 {
        let mut envoy = FakeEnvoy::open(picker).await;
        envoy
            .exchange(request_headers(&[(
                "x-smg-routing-key",
                &format!("abort-{i}"),
            )]))
            .await;
        aborted.push(envoy);
    }
    assert_eq!(total_active(&gateway), 50);
    drop(aborted);
    wait_released(&gateway).await;

    // A stream that ended is over: releasing twice would have taken the counter below zero,
    // which it saturates at, so count requests too: each was routed once.
    assert_eq!(routed(&gateway), 53);
    assert_eq!(total_active(&gateway), 0);
    gateway.shutdown().await;
}

#[tokio::test]
async fn every_message_gets_exactly_one_answer_and_protocol_config_alone_gets_none() {
    let a = fake_worker("a").await;
    let gateway = picker_gateway(&[&a], |_| {}).await;
    let mut envoy = FakeEnvoy::open(gateway.picker_addr.unwrap()).await;
    // A message with nothing but protocol_config is not answered: Envoy would take an answer
    // for a spurious response. The next answer is the request headers'.
    envoy
        .send(ProcessingRequest {
            protocol_config: Some(ProtocolConfiguration::default()),
            ..ProcessingRequest::default()
        })
        .await;
    let answer = envoy
        .exchange(request_headers(&[("authorization", "Bearer secret")]))
        .await;
    picked(&answer);
    for (message, check) in [
        (
            Request::RequestBody(HttpBody::default()),
            (|r: &Response| matches!(r, Response::RequestBody(_))) as fn(&Response) -> bool,
        ),
        (Request::RequestTrailers(HttpTrailers::default()), |r| {
            matches!(r, Response::RequestTrailers(_))
        }),
        (Request::ResponseHeaders(HttpHeaders::default()), |r| {
            matches!(r, Response::ResponseHeaders(_))
        }),
        (Request::ResponseBody(HttpBody::default()), |r| {
            matches!(r, Response::ResponseBody(_))
        }),
    ] {
        let answer = envoy
            .exchange(ProcessingRequest {
                request: Some(message),
                ..ProcessingRequest::default()
            })
            .await;
        assert!(check(answer.response.as_ref().unwrap()), "{answer:?}");
    }
    assert_eq!(
        total_active(&gateway),
        1,
        "a body chunk that is not the last ends nothing"
    );
    envoy.close();
    tokio::time::timeout(Duration::from_secs(5), async {
        assert!(
            envoy.answers.next().await.is_none(),
            "no answer after the last message"
        );
    })
    .await
    .unwrap();
    wait_released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_picker_runs_without_the_data_plane_and_refuses_workers_envoy_cannot_address() {
    let a = fake_worker("a").await;
    let gateway = picker_gateway(&[&a], |config| config.server.listeners.data_plane = false).await;
    assert_eq!(gateway.data_addr.port(), 0, "no data plane bound");
    let mut envoy = FakeEnvoy::open(gateway.picker_addr.unwrap()).await;
    let (list, _) = picked(
        &envoy
            .exchange(request_headers(&[("x-smg-routing-key", "alone")]))
            .await,
    );
    assert_eq!(list, a.addr.to_string());
    envoy.close();
    // Workers added at run time obey the picker's rule too.
    let refused = client()
        .post(format!("http://{}/admin/workers", gateway.control_addr))
        .json(&serde_json::json!({"name": "dns", "url": "http://localhost:8000"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body: serde_json::Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("worker dns") && message.contains("IP"),
        "{message}"
    );
    wait_released(&gateway).await;
    gateway.shutdown().await;

    let mut config = test_config(&[&a]);
    config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
    config
        .workers
        .push(WorkerConfig::from_url("http://gpu-7.internal:8000"));
    let error = gatewayd::start(gatewayd::StartOptions::new(config))
        .await
        .err()
        .expect("refused at start")
        .to_string();
    assert!(
        error.contains("workers[1].url") && error.contains("gpu-7.internal:8000"),
        "{error}"
    );
}
