//! Data plane integration tests: real fake workers and a real gateway on loopback.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use gatewayd::config::WorkerConfig;

const ROUTING_KEY: &str = "x-smg-routing-key";

fn bounded(config: &mut gatewayd::config::Config, gap: u64) {
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    config.policy.min_load_gap = gap;
    config.policy.max_load_skew = 1.5;
}

#[tokio::test]
async fn keyed_requests_follow_the_golden_ring() {
    let parity: serde_json::Value = serde_json::from_str(include_str!(
        "../../../core/tests/fixtures/ring_parity.json"
    ))
    .unwrap();
    let golden_urls: Vec<String> = parity["all_healthy"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_owned())
        .collect();
    let mut workers = Vec::new();
    for i in 0..golden_urls.len() {
        workers.push(fake_worker(&format!("w{i}")).await);
    }
    let mut config = test_config(&workers.iter().collect::<Vec<_>>());
    // Real workers listen on free ports; ring_id pins their ring identity to the golden URLs.
    for (worker, golden) in config.workers.iter_mut().zip(&golden_urls) {
        worker.ring_id = Some(golden.clone());
    }
    let gateway = start(config).await;
    let client = client();
    let placements = parity["all_healthy"]["placements"].as_array().unwrap();
    assert!(placements.len() >= 10);
    for placement in placements {
        let key = placement["key"].as_str().unwrap();
        let expected_url = placement["worker"].as_str().unwrap();
        let expected = format!(
            "w{}",
            golden_urls.iter().position(|u| u == expected_url).unwrap()
        );
        let response = client
            .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
            .header(ROUTING_KEY, key)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["x-bch-worker"],
            expected.as_str(),
            "key {key}"
        );
        assert_eq!(response.headers()["x-worker-name"], expected.as_str());
        assert_eq!(
            response.headers()["x-bch-branch"],
            "explicit_routing_key_hit"
        );
    }
    gateway.shutdown().await;
}

