//! Membership changes through the admin API derive the new ring from the one in force instead of
//! building it whole: the placement they leave must be the one a gateway started with the final
//! worker list has, key for key.

use crate::common::*;
use gatewayd::config::{Config, WorkerConfig};
use serde_json::json;

use super::*;

/// A worker nothing listens on: placement needs no live worker, and probes are slowed so that
/// every worker stays healthy (and so the preferred worker is the ring owner).
fn idle_worker(name: &str, index: usize) -> WorkerConfig {
    WorkerConfig {
        name: Some(name.to_owned()),
        url: format!("http://127.0.{}.{}:9", 1 + index / 250, index % 250),
        ring_id: index.is_multiple_of(4).then(|| format!("replica-{index}")),
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    }
}

fn config_of(workers: Vec<WorkerConfig>) -> Config {
    let mut config = test_config(&[]);
    config.health.interval = std::time::Duration::from_secs(3600);
    config.workers = workers;
    config
}

#[tokio::test]
async fn admin_membership_changes_place_keys_like_a_fresh_start() {
    let mut workers: Vec<WorkerConfig> =
        (0..40).map(|i| idle_worker(&format!("w{i}"), i)).collect();
    let gateway = start(config_of(workers.clone())).await;
    let client = client();
    let add = |worker: &WorkerConfig| {
        let mut body = json!({"name": worker.name.clone().unwrap(), "url": worker.url});
        if let Some(ring_id) = &worker.ring_id {
            body["ring_id"] = json!(ring_id);
        }
        client
            .post(control(&gateway, "/admin/workers"))
            .json(&body)
            .send()
    };
    let remove = |name: &str| {
        client
            .delete(control(&gateway, &format!("/admin/workers/{name}")))
            .send()
    };
    // Joins at the end, departures from the middle and the ends, a worker that comes back.
    let mut departed = Vec::new();
    for step in 0..6 {
        let joining = idle_worker(&format!("x{step}"), 100 + step);
        assert_eq!(add(&joining).await.unwrap().status(), 201);
        workers.push(joining);
        let at = (step * 7) % workers.len();
        assert_eq!(
            remove(workers[at].name.as_deref().unwrap())
                .await
                .unwrap()
                .status(),
            200
        );
        departed.push(workers.remove(at));
    }
    let back = departed.swap_remove(0);
    assert_eq!(add(&back).await.unwrap().status(), 201);
    workers.push(back);

    let names: Vec<String> = worker_records(&gateway)
        .await
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = workers.iter().map(|w| w.name.clone().unwrap()).collect();
    assert_eq!(names, expected, "the admin API kept configuration order");

    let fresh = start(config_of(workers)).await;
    for i in 0..300 {
        let key = format!("session-{i}");
        assert_eq!(
            preferred_worker(&gateway, &key).await,
            preferred_worker(&fresh, &key).await,
            "key {key}"
        );
    }
}
