//! SGLang Model Gateway's (SMG) client-visible surfaces through a real gateway: the serving
//! worker's URL in `x-smg-routed-worker-id`, `GET /loads` read with the types SMG deserialises
//! its `/get_loads` answer into, and `x-smg-error-code` on the gateway's own answers.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bch_drill::sim::SimConfig;
use bch_drill::worker::spawn_worker;
use gatewayd::config::WorkerConfig;
use serde_json::json;

use crate::common::{client, fake_worker, start, test_config, wait_for};

/// SMG's `WorkerLoadInfo` (crates/protocols/src/worker.rs) as its derived `Deserialize` reads it.
#[derive(Debug, serde::Deserialize)]
#[allow(dead_code, reason = "SMG's fields, read as SMG reads them")]
struct WorkerLoadInfo {
    worker: String,
    worker_type: Option<String>,
    load: isize,
    details: Option<WorkerLoadResponse>,
}

/// SMG's `WorkerLoadResponse`, `#[serde(default)]` as there.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
#[allow(dead_code, reason = "SMG's fields, read as SMG reads them")]
struct WorkerLoadResponse {
    timestamp: String,
    dp_rank_count: i32,
    loads: Vec<serde_json::Value>,
}

/// The `/get_loads` answer SMG's `IntoResponse` writes: `{"workers": [WorkerLoadInfo]}`.
#[derive(Debug, serde::Deserialize)]
struct GetLoads {
    workers: Vec<WorkerLoadInfo>,
}

#[tokio::test]
async fn every_proxied_answer_names_its_worker_by_url_beside_its_name() {
    let mut config = test_config(&[]);
    let mut workers = Vec::new();
    for name in ["sim0", "sim1", "sim2"] {
        let sim = SimConfig::default().with_time_scale(0.01);
        let worker = spawn_worker(([127, 0, 0, 1], 0).into(), name, sim)
            .await
            .unwrap();
        config.workers.push(WorkerConfig {
            name: Some(name.to_owned()),
            ..WorkerConfig::from_url(&worker.url())
        });
        workers.push(worker);
    }
    let urls: HashMap<String, String> = workers
        .iter()
        .map(|w| (w.name().to_owned(), w.url()))
        .collect();
    let gateway = start(config).await;
    let mut served = std::collections::HashSet::new();
    for i in 0..24 {
        let response = client()
            .post(format!("http://{}/v1/chat/completions", gateway.data_addr))
            .header("x-smg-routing-key", format!("session-{i}"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "model": "m", "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers();
        let name = headers["x-bch-worker"].to_str().unwrap().to_owned();
        let routed = headers["x-smg-routed-worker-id"].to_str().unwrap();
        assert_eq!(routed, urls[&name], "{name}");
        assert!(headers.get("x-smg-error-code").is_none());
        served.insert(name);
    }
    assert!(served.len() > 1, "every key went to {served:?}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn loads_answers_in_smgs_shape_with_the_routers_per_worker_load() {
    let held = fake_worker("held").await;
    let idle = fake_worker("idle").await;
    let gateway = start(test_config(&[&held, &idle])).await;
    // The streamed request pinned to `held`, so the other's load stays 0.
    let stream = client()
        .get(format!("http://{}/hold", gateway.data_addr))
        .header("x-smg-target-worker", "held")
        .send()
        .await
        .unwrap();
    wait_for(&held.state, |s| s.held.load(Ordering::SeqCst) == 1).await;
    for path in ["/loads", "/get_loads"] {
        let response = client()
            .get(format!("http://{}{path}", gateway.data_addr))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()["content-type"], "application/json");
        let loads: GetLoads = response.json().await.unwrap();
        let seen: Vec<(String, isize, bool)> = loads
            .workers
            .iter()
            .map(|w| (w.worker.clone(), w.load, w.details.is_none()))
            .collect();
        assert_eq!(
            seen,
            [(held.url(), 1, true), (idle.url(), 0, true)],
            "{path}"
        );
    }
    held.release_all();
    drop(stream);
    gateway.shutdown().await;

    // Switched off, the path is a worker's like any other.
    let mut config = test_config(&[&idle]);
    config.routing.serve_loads = false;
    let gateway = start(config).await;
    let answer: serde_json::Value = client()
        .get(format!("http://{}/loads", gateway.data_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["worker"], "idle", "{answer}");
    assert_eq!(answer["uri"], "/loads", "{answer}");
    gateway.shutdown().await;
}

/// `(status, x-smg-error-code, body code)` of a response.
async fn refusal(response: reqwest::Response) -> (u16, String, String) {
    let status = response.status().as_u16();
    let header = response
        .headers()
        .get("x-smg-error-code")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body: serde_json::Value = response.json().await.unwrap();
    (
        status,
        header,
        body["error"]["code"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn the_gateways_own_answers_carry_smgs_error_code() {
    let worker = fake_worker("w0").await;
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let mut config = test_config(&[&worker]);
    config.workers[0].models = vec!["alpha".into()];
    config.workers.push(WorkerConfig {
        name: Some("gone".into()),
        models: vec!["beta".into()],
        ..WorkerConfig::from_url(&dead_url)
    });
    config.server.timeouts.first_byte = Duration::from_millis(300);
    // Only passive health marks `gone` down, after the request that found it dead.
    config.health.interval = Duration::from_secs(3_600);
    config.health.passive = true;
    let gateway = start(config).await;
    let data = gateway.data_addr;
    let chat = |model: &str| {
        client()
            .post(format!("http://{data}/v1/chat/completions"))
            .json(&json!({"messages": [], "model": model}))
    };
    let cases = [
        // SMG's codes.
        (chat("omega"), (404, "model_not_found", "model_not_found")),
        (
            chat("beta"),
            (502, "no_worker_response", "worker_unreachable"),
        ),
        // Now `gone` is marked down (passive health): nothing left for `beta`.
        (
            chat("beta"),
            (503, "no_available_workers", "no_healthy_workers"),
        ),
        // bch's own codes where SMG has none.
        (
            client()
                .post(format!("http://{data}/v1/chat/completions"))
                .body("not json"),
            (400, "model_required", "model_required"),
        ),
        (
            client()
                .get(format!("http://{data}/stall"))
                .header("x-gateway-model-name", "alpha"),
            (504, "first_byte_timeout", "first_byte_timeout"),
        ),
    ];
    for (request, (status, header, code)) in cases {
        let seen = refusal(request.send().await.unwrap()).await;
        assert_eq!(seen, (status, header.to_owned(), code.to_owned()));
    }
    // The control plane's refusals carry it too.
    let response = client()
        .get(format!("http://{}/admin/nowhere", gateway.control_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(
        refusal(response).await,
        (404, "not_found".to_owned(), "not_found".to_owned())
    );
    gateway.shutdown().await;
}
