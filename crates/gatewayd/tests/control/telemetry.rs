//! Telemetry websocket tests: a real tokio-tungstenite client against a real gateway on loopback.

use crate::common;

use std::time::Duration;

use bch_core::telemetry::ServerMessage;
use common::ws::Client;
use common::*;
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// `(min_load_gap, max_load_skew)` as `GET /admin/policy` reports them.
async fn http_thresholds(policy_url: &str) -> (Option<u64>, Option<f64>) {
    let policy: serde_json::Value = bch_drill::tls::get(policy_url)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        policy["min_load_gap"].as_u64(),
        policy["max_load_skew"].as_f64(),
    )
}

fn bounded_config(workers: &[&FakeWorker]) -> gatewayd::config::Config {
    let mut config = test_config(workers);
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    config
}

#[tokio::test]
async fn snapshot_first_then_ticks_follow_a_held_stream() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(bounded_config(&[&a, &b])).await;
    let mut client = Client::connect(&gateway).await;
    let first = client.frame().await;
    let ServerMessage::Snapshot(snapshot) = first.message else {
        panic!("first frame must be a snapshot, got {first:?}");
    };
    assert_eq!(snapshot.workers.len(), 2);
    let ring = snapshot
        .ring
        .as_ref()
        .expect("a version 1 snapshot carries the ring's arcs");
    assert_eq!(ring.workers.len(), 2);
    // The admission summary: nothing waits and nothing was shed on an idle gateway.
    let admission = snapshot
        .admission
        .expect("a gateway with admission summarises it");
    assert_eq!((admission.waiting, admission.shed_total), (0, 0));
    let share_sum: f64 = ring.workers.iter().map(|w| w.share).sum();
    assert!((share_sum - 1.0).abs() < 1e-9);

    let mut held = bch_drill::tls::http_client()
        .build()
        .unwrap()
        .get(format!("http://{}/hold", gateway.data_addr))
        .header("x-smg-routing-key", "watched-key")
        .send()
        .await
        .unwrap();
    let worker = held.headers()["x-bch-worker"].to_str().unwrap().to_owned();
    held.chunk().await.unwrap();
    // Worker and key records may arrive in one tick or in several: track the latest of each.
    let mut worker_active = None;
    let mut key = None;
    client
        .until(|m| {
            if let ServerMessage::Tick(t) = m {
                if let Some(w) = t.workers.iter().find(|w| w.name == worker) {
                    worker_active = Some(w.active);
                }
                if let Some(k) = t.keys.iter().find(|k| k.key == "watched-key") {
                    key = Some(k.clone());
                }
            }
            (worker_active == Some(1) && key.is_some()).then_some(())
        })
        .await;
    let key = key.unwrap();
    assert_eq!(key.current, worker);
    assert_eq!(key.preferred, worker);
    assert_eq!(key.active.get(&worker), Some(&1));
    drop(held);
    client
        .until(|m| match m {
            ServerMessage::Tick(t) => t
                .workers
                .iter()
                .find(|w| w.name == worker && w.active == 0)
                .map(|_| ()),
            _ => None,
        })
        .await;
    a.release_all();
    b.release_all();
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_spill_appears_with_the_numbers_behind_it() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let mut config = bounded_config(&[&a, &b]);
    config.policy.min_load_gap = 2;
    let gateway = start(config).await;
    let mut client = Client::connect(&gateway).await;
    client.frame().await;
    let http = bch_drill::tls::http_client().build().unwrap();
    let mut open = Vec::new();
    let mut placed = Vec::new();
    // Loads [p, 0] spill at p = 3 with gap 2 and skew 1.5: the fourth request spills.
    for _ in 0..4 {
        let mut r = http
            .get(format!("http://{}/hold", gateway.data_addr))
            .header("x-smg-routing-key", "hot-key")
            .send()
            .await
            .unwrap();
        placed.push(r.headers()["x-bch-worker"].to_str().unwrap().to_owned());
        r.chunk().await.unwrap();
        open.push(r);
    }
    let home = placed[0].clone();
    assert_eq!(&placed[..3], &[home.clone(), home.clone(), home.clone()]);
    assert_ne!(placed[3], home);
    let spill = client
        .until(|m| match m {
            ServerMessage::Tick(t) => t.spills.first().cloned(),
            _ => None,
        })
        .await;
    assert_eq!(spill.key, "hot-key");
    assert_eq!(
        spill.branch,
        bch_core::policy::Branch::ExplicitRoutingKeySpillover
    );
    assert_eq!(
        (spill.from.as_str(), spill.to.as_str()),
        (home.as_str(), placed[3].as_str())
    );
    assert_eq!(spill.preferred_load, 3);
    assert_eq!(spill.min_load, 0);
    assert_eq!(spill.mean_load, 1.5);
    assert_eq!((spill.min_load_gap, spill.max_load_skew), (2, 1.5));
    drop(open);
    a.release_all();
    b.release_all();
    gateway.shutdown().await;
}