/// Holds `n` streams for `key` open and returns the worker each landed on.
async fn hold_streams(
    gateway: &gatewayd::RunningGateway,
    key: &str,
    n: usize,
) -> (Vec<String>, Vec<reqwest::Response>) {
    let client = client();
    let mut placed = Vec::new();
    let mut open = Vec::new();
    for _ in 0..n {
        let mut response = client
            .get(format!("http://{}/hold", gateway.data_addr))
            .header(ROUTING_KEY, key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        placed.push(
            response.headers()["x-bch-worker"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        // Wait for the first chunk so the stream is really open on the worker.
        let first = response.chunk().await.unwrap().unwrap();
        assert!(first.starts_with(b"data: {\"first\":true}"));
        open.push(response);
    }
    (placed, open)
}

#[tokio::test]
async fn strict_policy_never_spills() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let home = preferred_worker(&gateway, "hot").await;
    let (placed, open) = hold_streams(&gateway, "hot", 8).await;
    assert!(placed.iter().all(|w| *w == home), "{placed:?}");
    drop(open);
    a.release_all();
    b.release_all();
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    gateway.shutdown().await;
}

#[tokio::test]
async fn bounded_policy_spills_exactly_when_the_rule_says() {
    for gap in [0u64, 1, 2, 4] {
        let (a, b) = (fake_worker("a").await, fake_worker("b").await);
        let mut config = test_config(&[&a, &b]);
        bounded(&mut config, gap);
        let gateway = start(config).await;
        let home = preferred_worker(&gateway, "session-a").await;
        let (placed, open) = hold_streams(&gateway, "session-a", 8).await;
        // Replay the rule by hand: loads before each request, two healthy workers.
        let mut loads = std::collections::HashMap::<String, u64>::new();
        for (i, worker) in placed.iter().enumerate() {
            let p = loads.get(&home).copied().unwrap_or(0);
            let min = ["a", "b"]
                .iter()
                .map(|w| loads.get(*w).copied().unwrap_or(0))
                .min()
                .unwrap();
            let mean = i as f64 / 2.0;
            let spill = p.saturating_sub(min) > gap && p as f64 > mean * 1.5;
            let expected = if spill {
                if home == "a" { "b" } else { "a" }
            } else {
                home.as_str()
            };
            assert_eq!(
                worker, expected,
                "gap {gap}, request {i}, placed {placed:?}"
            );
            *loads.entry(worker.clone()).or_default() += 1;
        }
        let on_home = placed.iter().filter(|w| **w == home).count();
        assert_eq!(
            on_home, 6,
            "six of eight stay home for gap {gap}: {placed:?}"
        );
        drop(open);
        a.release_all();
        b.release_all();
        assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn sse_passes_through_byte_identical_and_incrementally() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let client = client();
    let direct = client
        .get(format!("{}/sse?n=8&gap_ms=5", a.url()))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let proxied = client
        .get(format!("http://{}/sse?n=8&gap_ms=5", gateway.data_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(proxied.headers()["content-type"], "text/event-stream");
    let proxied = proxied.bytes().await.unwrap();
    assert_eq!(proxied, direct);

    // The first chunk arrives while the worker still holds the stream open.
    let mut response = client
        .get(format!("http://{}/hold", gateway.data_addr))
        .send()
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), response.chunk())
        .await
        .expect("first chunk before the upstream finishes")
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"data: {\"first\":true}\n\n");
    assert_eq!(a.state.held.load(std::sync::atomic::Ordering::SeqCst), 1);
    a.release_all();
    let rest = response.bytes().await.unwrap();
    assert_eq!(&rest[..], b"data: [DONE]\n\n");
    gateway.shutdown().await;
}

#[tokio::test]
async fn requests_and_bodies_are_forwarded() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let body = "x".repeat(200_000);
    let response: serde_json::Value = client()
        .post(format!(
            "http://{}/v1/completions?stream=false",
            gateway.data_addr
        ))
        .header(ROUTING_KEY, "k")
        .header("authorization", "Bearer secret")
        .header("connection", "x-hop")
        .header("x-hop", "must not reach the worker")
        .body(body.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(response["method"], "POST");
    assert_eq!(response["uri"], "/v1/completions?stream=false");
    assert_eq!(response["body_len"], 200_000);
    assert_eq!(response["headers"][ROUTING_KEY], "k");
    assert_eq!(response["headers"]["authorization"], "Bearer secret");
    assert!(response["headers"].get("x-hop").is_none());
    assert_eq!(response["headers"]["host"], a.addr.to_string());
    gateway.shutdown().await;
}

#[tokio::test]
async fn load_returns_to_zero_on_every_ending() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let client = client();
    let url = |path: &str| format!("http://{}{path}", gateway.data_addr);

    // Normal completion.
    let ok = client.get(url("/sse?n=3&gap_ms=1")).send().await.unwrap();
    ok.bytes().await.unwrap();
    assert_eq!(wait_all_idle(&gateway).await, vec![("a".to_owned(), 0)]);

    // Upstream 5xx passes through unchanged.
    let failed = client.get(url("/status/500")).send().await.unwrap();
    assert_eq!(failed.status(), 500);
    failed.bytes().await.unwrap();
    assert_eq!(wait_all_idle(&gateway).await, vec![("a".to_owned(), 0)]);

    // Upstream crash mid-stream: the SSE stream ends with an error event, not a silent cut.
    let crashed = client.get(url("/crash")).send().await.unwrap();
    let body = crashed.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(text.starts_with("data: {\"n\":1}"), "{text}");
    assert!(text.contains("event: error"), "{text}");
    assert_eq!(wait_all_idle(&gateway).await, vec![("a".to_owned(), 0)]);

    // Client disconnect mid-stream, 200 times without drift.
    for _ in 0..200 {
        let mut held = client.get(url("/hold")).send().await.unwrap();
        held.chunk().await.unwrap().unwrap();
        drop(held);
    }
    assert_eq!(wait_all_idle(&gateway).await, vec![("a".to_owned(), 0)]);
    a.release_all();

    gateway.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_while_upstream_stalls_releases_load_and_cancels_upstream() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    for round in 1..=20u64 {
        let url = format!("http://{}/stall", gateway.data_addr);
        let request = tokio::spawn(async move { client().get(url).send().await });
        wait_for(&a.state, |s| {
            s.stalled.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await;
        assert_eq!(active_loads(&gateway).await, vec![("a".to_owned(), 1)]);
        request.abort();
        let _ = request.await;
        // The gateway drops the upstream request, so the worker sees its handler cancelled.
        wait_for(&a.state, |s| {
            s.cancelled.load(std::sync::atomic::Ordering::SeqCst) == round
        })
        .await;
        assert_eq!(
            wait_all_idle(&gateway).await,
            vec![("a".to_owned(), 0)],
            "round {round}"
        );
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn removing_a_worker_stops_traffic_and_re_adding_keeps_counters() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let client = client();
    let control = format!("http://{}", gateway.control_addr);
    let home = preferred_worker(&gateway, "k").await;
    let (home_worker, other) = if home == "a" { (&a, "b") } else { (&b, "a") };
    let (_, open) = hold_streams(&gateway, "k", 2).await;

    let removed = client
        .delete(format!("{control}/admin/workers/{home}"))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    for _ in 0..20 {
        let r = client
            .get(format!("http://{}/echo", gateway.data_addr))
            .header(ROUTING_KEY, "k")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-bch-worker"], other);
    }
    let readd = client
        .post(format!("{control}/admin/workers"))
        .json(&WorkerConfig {
            name: Some(home.clone()),
            url: home_worker.url(),
            ring_id: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            server_name: None,
            models: Vec::new(),
        })
        .send()
        .await
        .unwrap();
    assert_eq!(readd.status(), 201);
    let loads = active_loads(&gateway).await;
    assert!(
        loads.contains(&(home.clone(), 2)),
        "old streams still count: {loads:?}"
    );
    drop(open);
    home_worker.release_all();
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    gateway.shutdown().await;
}

#[tokio::test]
async fn gateway_errors_and_bad_input() {
    let a = fake_worker("a").await;
    let mut config = test_config(&[&a]);
    config.server.limits.max_body_bytes = 1024;
    let gateway = start(config).await;
    let client = client();
    let data = format!("http://{}", gateway.data_addr);

    let too_big = client
        .post(format!("{data}/echo"))
        .body(vec![b'x'; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);
    let chunked = reqwest::Body::wrap_stream(futures_util::stream::iter(
        (0..8).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 512])),
    ));
    let too_big_chunked = client
        .post(format!("{data}/echo"))
        .body(chunked)
        .send()
        .await
        .unwrap();
    assert_eq!(too_big_chunked.status(), 413);

    let miss = client
        .get(format!("{data}/echo"))
        .header("x-smg-target-worker", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(miss.status(), 503);
    assert_eq!(miss.headers()["x-bch-branch"], "target_worker_miss");
    let body: serde_json::Value = miss.json().await.unwrap();
    assert_eq!(body["error"]["code"], "target_worker_miss");

    let hit = client
        .get(format!("{data}/echo"))
        .header("x-smg-target-worker", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(hit.headers()["x-bch-branch"], "target_worker_hit");

    let long_key = "k".repeat(129);
    let ignored = client
        .get(format!("{data}/echo"))
        .header(ROUTING_KEY, &long_key)
        .send()
        .await
        .unwrap();
    assert_eq!(ignored.headers()["x-bch-branch"], "keyless");
    let bad_utf8 = client
        .get(format!("{data}/echo"))
        .header(
            ROUTING_KEY,
            reqwest::header::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(bad_utf8.headers()["x-bch-branch"], "keyless");
    let metrics = client
        .get(format!("http://{}/metrics", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("bch_ignored_routing_keys_total{reason=\"too_long\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("bch_ignored_routing_keys_total{reason=\"not_utf8\"} 1"));

    a.state
        .fail_health
        .store(true, std::sync::atomic::Ordering::SeqCst);
    drop(a);
    let unreachable = client.get(format!("{data}/echo")).send().await.unwrap();
    assert_eq!(unreachable.status(), 502);
    let none = client.get(format!("{data}/echo")).send().await.unwrap();
    assert_eq!(
        none.status(),
        503,
        "passive marking took the dead worker out"
    );
    let ready = client
        .get(format!("{data}/readiness"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let live = client.get(format!("{data}/health")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    gateway.shutdown().await;
}

#[tokio::test]
async fn connect_failure_is_retried_once_on_the_next_worker() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let home = preferred_worker(&gateway, "retry-me").await;
    let (dead, alive) = if home == "a" { (a, b) } else { (b, a) };
    dead.stop().await;
    let response = client()
        .post(format!("http://{}/echo", gateway.data_addr))
        .header(ROUTING_KEY, "retry-me")
        .body("payload survives the retry")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-bch-worker"],
        alive.state.name.as_str()
    );
    let echoed: serde_json::Value = response.json().await.unwrap();
    assert_eq!(echoed["body"], "payload survives the retry");
    // Target-worker requests are never retried elsewhere.
    let pinned = client()
        .get(format!("http://{}/echo", gateway.data_addr))
        .header("x-smg-target-worker", home.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(pinned.status(), 503, "the dead worker was marked unhealthy");
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    gateway.shutdown().await;
}

#[tokio::test]
async fn many_streams_in_parallel() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let data = gateway.data_addr;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            tokio::spawn(async move {
                let mut stream = client()
                    .get(format!("http://{data}/sse?n=4&gap_ms=2"))
                    .header(ROUTING_KEY, format!("key-{}", i % 7))
                    .send()
                    .await
                    .unwrap()
                    .bytes_stream();
                let mut n = 0;
                while let Some(chunk) = stream.next().await {
                    chunk.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap() >= 1);
    }
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    gateway.shutdown().await;
}

/// Keep-alive to workers: sequential requests travel on one worker connection whatever the
/// response's framing (Content-Length, chunked SSE, an error status, no body), and a connection whose
/// response was abandoned midway is closed rather than handed to the next request.
#[tokio::test]
async fn sequential_requests_reuse_one_worker_connection() {
    let worker = fake_worker("w").await;
    let gateway = start(test_config(&[&worker])).await;
    let client = client();
    let base = format!("http://{}", gateway.data_addr);
    for round in 0..5 {
        let response = client
            .post(format!("{base}/echo"))
            .body("x".repeat(100))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let echoed: serde_json::Value = response.json().await.unwrap();
        assert_eq!(echoed["body_len"], 100);
        wait_all_idle(&gateway).await;

        let response = client
            .get(format!("{base}/sse?n=3&gap_ms=0"))
            .send()
            .await
            .unwrap();
        let text = response.text().await.unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "round {round}: {text}");
        wait_all_idle(&gateway).await;

        let response = client
            .get(format!("{base}/status/404"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404);
        response.bytes().await.unwrap();
        wait_all_idle(&gateway).await;

        let response = client
            .get(format!("{base}/status/204"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
        assert!(response.bytes().await.unwrap().is_empty());
        wait_all_idle(&gateway).await;
    }
    assert_eq!(worker.state.requests.load(Ordering::SeqCst), 20);
    assert_eq!(worker.state.data_connections.lock().unwrap().len(), 1);

    // Abandon a stream after its first event: its connection cannot carry another request.
    let (_, open) = hold_streams(&gateway, "k", 1).await;
    drop(open);
    wait_all_idle(&gateway).await;
    let response = client.get(format!("{base}/echo")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    wait_all_idle(&gateway).await;
    let connections = worker.state.data_connections.lock().unwrap().len();
    // The reused connection carried the abandoned stream and was closed with it.
    assert_eq!(connections, 2);
    gateway.shutdown().await;
}

#[tokio::test]
async fn every_request_has_an_id_that_reaches_the_worker_and_comes_back() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let client = client();
    let url = format!("http://{}/echo", gateway.data_addr);
    // The client's own id is kept.
    let response = client
        .get(&url)
        .header("x-request-id", "trace-abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "trace-abc-123");
    let echo: serde_json::Value = response.json().await.unwrap();
    assert_eq!(echo["headers"]["x-request-id"], "trace-abc-123");
    // Without one (or with one the gateway will not carry), the gateway's id goes both ways.
    let mut seen = std::collections::HashSet::new();
    for sent in [None, Some("has a space"), Some("")] {
        let mut request = client.get(&url);
        if let Some(id) = sent {
            request = request.header("x-request-id", id);
        }
        let response = request.send().await.unwrap();
        let id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let echo: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            echo["headers"]["x-request-id"],
            id.as_str(),
            "forwarded as returned"
        );
        assert!(id.len() > 9 && id.contains('-'), "{id}");
        assert!(seen.insert(id), "ids are unique");
    }
    // Gateway-made answers carry it too.
    let refused = client
        .get(&url)
        .header("x-smg-target-worker", "nobody")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("x-request-id"));
    gateway.shutdown().await;
}
