//! Models made visible on the control plane: worker records name their models (admin API and
//! telemetry), `/admin/explain?model=` decides in that model's pool, `/metrics` has the per-model
//! families, and learned models (`[health] learn_models`) show what a worker's own `/v1/models`
//! lists without changing where requests go.

use crate::common;

use bch_core::telemetry::ServerMessage;
use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, spawn_worker};
use common::ws::Client;
use common::*;
use gatewayd::config::{Config, WorkerConfig};

use super::*;

/// Four fake workers: `a0`, `a1` serve `alpha`, `b0`, `b1` serve `beta`.
async fn two_model_fleet() -> (Vec<FakeWorker>, Config) {
    let mut workers = Vec::new();
    for name in ["a0", "a1", "b0", "b1"] {
        workers.push(fake_worker(name).await);
    }
    let mut config = test_config(&workers.iter().collect::<Vec<_>>());
    for worker in &mut config.workers {
        let model = match worker.name.as_deref().unwrap().starts_with('a') {
            true => "alpha",
            false => "beta",
        };
        worker.models = vec![model.to_owned()];
    }
    (workers, config)
}

#[tokio::test]
async fn records_name_each_workers_models_on_the_admin_api_and_in_telemetry() {
    let (_workers, config) = two_model_fleet().await;
    let gateway = start(config).await;
    for record in workers(&gateway).await {
        let expected = match record["name"].as_str().unwrap().starts_with('a') {
            true => "alpha",
            false => "beta",
        };
        assert_eq!(record["models"], serde_json::json!([expected]), "{record}");
        assert!(
            record.get("reported_models").is_none(),
            "not learning: {record}"
        );
    }
    let mut client = Client::connect(&gateway).await;
    let ServerMessage::Snapshot(snapshot) = client.frame().await.message else {
        panic!("the first frame is a snapshot");
    };
    for record in &snapshot.workers {
        let expected = if record.name.starts_with('a') {
            "alpha"
        } else {
            "beta"
        };
        assert_eq!(record.models, [expected], "{record:?}");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_fleet_without_models_keeps_its_records_and_explain_answers() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    for record in workers(&gateway).await {
        assert!(record.get("models").is_none(), "{record}");
    }
    let answer = get_json(&control(&gateway, "/admin/explain?routing_key=k")).await;
    assert!(answer.get("model").is_none(), "{answer}");
    let refused = client()
        .get(control(
            &gateway,
            "/admin/explain?routing_key=k&model=alpha",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("declares no models"));
    let metrics = client()
        .get(control(&gateway, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!metrics.contains("bch_worker_models"), "{metrics}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn explain_decides_in_the_models_pool_and_requests_go_where_it_said() {
    let (_workers, config) = two_model_fleet().await;
    let gateway = start(config).await;
    for i in 0..20 {
        for (model, prefix) in [("alpha", "a"), ("beta", "b")] {
            let path = format!("/admin/explain?routing_key=s{i}&model={model}");
            let answer = get_json(&control(&gateway, &path)).await;
            assert_eq!(answer["model"], model, "{answer}");
            let worker = answer["worker"].as_str().unwrap().to_owned();
            assert!(worker.starts_with(prefix), "{model}: {answer}");
            let names: Vec<&String> = answer["loads"].as_object().unwrap().keys().collect();
            assert!(names.iter().all(|n| n.starts_with(prefix)), "{answer}");
            assert_eq!(
                answer["fleet_loads"].as_array().unwrap().len(),
                2,
                "{answer}"
            );
            let response = client()
                .post(data(&gateway, "/echo"))
                .header(ROUTING_KEY, format!("s{i}"))
                .body(format!(r#"{{"model":"{model}"}}"#))
                .send()
                .await
                .unwrap();
            assert_eq!(response.headers()["x-bch-worker"], worker.as_str());
        }
    }
    for (query, says) in [
        ("routing_key=k", "model=M is required"),
        ("routing_key=k&model=gamma", "no worker serves it"),
        ("routing_key=k&model=alpha&model=beta", "more than once"),
    ] {
        let response = client()
            .get(control(&gateway, &format!("/admin/explain?{query}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
        let text = response.text().await.unwrap();
        assert!(text.contains(says), "{query}: {text}");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn metrics_have_each_workers_models_and_each_pools_routable_workers_and_load() {
    let (_workers, config) = two_model_fleet().await;
    let gateway = start(config).await;
    // One alpha request held open (its stream unread): alpha's mean is 1/2, beta's 0.
    let held = client()
        .post(data(&gateway, "/hold"))
        .body(r#"{"model":"alpha"}"#)
        .send()
        .await
        .unwrap();
    let metrics = || async {
        client()
            .get(control(&gateway, "/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    eventually!(
        "the held alpha request in the pool's mean",
        metrics()
            .await
            .contains("bch_pool_load_mean{model=\"alpha\"} 0.5")
    );
    let text = metrics().await;
    for line in [
        "bch_worker_models{worker=\"a0\",model=\"alpha\"} 1",
        "bch_worker_models{worker=\"b1\",model=\"beta\"} 1",
        "bch_pool_routable_workers{model=\"alpha\"} 2",
        "bch_pool_routable_workers{model=\"beta\"} 2",
        "bch_pool_load_min{model=\"alpha\"} 0",
        "bch_pool_load_mean{model=\"beta\"} 0.0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
    drop(held);
    gateway.shutdown().await;
}

/// A simulated worker whose `/v1/models` lists `reports`.
async fn reporting_worker(name: &str, reports: &str) -> WorkerHandle {
    let sim = SimConfig {
        model: reports.to_owned(),
        ..SimConfig::default().with_time_scale(0.01)
    };
    spawn_worker(([127, 0, 0, 1], 0).into(), name, sim)
        .await
        .unwrap()
}

#[tokio::test]
async fn learned_models_are_shown_and_never_change_the_pools() {
    // `b` is configured for beta but its engine lists gamma (a wrong deployment).
    let (a, b) = (
        reporting_worker("a", "alpha").await,
        reporting_worker("b", "gamma").await,
    );
    let mut config = test_config(&[]);
    for (worker, name, model) in [(&a, "a", "alpha"), (&b, "b", "beta")] {
        config.workers.push(WorkerConfig {
            name: Some(name.to_owned()),
            models: vec![model.to_owned()],
            ..WorkerConfig::from_url(&worker.url())
        });
    }
    config.health.learn_models = true;
    let gateway = start(config).await;
    eventually!(
        "both workers' lists",
        workers(&gateway)
            .await
            .iter()
            .all(|w| w["reported_models"].is_array())
    );
    let records = workers(&gateway).await;
    assert_eq!(records[0]["reported_models"], serde_json::json!(["alpha"]));
    assert_eq!(records[1]["reported_models"], serde_json::json!(["gamma"]));
    assert_eq!(records[1]["models"], serde_json::json!(["beta"]));
    // What b reports opened no pool: gamma is unknown, beta still reaches b.
    let gamma = client()
        .post(data(&gateway, "/v1/chat/completions"))
        .body(r#"{"model":"gamma","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(gamma.status(), 404);
    let beta = client()
        .post(data(&gateway, "/v1/chat/completions"))
        .body(r#"{"model":"beta","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(beta.headers()["x-bch-worker"], "b");
    // A worker that stops answering keeps its last list.
    drop(b);
    eventually!(
        "b's probes failing",
        workers(&gateway).await[1]["probe_failure"].is_string()
    );
    let records = workers(&gateway).await;
    assert_eq!(records[1]["reported_models"], serde_json::json!(["gamma"]));
    gateway.shutdown().await;
}
