//! `POST /admin/reload`: a good file applied, a bad one refused, and no file a conflict.

use crate::common::*;
use gatewayd::config::Config;
use serde_json::{Value, json};

use super::*;

fn config_text(gap: u64, skew: &str, workers: &[(&str, &FakeWorker)]) -> String {
    let mut text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ncontrol_listen = \"127.0.0.1:0\"\n\n\
         [health]\ninterval_ms = 100\ntimeout_ms = 500\n\n\
         [policy]\nkind = \"bounded_consistent_hashing\"\nmin_load_gap = {gap}\nmax_load_skew = {skew}\n"
    );
    for (name, worker) in workers {
        text.push_str(&format!(
            "\n[[workers]]\nname = \"{name}\"\nurl = \"{}\"\n",
            worker.url()
        ));
    }
    text
}

#[tokio::test]
async fn reload_applies_a_good_file_and_refuses_a_bad_one() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let file = TempFile::new("reload", &config_text(2, "1.5", &[("a", &a)]));
    let config = Config::load(file.path()).unwrap();
    let gateway =
        gatewayd::start(gatewayd::StartOptions::new(config).config_file(file.path().to_owned()))
            .await
            .unwrap();
    let client = client();
    let reload = || client.post(control(&gateway, "/admin/reload")).send();
    assert_eq!(worker_names(&gateway).await, ["a"]);
    assert_eq!(policy(&gateway).await["min_load_gap"], 2);

    file.write(&config_text(5, "1.75", &[("a", &a), ("b", &b)]).replacen(
        "[policy]\n",
        "[policy]\nspill_order = \"hash_seeded\"\n",
        1,
    ));
    let response = reload().await.unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["policy"]["min_load_gap"], 5);
    let applied = json!({"kind": "bounded_consistent_hashing", "min_load_gap": 5, "max_load_skew": 1.75,
        "spill_order": "hash_seeded", "virtual_nodes": 150, "load_source": "local",
        "admission": {"max_in_flight_per_worker": 0, "queue_timeout_ms": 0, "max_queued": 1024,
            "retry_after_ms": 1000, "max_waiting": 0, "max_kv_usage": 0.0}});
    assert_eq!(policy(&gateway).await, applied);
    assert_eq!(worker_names(&gateway).await, ["a", "b"]);
    let response = client
        .get(data(&gateway, "/v1/models"))
        .header(TARGET, "b")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-worker-name"], "b");

    // The file is the source of truth for membership: a worker added over the API is gone after a
    // reload that does not list it.
    let added = client
        .post(control(&gateway, "/admin/workers"))
        .json(&json!({"name": "c", "url": c.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let response = reload().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(worker_names(&gateway).await, ["a", "b"]);

    // Bad files: 400 naming the field or line; nothing changes (also not the valid parts).
    let bad = [
        (config_text(7, "0.5", &[("a", &a)]), "policy.max_load_skew"),
        (config_text(7, "nan", &[("a", &a)]), "policy.max_load_skew"),
        (
            config_text(7, "1.5", &[("a", &a), ("a", &b)]),
            "workers[1].name",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]) + "\n[[workers]]\nurl = \"nope\"\n",
            "workers[1].url",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]).replace("[policy]", "[policy"),
            "line",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]).replacen(
                "[policy]\n",
                "[policy]\nspill_order = \"next\"\n",
                1,
            ),
            "spill_order",
        ),
        (
            config_text(7, "1.5", &[("a", &a)]) + "\n[log]\nlevels = \"debug\"\n",
            "levels",
        ),
    ];
    for (text, needle) in bad {
        file.write(&text);
        let response = reload().await.unwrap();
        assert_eq!(response.status(), 400, "{text}");
        let message = error_message(&response.json().await.unwrap());
        assert!(
            message.contains(needle),
            "{message:?} does not name {needle}"
        );
        assert_eq!(policy(&gateway).await, applied);
        assert_eq!(worker_names(&gateway).await, ["a", "b"]);
    }
    // A file that disappeared is an error too, and changes nothing.
    let path = file.path().to_owned();
    std::fs::remove_file(&path).unwrap();
    let response = reload().await.unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(policy(&gateway).await, applied);
    gateway.shutdown().await;
}

#[tokio::test]
async fn reload_without_a_config_file_is_a_conflict() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    let response = client()
        .post(control(&gateway, "/admin/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    let message = error_message(&response.json().await.unwrap());
    assert!(message.contains("--config"), "{message}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn reload_applies_admission_and_per_worker_caps() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let workers = [("a", &a), ("b", &b)];
    let file = TempFile::new("reload-admission", &config_text(2, "1.5", &workers));
    let config = Config::load(file.path()).unwrap();
    let gateway =
        gatewayd::start(gatewayd::StartOptions::new(config).config_file(file.path().to_owned()))
            .await
            .unwrap();
    assert_eq!(gateway.routing_table().capacity(0), None);
    let text = config_text(2, "1.5", &workers)
        .replacen(
            "[policy]\n",
            "[admission]\nmax_in_flight_per_worker = 4\n\n[policy]\n",
            1,
        )
        .replacen("name = \"b\"\n", "name = \"b\"\nmax_in_flight = 1\n", 1);
    file.write(&text);
    let response = client()
        .post(control(&gateway, "/admin/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let table = gateway.routing_table();
    let capacity = |name: &str| table.capacity(table.index_of(name).unwrap());
    assert_eq!((capacity("a"), capacity("b")), (Some(4), Some(1)));
    assert_eq!(
        policy(&gateway).await["admission"]["max_in_flight_per_worker"],
        4
    );
    gateway.shutdown().await;
}
