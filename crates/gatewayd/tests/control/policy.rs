//! The policy endpoint: reading and changing the thresholds, and a ring rebuilt for new virtual nodes.

use crate::common::*;
use serde_json::{Value, json};

use super::*;

#[tokio::test]
async fn policy_get_and_put() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let client = client();
    let initial = policy(&gateway).await;
    assert_eq!(
        initial,
        json!({"kind": "consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.5,
            "spill_order": "ring", "virtual_nodes": 150, "load_source": "local",
        "admission": {"max_in_flight_per_worker": 0, "queue_timeout_ms": 0, "max_queued": 1024,
            "retry_after_ms": 1000, "max_waiting": 0, "max_kv_usage": 0.0}})
    );

    // A subset applies and the answer is the whole result.
    let put = |body: &str| {
        client
            .put(control(&gateway, "/admin/policy"))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
    };
    let response = put(r#"{"min_load_gap": 4}"#).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut answer: Value = response.json().await.unwrap();
    // The answer says the change is not persisted, and how to persist it.
    let note = answer["note"].take();
    assert!(
        note.as_str().unwrap().contains("lost on the next reload")
            && note.as_str().unwrap().contains("GET /admin/config"),
        "{note}"
    );
    answer.as_object_mut().unwrap().remove("note");
    assert_eq!(
        answer,
        json!({"kind": "consistent_hashing", "min_load_gap": 4, "max_load_skew": 1.5,
            "spill_order": "ring", "virtual_nodes": 150, "load_source": "local",
        "admission": {"max_in_flight_per_worker": 0, "queue_timeout_ms": 0, "max_queued": 1024,
            "retry_after_ms": 1000, "max_waiting": 0, "max_kv_usage": 0.0}})
    );
    let response = put(
        r#"{"kind": "bounded_consistent_hashing", "max_load_skew": 2.25, "spill_order": "hash_seeded"}"#,
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let good = json!({"kind": "bounded_consistent_hashing", "min_load_gap": 4, "max_load_skew": 2.25,
        "spill_order": "hash_seeded", "virtual_nodes": 150, "load_source": "local",
        "admission": {"max_in_flight_per_worker": 0, "queue_timeout_ms": 0, "max_queued": 1024,
            "retry_after_ms": 1000, "max_waiting": 0, "max_kv_usage": 0.0}});
    let mut answer = response.json::<Value>().await.unwrap();
    answer.as_object_mut().unwrap().remove("note");
    assert_eq!(answer, good);
    assert_eq!(policy(&gateway).await, good);

    // Bad input: 400 naming the field, and nothing changes (also not the valid half of a patch).
    let bad = [
        ("{", "invalid"),
        ("", "invalid"),
        ("[1]", "invalid"),
        (r#"{"min_load_gaps": 1}"#, "min_load_gaps"),
        (r#"{"max_load_skew": 0.99}"#, "max_load_skew"),
        (r#"{"load_source": "prometheus"}"#, "load_source"),
        (
            r#"{"max_load_skew": 0.5, "min_load_gap": 9}"#,
            "max_load_skew",
        ),
        (
            r#"{"min_load_gap": 9, "max_load_skew": 0.5}"#,
            "max_load_skew",
        ),
        (r#"{"max_load_skew": "NaN"}"#, "max_load_skew"),
        (r#"{"max_load_skew": "inf"}"#, "max_load_skew"),
        (r#"{"max_load_skew": 1e999}"#, "invalid"),
        (r#"{"min_load_gap": -1}"#, "min_load_gap"),
        (r#"{"min_load_gap": 1.5}"#, "min_load_gap"),
        (r#"{"min_load_gap": "3"}"#, "min_load_gap"),
        (r#"{"kind": "strict"}"#, "kind"),
        (r#"{"spill_order": "next"}"#, "spill_order"),
        (
            r#"{"spill_order": "ring", "max_load_skew": 0.5}"#,
            "max_load_skew",
        ),
        (r#"{"virtual_nodes": 0}"#, "virtual_nodes"),
        (r#"{"virtual_nodes": 1000000}"#, "virtual_nodes"),
    ];
    for (body, field) in bad {
        let response = put(body).await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let message = error_message(&response.json().await.unwrap());
        assert!(
            message.contains(field),
            "{body}: {message:?} does not name {field}"
        );
        assert_eq!(policy(&gateway).await, good, "{body} changed the policy");
    }

    // Round robin ignores the key: the same key visits both workers.
    let response = put(r#"{"kind": "round_robin"}"#).await.unwrap();
    assert_eq!(
        response.json::<Value>().await.unwrap()["kind"],
        "round_robin"
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let response = client
            .get(data(&gateway, "/v1/models"))
            .header(ROUTING_KEY, "one-key")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        seen.insert(
            response.headers()["x-bch-worker"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn changing_virtual_nodes_rebuilds_the_ring() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let gateway = start(test_config(&[&a, &b, &c])).await;
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    let mut before = Vec::new();
    for key in &keys {
        before.push(preferred_worker(&gateway, key).await);
    }
    let response = client()
        .put(control(&gateway, "/admin/policy"))
        .json(&json!({"virtual_nodes": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(policy(&gateway).await["virtual_nodes"], 1);
    let mut after = Vec::new();
    for key in &keys {
        after.push(preferred_worker(&gateway, key).await);
    }
    let moved = before.iter().zip(&after).filter(|(x, y)| x != y).count();
    assert!(moved > 0, "no key moved with 1 virtual node instead of 150");
    // Requests follow the new ring.
    let response = client()
        .get(data(&gateway, "/v1/models"))
        .header(ROUTING_KEY, keys[0].as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-bch-worker"], after[0].as_str());
    // The ring is a pure function of members and virtual nodes: going back restores placement.
    client()
        .put(control(&gateway, "/admin/policy"))
        .json(&json!({"virtual_nodes": 150}))
        .send()
        .await
        .unwrap();
    let mut restored = Vec::new();
    for key in &keys {
        restored.push(preferred_worker(&gateway, key).await);
    }
    assert_eq!(restored, before);
    gateway.shutdown().await;
}

#[tokio::test]
async fn admission_changes_hot_and_persists_with_per_worker_caps() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a])).await;
    let client = client();
    let put = |body: &str| {
        client
            .put(control(&gateway, "/admin/policy"))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
    };
    for (body, field) in [
        (r#"{"admission": {"max_kv_usage": 2}}"#, "max_kv_usage"),
        (
            r#"{"admission": {"queue_timeout_ms": 600001}}"#,
            "queue_timeout_ms",
        ),
        (r#"{"admission": {"max_inflight": 1}}"#, "max_inflight"),
    ] {
        let response = put(body).await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let message = error_message(&response.json().await.unwrap());
        assert!(message.contains(field), "{body}: {message:?}");
    }
    let response = put(r#"{"admission": {"max_in_flight_per_worker": 1}}"#)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let admission = policy(&gateway).await["admission"].clone();
    assert_eq!(admission["max_in_flight_per_worker"], 1);
    assert_eq!(admission["max_queued"], 1024, "the rest unchanged");

    // The cap is in force at once: a second request while the first holds a is shed.
    let hold = client.post(data(&gateway, "/hold")).send();
    let held = tokio::spawn(hold);
    wait_for(&a.state, |s| {
        s.held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let shed = client
        .get(data(&gateway, "/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers()["retry-after"], "1");
    assert_eq!(shed.headers()["x-bch-branch"], "fleet_full");

    // A worker added with its own cap (0: none) takes what a cannot.
    let added = client
        .post(control(&gateway, "/admin/workers"))
        .json(&json!({"name": "b", "url": b.url(), "max_in_flight": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let served = client
        .get(data(&gateway, "/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["x-bch-worker"], "b");
    let record = worker_record(&gateway, "a").await.unwrap();
    assert_eq!(
        (record["capacity"].clone(), record["full"].clone()),
        (json!(1), json!(true))
    );

    // The configuration in force carries both.
    let text = client
        .get(control(&gateway, "/admin/config"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let config: gatewayd::config::Config = toml::from_str(&text).unwrap();
    assert_eq!(config.admission.max_in_flight_per_worker, 1);
    let b_entry = config
        .workers
        .iter()
        .find(|w| w.name.as_deref() == Some("b"));
    assert_eq!(b_entry.unwrap().max_in_flight, Some(0));
    a.release_all();
    assert_eq!(held.await.unwrap().unwrap().status(), 200);
    gateway.shutdown().await;
}
