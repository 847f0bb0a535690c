//! What the endpoint picker allocates per request, counted with `allocation-counter` (per thread):
//! the routing decision on Envoy's header list allocates nothing, as on the data plane; the answers
//! allocate only the protobuf messages themselves (strings, vectors and maps prost needs) and the
//! endpoint list. Decoding Envoy's message (tonic, prost) is outside what is counted here.

use allocation_counter::measure;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingRequest};
use gatewayd::config::{Config, WorkerConfig};
use gatewayd::testing::SessionProbe;

const REPEAT: u64 = 200;

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

fn probe() -> SessionProbe {
    let mut config = Config::default();
    config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    config.workers = (0..8)
        .map(|i| WorkerConfig::from_url(&format!("http://127.0.0.1:{}", 31000 + i)))
        .collect();
    SessionProbe::new(&config).expect("valid configuration")
}

fn request_headers(key: &str) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(headers(&[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                ("content-type", "application/json"),
                ("content-length", "1024"),
                ("x-smg-routing-key", key),
            ])),
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn response_headers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::ResponseHeaders(HttpHeaders {
            headers: Some(headers(&[(":status", "200")])),
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

#[tokio::test]
async fn the_decision_allocates_nothing_and_the_answers_only_their_messages() {
    let mut probe = probe();
    let keyed = headers(&[
        (":path", "/v1/chat/completions"),
        ("content-length", "1024"),
        ("x-smg-routing-key", "session-42"),
    ]);
    let implicit = headers(&[("authorization", "Bearer secret")]);
    let keyless = headers(&[(":path", "/v1/models")]);
    for (what, list) in [
        ("explicit", &keyed),
        ("implicit", &implicit),
        ("keyless", &keyless),
    ] {
        assert!(probe.decide(list), "{what}: a worker is chosen");
        let decisions = measure(|| {
            for _ in 0..REPEAT {
                assert!(probe.decide(list));
            }
        });
        // Telemetry's queue allocates a block per 32 events it carries (a keyed request is two
        // events, routed and finished) unless the aggregator has handed one back: allow that,
        // nothing per request.
        assert!(
            decisions.count_total <= 2 * REPEAT / 32 + 1,
            "{what}: {} allocations in {REPEAT} decisions",
            decisions.count_total
        );
    }

    // A whole request as the picker sees it, message by message: the request headers' answer (the
    // pick), the response headers' answer (x-bch-worker, x-bch-branch), the end of the stream.
    let (pick, annotate) = (request_headers("session-42"), response_headers());
    let mut counts = [0u64; 3];
    for _ in 0..REPEAT {
        counts[0] += measure(|| drop(probe.answer(&pick).expect("an answer"))).count_total;
        counts[1] += measure(|| drop(probe.answer(&annotate).expect("an answer"))).count_total;
        counts[2] += measure(|| probe.next_stream()).count_total;
    }
    let [pick_allocs, annotate_allocs, end_allocs] = counts.map(|n| n as f64 / REPEAT as f64);
    println!(
        "picker allocations per request: pick answer {pick_allocs:.2}, response-headers answer \
         {annotate_allocs:.2}, end of stream {end_allocs:.2}"
    );
    // The end of a stream (load released, telemetry told, request logged) allocates nothing but
    // telemetry's amortised queue blocks; the answers only their messages, a fixed handful.
    assert!(end_allocs <= 1.0 / 8.0, "end of stream: {end_allocs}");
    assert!(pick_allocs <= 10.0, "pick answer: {pick_allocs}");
    assert!(
        annotate_allocs <= 6.0,
        "response-headers answer: {annotate_allocs}"
    );
}
