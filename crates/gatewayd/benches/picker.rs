//! The endpoint picker's share of a request, on loopback: one ext_proc stream as Envoy's filter
//! drives it — open the stream, request headers → the pick, response headers → `x-bch-*`, close —
//! against an in-process gatewayd, with a tonic client in Envoy's place (whose gRPC client costs
//! about what Envoy's does; Envoy's own ext_proc work, encoding the headers and applying the answer,
//! is not in it: bench/proxy.sh's envoy-bch target measures the whole).
//!
//! * `picker/stream_round_trips`: the two round trips of one request, sequentially, one stream at
//!   a time: what the picker adds to an unloaded request's latency, apart from Envoy's ext_proc
//!   work. The goal is 0.2 ms.
//!
//! Run: `cargo bench -p gatewayd --bench picker -- --warm-up-time 1 --measurement-time 5`. On a
//! machine shared with other work, report the median and say the machine was shared.

use std::net::SocketAddr;

use criterion::{Criterion, criterion_group, criterion_main};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingRequest};
use futures_util::StreamExt;
use gatewayd::config::{Config, WorkerConfig};
use tokio::sync::mpsc;
use tonic::transport::Channel;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

fn message(request: Request) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        ..ProcessingRequest::default()
    }
}

/// Envoy sends these (HTTP/1.1 client, keyed chat completion) on the request path.
fn request_headers(key: &str) -> ProcessingRequest {
    message(Request::RequestHeaders(HttpHeaders {
        headers: Some(headers(&[
            (":authority", "127.0.0.1:10000"),
            (":path", "/v1/chat/completions"),
            (":method", "POST"),
            (":scheme", "http"),
            ("user-agent", "wrk"),
            ("content-type", "application/json"),
            ("content-length", "1024"),
            ("x-smg-routing-key", key),
            ("x-forwarded-proto", "http"),
            ("x-request-id", "9c7c2c0e-0c1e-4a49-9f36-7a1e3c2f0d11"),
        ])),
        ..HttpHeaders::default()
    }))
}

fn response_headers() -> ProcessingRequest {
    message(Request::ResponseHeaders(HttpHeaders {
        headers: Some(headers(&[
            (":status", "200"),
            ("content-type", "application/json"),
            ("content-length", "995"),
        ])),
        ..HttpHeaders::default()
    }))
}

async fn one_request(channel: &Channel, key: &str) {
    let mut client = ExternalProcessorClient::new(channel.clone());
    let (tx, mut rx) = mpsc::channel(2);
    let outbound = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    tx.send(request_headers(key)).await.unwrap();
    let mut answers = client.process(outbound).await.unwrap().into_inner();
    answers.next().await.unwrap().unwrap();
    tx.send(response_headers()).await.unwrap();
    answers.next().await.unwrap().unwrap();
    drop(tx);
    assert!(answers.next().await.is_none());
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (gateway, channel) = runtime.block_on(async {
        let mut config = Config::default();
        config.server.listeners.data_plane = false;
        config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
        config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
        config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
        config.log.level = "warn".into();
        // Never probed during the run: workers stay healthy and are never contacted.
        config.health.interval = std::time::Duration::from_millis(3_600_000);
        config.workers = (0..4)
            .map(|i| WorkerConfig::from_url(&format!("http://127.0.0.1:{}", 39000 + i)))
            .collect();
        let gateway = gatewayd::start(gatewayd::StartOptions::new(config))
            .await
            .unwrap();
        let picker: SocketAddr = gateway.picker_addr.unwrap();
        let channel = Channel::from_shared(format!("http://{picker}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        (gateway, channel)
    });
    let keys: Vec<String> = (0..1000).map(|i| format!("key-{i}")).collect();
    let mut next = 0usize;
    c.bench_function("picker/stream_round_trips", |b| {
        b.iter(|| {
            next = (next + 1) % keys.len();
            runtime.block_on(one_request(&channel, &keys[next]));
        })
    });
    runtime.block_on(gateway.shutdown());
}

criterion_group!(benches, bench);
criterion_main!(benches);