#[tokio::test]
async fn set_policy_is_acked_validated_and_announced_both_ways() {
    let a = fake_worker("a").await;
    let gateway = start(bounded_config(&[&a])).await;
    let mut client = Client::connect(&gateway).await;
    let mut observer = Client::connect(&gateway).await;
    client.frame().await;
    observer.frame().await;
    let policy_url = format!("http://{}/admin/policy", gateway.control_addr);

    client
        .send(serde_json::json!({"type":"set_policy","id":7,"min_load_gap":5,"max_load_skew":2.0}))
        .await;
    let ack = client.next_ack().await;
    assert_eq!(ack.id, Some(bch_core::telemetry::CommandId::Number(7)));
    assert_eq!(
        (ack.policy.min_load_gap, ack.policy.max_load_skew),
        (5, 2.0)
    );
    assert_eq!(http_thresholds(&policy_url).await, (Some(5), Some(2.0)));
    let announced = observer.next_policy().await;
    assert_eq!(announced.changed_by, bch_core::telemetry::ChangeSource::Ws);
    assert_eq!(announced.policy.min_load_gap, 5);

    for bad in [
        serde_json::json!({"type":"set_policy","id":"x","max_load_skew":0.99}),
        serde_json::json!({"type":"set_policy","id":"y","min_load_gap":-1}),
        serde_json::json!({"type":"set_policy","id":"z","gap":1}),
        serde_json::json!({"type":"set_policy","id":"o","spill_order":"next"}),
    ] {
        client.send(bad).await;
        let error = client.next_error().await;
        assert!(
            error.id.is_some(),
            "the error echoes the command id: {error:?}"
        );
    }
    assert_eq!(
        http_thresholds(&policy_url).await,
        (Some(5), Some(2.0)),
        "rejected commands changed nothing"
    );

    // The spill order travels the same way, and is reported to every client.
    client
        .send(serde_json::json!({"type":"set_policy","id":8,"spill_order":"hash_seeded"}))
        .await;
    let ack = client.next_ack().await;
    assert_eq!(
        ack.policy.spill_order,
        bch_core::policy::SpillOrder::HashSeeded
    );
    let announced = observer.next_policy().await;
    assert_eq!(
        announced.policy.spill_order,
        bch_core::policy::SpillOrder::HashSeeded
    );
    let policy: serde_json::Value = bch_drill::tls::get(&policy_url)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(policy["spill_order"], "hash_seeded");

    let put = bch_drill::tls::http_client()
        .build()
        .unwrap()
        .put(&policy_url)
        .json(&serde_json::json!({"min_load_gap": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // The client's own spill-order change is announced to it too, before or after its ack, so it
    // may still be queued: skip it and take the HTTP change's frame.
    let mut announced = client.next_policy().await;
    if announced.changed_by == bch_core::telemetry::ChangeSource::Ws {
        assert_eq!(
            announced.policy.spill_order,
            bch_core::policy::SpillOrder::HashSeeded
        );
        announced = client.next_policy().await;
    }
    assert_eq!(
        announced.changed_by,
        bch_core::telemetry::ChangeSource::Http
    );
    assert_eq!(announced.policy.min_load_gap, 1);
    gateway.shutdown().await;
}

#[tokio::test]
async fn resync_sends_a_fresh_snapshot_and_ring_changes_are_announced() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(bounded_config(&[&a])).await;
    let mut client = Client::connect(&gateway).await;
    client.frame().await;
    client.send(serde_json::json!({"type":"resync"})).await;
    client
        .until(|m| matches!(m, ServerMessage::Snapshot(_)).then_some(()))
        .await;
    let added = bch_drill::tls::http_client()
        .build()
        .unwrap()
        .post(format!("http://{}/admin/workers", gateway.control_addr))
        .json(&serde_json::json!({"name": "b", "url": b.url()}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let ring = client
        .until(|m| match m {
            ServerMessage::Ring(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(ring.workers.len(), 2);
    assert_eq!(ring.ring.workers.len(), 2);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_client_that_never_reads_does_not_slow_routing() {
    let a = fake_worker("a").await;
    let mut config = bounded_config(&[&a]);
    config.telemetry.interval = Duration::from_millis(5);
    config.telemetry.client_queue = 4;
    let gateway = start(config).await;
    // Connect and never read: the socket buffers fill, then the per-client queue.
    let stalled = Client::connect(&gateway).await;
    let mut watcher = Client::connect(&gateway).await;
    watcher.frame().await;
    let http = bch_drill::tls::http_client().build().unwrap();
    let data = gateway.data_addr;
    let mut handles = Vec::new();
    for chunk in 0..8 {
        let http = http.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..250 {
                let r = http
                    .get(format!("http://{data}/echo"))
                    .header("x-smg-routing-key", format!("key-{chunk}-{}", i % 300))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
            }
        }));
    }
    let all = async {
        for h in handles {
            h.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("2,000 requests complete while a client never reads");
    let totals = watcher
        .until(|m| match m {
            ServerMessage::Tick(t) if t.totals.requests_total >= 2_000 => Some(t.totals),
            _ => None,
        })
        .await;
    assert!(totals.requests_total >= 2_000);
    // The gateway kept serving its control plane too.
    let policy = bch_drill::tls::get(format!("http://{}/admin/policy", gateway.control_addr))
        .await
        .unwrap();
    assert_eq!(policy.status(), 200);
    drop(stalled);
    gateway.shutdown().await;
}

#[tokio::test]
async fn upgrade_needs_the_token_when_one_is_configured() {
    let a = fake_worker("a").await;
    let mut config = bounded_config(&[&a]);
    let token_file = std::env::temp_dir().join(format!("bch-ws-token-{}", std::process::id()));
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    config.server.control_access.admin_token_file = Some(token_file.clone());
    let gateway = start(config).await;
    let url = format!("ws://{}/ws", gateway.control_addr);
    let refused = tokio_tungstenite::connect_async(&url).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 401)
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let mut request = url.clone().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    assert!(tokio_tungstenite::connect_async(request).await.is_err());
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", "Bearer s3cret-token".parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let first = socket.next().await.unwrap().unwrap();
    assert!(first.to_text().unwrap().contains("\"type\":\"snapshot\""));
    let _ = std::fs::remove_file(token_file);
    gateway.shutdown().await;
}

#[tokio::test]
async fn implicit_keys_are_shown_only_as_hashes() {
    let a = fake_worker("a").await;
    let gateway = start(bounded_config(&[&a])).await;
    let mut client = Client::connect(&gateway).await;
    client.frame().await;
    let secret = "Bearer sk-live-DO-NOT-LEAK";
    bch_drill::tls::http_client()
        .build()
        .unwrap()
        .get(format!("http://{}/echo", gateway.data_addr))
        .header("authorization", secret)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let key = client
        .until(|m| match m {
            ServerMessage::Tick(t) => t.keys.first().cloned(),
            _ => None,
        })
        .await;
    assert!(key.key.starts_with("implicit:") && key.key.len() == "implicit:".len() + 8);
    client.send(serde_json::json!({"type":"resync"})).await;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), client.socket.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let text = message.to_text().unwrap().to_owned();
        assert!(!text.contains("DO-NOT-LEAK"));
        if text.contains("\"type\":\"snapshot\"") {
            assert!(text.contains(&key.key));
            break;
        }
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn set_policy_changes_admission_with_the_tomls_names() {
    let a = fake_worker("a").await;
    let gateway = start(bounded_config(&[&a])).await;
    let mut client = Client::connect(&gateway).await;
    client.frame().await;
    let policy_url = format!("http://{}/admin/policy", gateway.control_addr);
    client
        .send(serde_json::json!({"type":"set_policy","id":9,
            "admission":{"max_in_flight_per_worker":3,"queue_timeout_ms":250}}))
        .await;
    let ack = client.next_ack().await;
    assert_eq!(ack.policy.admission.max_in_flight_per_worker, 3);
    assert_eq!(ack.policy.admission.queue_timeout_ms, 250);
    let policy: serde_json::Value = bch_drill::tls::get(&policy_url)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(policy["admission"]["max_in_flight_per_worker"], 3);
    assert_eq!(gateway.routing_table().capacity(0), Some(3));
    client
        .send(serde_json::json!({"type":"set_policy","id":"bad","admission":{"max_kv_usage":2.0}}))
        .await;
    let error = client.next_error().await;
    assert!(error.message.contains("max_kv_usage"), "{error:?}");
    assert_eq!(gateway.routing_table().policy().admission.max_kv_usage, 0.0);
    gateway.shutdown().await;
}

/// With more keys than `[telemetry] max_keys`, a new key takes the place (and the recycled state)
/// of the one seen longest ago: its record counts only its own requests in flight, never the
/// evicted key's, and the evicted key's requests ending later change nothing of it.
#[tokio::test]
async fn a_key_that_takes_an_evicted_keys_place_shows_only_its_own_counts() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let mut config = test_config(&[&a, &b]);
    config.telemetry.max_keys = 1;
    let gateway = start(config).await;
    let mut client = Client::connect(&gateway).await;
    client.frame().await;
    let http = bch_drill::tls::http_client().build().unwrap();
    let url = format!("http://{}/hold", gateway.data_addr);
    let hold = |key: &'static str| {
        let request = http.get(&url).header("x-smg-routing-key", key);
        async move {
            let mut held = request.send().await.unwrap();
            let worker = held.headers()["x-bch-worker"].to_str().unwrap().to_owned();
            held.chunk().await.unwrap();
            (held, worker)
        }
    };
    let record_of = |key: &'static str, requests: u64| {
        move |message: &ServerMessage| match message {
            ServerMessage::Tick(tick) => tick
                .keys
                .iter()
                .find(|k| k.key == key && k.requests_total == requests)
                .cloned(),
            _ => None,
        }
    };
    let (first, first_worker) = hold("first-key").await;
    let record = client.until(record_of("first-key", 1)).await;
    assert_eq!(
        record.active.into_iter().collect::<Vec<_>>(),
        [(first_worker.clone(), 1)]
    );

    let (_second, second_worker) = hold("second-key").await;
    let record = client.until(record_of("second-key", 1)).await;
    assert_eq!(
        record.active.into_iter().collect::<Vec<_>>(),
        [(second_worker.clone(), 1)],
        "the evicted key's request on {first_worker} is not the new key's"
    );

    // The evicted key's request ends; then the new key's second request starts.
    drop(first);
    client
        .until(|m| match m {
            ServerMessage::Tick(t) => t
                .workers
                .iter()
                .find(|w| {
                    w.name == first_worker && w.active == u64::from(first_worker == second_worker)
                })
                .map(|_| ()),
            _ => None,
        })
        .await;
    let (_third, third_worker) = hold("second-key").await;
    let record = client.until(record_of("second-key", 2)).await;
    let mut expected = std::collections::BTreeMap::new();
    *expected.entry(second_worker).or_insert(0) += 1;
    *expected.entry(third_worker).or_insert(0) += 1;
    assert_eq!(record.active, expected);
    a.release_all();
    b.release_all();
    gateway.shutdown().await;
}

/// With ticks a minute apart, only the commands drain the data path's events: a client that
/// joins right after a burst of keyed requests, and one that resyncs right after more, sees every
/// request in its snapshot's keys, each key's in-flight counts back to nothing once its requests
/// ended and a held one counted; and a tick's totals match the requests sent.
#[tokio::test]
async fn snapshots_right_after_a_burst_hold_every_request_and_no_stale_in_flight_counts() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let mut config = test_config(&[&a, &b]);
    config.telemetry.interval = Duration::from_secs(60);
    let gateway = start(config).await;
    let http = bch_drill::tls::http_client().build().unwrap();
    let burst = |gateway: &gatewayd::RunningGateway, prefix: &'static str, count: usize| {
        let url = format!("http://{}/echo", gateway.data_addr);
        let requests = (0..count).map(|i| {
            let request = http
                .get(&url)
                .header("x-smg-routing-key", format!("{prefix}-{i}"));
            async move {
                let response = request.send().await.unwrap();
                assert_eq!(response.status(), 200);
                response.bytes().await.unwrap();
            }
        });
        futures_util::future::join_all(requests)
    };
    let snapshot_keys = |message: &ServerMessage| match message {
        ServerMessage::Snapshot(snapshot) => Some(snapshot.keys.clone()),
        _ => None,
    };

    burst(&gateway, "first", 100).await;
    let mut client = Client::connect(&gateway).await;
    let keys = client.until(snapshot_keys).await;
    assert_eq!(keys.len(), 100);
    assert!(
        keys.iter()
            .all(|k| k.requests_total == 1 && k.active.is_empty()),
        "{keys:?}"
    );

    let mut held = http
        .get(format!("http://{}/hold", gateway.data_addr))
        .header("x-smg-routing-key", "held")
        .send()
        .await
        .unwrap();
    held.chunk().await.unwrap();
    let held_worker = held.headers()["x-bch-worker"].to_str().unwrap().to_owned();
    burst(&gateway, "second", 100).await;
    client.send(serde_json::json!({"type":"resync"})).await;
    let keys = client.until(snapshot_keys).await;
    assert_eq!(keys.len(), 201);
    let (held_keys, done): (Vec<_>, Vec<_>) = keys.into_iter().partition(|k| k.key == "held");
    assert!(done.iter().all(|k| k.active.is_empty()), "{done:?}");
    assert_eq!(
        held_keys[0].active.clone().into_iter().collect::<Vec<_>>(),
        [(held_worker, 1)]
    );
    drop(held);
    a.release_all();
    b.release_all();
    assert_eq!(
        wait_all_idle(&gateway)
            .await
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>(),
        0
    );
    client.send(serde_json::json!({"type":"resync"})).await;
    let keys = client.until(snapshot_keys).await;
    assert!(keys.iter().all(|k| k.active.is_empty()), "{keys:?}");
    gateway.shutdown().await;

    // Ticks every 50 ms: one reports all the requests routed, none lost.
    let gateway = start(test_config(&[&a, &b])).await;
    let mut client = Client::connect(&gateway).await;
    client.frame().await;
    burst(&gateway, "third", 300).await;
    client
        .until(|m| match m {
            ServerMessage::Tick(t) => (t.totals.requests_total == 300).then_some(()),
            _ => None,
        })
        .await;
    drop(client);
    gateway.shutdown().await;
}
