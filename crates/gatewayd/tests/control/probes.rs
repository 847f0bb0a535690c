//! Health probes: a failing worker flips without moving other keys; a worker's own health path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::common::*;
use gatewayd::config::WorkerConfig;
use serde_json::json;

use super::*;

/// A worker whose `/health` counts probes and fails while `fail` is set; everything else is 200.
struct ProbeCounter {
    addr: SocketAddr,
    probes: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    fail: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ProbeCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn probe_counter() -> ProbeCounter {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let probes = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let (p, f, x) = (probes.clone(), failed.clone(), fail.clone());
    let app = axum::Router::new()
        .route(
            "/health",
            axum::routing::get(move || {
                let (p, f, x) = (p.clone(), f.clone(), x.clone());
                async move {
                    p.fetch_add(1, Ordering::SeqCst);
                    if x.load(Ordering::SeqCst) {
                        f.fetch_add(1, Ordering::SeqCst);
                        axum::http::StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        axum::http::StatusCode::OK
                    }
                }
            }),
        )
        .fallback(|| async { "ok" });
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    ProbeCounter {
        addr,
        probes,
        failed,
        fail,
        task,
    }
}

#[tokio::test]
async fn health_probes_flip_a_worker_without_moving_other_keys() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let sick = probe_counter().await;
    let mut config = test_config(&[&a, &b]);
    // Only answered probes may count as failures here, so a slow machine must not time one out.
    config.health.timeout = std::time::Duration::from_millis(5_000);
    config.workers.push(WorkerConfig {
        name: Some("sick".into()),
        url: format!("http://{}", sick.addr),
        ring_id: None,
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    });
    let gateway = start(config).await;
    let keys: Vec<String> = (0..60).map(|i| format!("user-{i}")).collect();
    let mut before = Vec::new();
    for key in &keys {
        before.push(preferred_worker(&gateway, key).await);
    }
    assert!(before.iter().any(|w| w == "sick"), "{before:?}");
    assert!(before.iter().any(|w| w != "sick"), "{before:?}");

    // Unhealthy only after three consecutive failed probes: whenever the API shows it unhealthy,
    // the worker has already failed at least three.
    sick.fail.store(true, Ordering::SeqCst);
    eventually!("sick marked unhealthy", {
        let unhealthy = !healthy(&gateway, "sick").await;
        if unhealthy {
            let failed = sick.failed.load(Ordering::SeqCst);
            assert!(failed >= 3, "unhealthy after only {failed} failed probes");
        }
        unhealthy
    });
    assert!(healthy(&gateway, "a").await && healthy(&gateway, "b").await);
    // Health is a filter on the ring walk, not a rebuild: keys of healthy workers stay put and
    // the sick worker's keys move to the next healthy worker.
    for (key, home) in keys.iter().zip(&before) {
        let now = preferred_worker(&gateway, key).await;
        if home == "sick" {
            assert_ne!(now, "sick", "{key}");
        } else {
            assert_eq!(&now, home, "{key} moved although {home} is healthy");
        }
    }
    let metrics = scrape(&gateway).await;
    assert_eq!(
        sample(&metrics, "bch_worker_healthy", "worker=\"sick\""),
        Some(0.0)
    );
    // Target requests to an unhealthy worker get 503, never another worker.
    let response = client()
        .get(data(&gateway, "/v1/models"))
        .header(TARGET, "sick")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);

    // Back after two consecutive successes.
    let probes_at_recovery = sick.probes.load(Ordering::SeqCst);
    sick.fail.store(false, Ordering::SeqCst);
    eventually!("sick healthy again", {
        let back = healthy(&gateway, "sick").await;
        if back {
            let successes = sick.probes.load(Ordering::SeqCst) - probes_at_recovery;
            assert!(successes >= 2, "healthy after only {successes} probes");
        }
        back
    });
    let mut after = Vec::new();
    for key in &keys {
        after.push(preferred_worker(&gateway, key).await);
    }
    assert_eq!(after, before, "every key is home again");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_worker_health_path_is_probed_instead_of_the_default() {
    let plain = fake_worker("plain").await;
    let custom = fake_worker("custom").await;
    let added = fake_worker("added").await;
    // All three fail /health; only `plain` is probed there.
    for w in [&plain, &custom, &added] {
        w.state.fail_health.store(true, Ordering::SeqCst);
    }
    let mut config = test_config(&[&plain, &custom]);
    config.workers[1].health_path = Some("/echo".into());
    let gateway = start(config).await;
    let response = client()
        .post(control(&gateway, "/admin/workers"))
        .json(&json!({"name": "added", "url": added.url(), "health_path": "/echo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    eventually!("plain marked unhealthy", !healthy(&gateway, "plain").await);
    // By now several probe rounds have run; the workers with their own path were probed there
    // (the fake worker's /echo counts requests) and stayed healthy.
    eventually!(
        "probes reach /echo",
        custom.state.requests.load(Ordering::SeqCst) >= 3
            && added.state.requests.load(Ordering::SeqCst) >= 3
    );
    assert!(healthy(&gateway, "custom").await);
    assert!(healthy(&gateway, "added").await);
    assert_eq!(plain.state.requests.load(Ordering::SeqCst), 0);
    gateway.shutdown().await;
}
