//! Concurrent threshold changes: HTTP and websocket threshold writes during a storm.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::*;
use bch_core::policy::{Branch, PolicyKind, PolicySettings};
use bch_core::telemetry::{PolicyRecord, ServerMessage, SpillEvent};
use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::*;

/// The (gap, skew) pairs the writers alternate between. Every gap is distinct, so a decision that
/// mixed two writes (say gap 1 with skew 2.0) shows as a pair not in this list.
const PAIRS: [(u64, f64); 5] = [(0, 1.0), (1, 1.25), (2, 1.5), (3, 2.0), (5, 1.1)];

fn known_pair(gap: u64, skew: f64) -> bool {
    PAIRS.contains(&(gap, skew))
}

fn pair_of(policy: &PolicySettings) -> (u64, f64) {
    (policy.min_load_gap, policy.max_load_skew)
}

/// [`pair_of`] for the policy as a telemetry frame carries it.
fn record_pair(policy: &PolicyRecord) -> (u64, f64) {
    (policy.min_load_gap, policy.max_load_skew)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_threshold_changes() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let writes = scaled(60, 600);
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let mut config = test_config(&[&a, &b, &c]);
    config.policy.kind = PolicyKind::BoundedConsistentHashing;
    config.policy.min_load_gap = 2;
    config.policy.max_load_skew = 1.5;
    let gateway = Arc::new(start(config).await);
    let final_pair = (8, 1.05);

    // Observer: every spill event and policy update until the final write is announced.
    let mut observer_ws = ws_connect(&gateway).await;
    let observer = tokio::spawn(async move {
        let mut spills: Vec<SpillEvent> = Vec::new();
        let mut updates: Vec<(u64, f64)> = Vec::new();
        while let Some(message) = next_message(&mut observer_ws).await {
            match message {
                ServerMessage::Snapshot(s) => spills.extend(s.spills),
                ServerMessage::Tick(t) => spills.extend(t.spills),
                ServerMessage::Policy(p) => {
                    updates.push(record_pair(&p.policy));
                    if record_pair(&p.policy) == final_pair {
                        break;
                    }
                }
                _ => {}
            }
        }
        (spills, updates)
    });

    // Storm keys: two that share a preferred worker and one elsewhere, so that worker carries
    // twice the mean and the bound fires under every pair with skew < 2 (worker ports, hence ring
    // placement, differ from run to run; three arbitrary keys may land on three workers).
    let hot_keys: Arc<Vec<String>> = {
        let mut by_worker: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in 0..500 {
            let key = format!("hot-{i}");
            let worker = preferred_worker(&gateway, &key).await;
            by_worker.entry(worker).or_default().push(key);
            if by_worker.len() >= 2 && by_worker.values().any(|keys| keys.len() >= 2) {
                break;
            }
        }
        let pair = by_worker.values().find(|keys| keys.len() >= 2).unwrap();
        let other = by_worker
            .values()
            .find(|keys| !keys.contains(&pair[0]))
            .unwrap();
        Arc::new(vec![pair[0].clone(), pair[1].clone(), other[0].clone()])
    };

    // Storm: hot keys with short streams, so loads pile up and the bound spills.
    let stop = CancellationToken::new();
    let requests = Arc::new(AtomicUsize::new(0));
    let mut storm = Vec::new();
    for i in 0..24u64 {
        let (gateway, stop, requests) = (Arc::clone(&gateway), stop.clone(), Arc::clone(&requests));
        let hot_keys = Arc::clone(&hot_keys);
        storm.push(tokio::spawn(async move {
            let client = bch_drill::tls::http_client().build().unwrap();
            let url = format!("http://{}/sse?n=3&gap_ms=3", gateway.data_addr);
            while !stop.is_cancelled() {
                let response = client
                    .get(&url)
                    .header(ROUTING_KEY, hot_keys[i as usize % 3].as_str())
                    .send()
                    .await
                    .expect("gateway answers");
                assert_eq!(response.status(), 200);
                let body = response.bytes().await.expect("whole stream");
                assert!(body.ends_with(b"data: [DONE]\n\n"));
                requests.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }

    // Explain sampler: the bound it reports uses the same pair as the policy it reports.
    let sampler = {
        let (gateway, stop) = (Arc::clone(&gateway), stop.clone());
        tokio::spawn(async move {
            let http = client();
            let mut samples = 0;
            while !stop.is_cancelled() {
                let v: serde_json::Value = http
                    .get(format!(
                        "http://{}/admin/explain?routing_key=hot-0",
                        gateway.control_addr
                    ))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let gap = v["bound"]["min_load_gap"].as_u64().unwrap();
                let skew = v["bound"]["max_load_skew"].as_f64().unwrap();
                assert!(known_pair(gap, skew), "explain mixed a pair: {v}");
                assert_eq!(v["policy"]["min_load_gap"].as_u64(), Some(gap));
                assert_eq!(v["policy"]["max_load_skew"].as_f64(), Some(skew));
                samples += 1;
            }
            samples
        })
    };

    // Writers: HTTP and websocket, concurrently, each alternating through the pairs.
    let http_writer = {
        let gateway = Arc::clone(&gateway);
        tokio::spawn(async move {
            let http = client();
            let mut last = None;
            for i in 0..writes {
                let (gap, skew) = PAIRS[i % PAIRS.len()];
                let v: serde_json::Value = http
                    .put(format!("http://{}/admin/policy", gateway.control_addr))
                    .json(&serde_json::json!({"min_load_gap": gap, "max_load_skew": skew}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                assert_eq!(v["min_load_gap"].as_u64(), Some(gap), "{v}");
                assert_eq!(v["max_load_skew"].as_f64(), Some(skew), "{v}");
                last = Some((gap, skew));
            }
            last.unwrap()
        })
    };
    let ws_writer = {
        let mut ws = ws_connect(&gateway).await;
        tokio::spawn(async move {
            let mut last = None;
            for i in 0..writes {
                let (gap, skew) = PAIRS[(i + 2) % PAIRS.len()];
                let id = format!("w{i}");
                let command = serde_json::json!({"type": "set_policy", "id": id, "min_load_gap": gap, "max_load_skew": skew});
                ws.send(Message::Text(command.to_string().into()))
                    .await
                    .unwrap();
                loop {
                    match next_message(&mut ws).await.expect("socket open") {
                        ServerMessage::Ack(ack)
                            if serde_json::to_value(&ack.id).unwrap() == serde_json::json!(id) =>
                        {
                            assert_eq!(record_pair(&ack.policy), (gap, skew));
                            break;
                        }
                        ServerMessage::Error(e) => panic!("command refused: {}", e.message),
                        _ => {}
                    }
                }
                last = Some((gap, skew));
            }
            (last.unwrap(), ws)
        })
    };
    let last_http = http_writer.await.unwrap();
    let (last_ws, mut ws) = ws_writer.await.unwrap();
    stop.cancel();
    for task in storm {
        task.await.unwrap();
    }
    let samples = sampler.await.unwrap();

    // After concurrent writers, the policy is the last write of one of them.
    let policy: PolicySettings = client()
        .get(format!("http://{}/admin/policy", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        pair_of(&policy) == last_http || pair_of(&policy) == last_ws,
        "{policy:?} is neither {last_http:?} nor {last_ws:?}"
    );
    // Sequential writes through both paths: the last one written is the one in force.
    let put = |gap: u64, skew: f64| {
        let url = format!("http://{}/admin/policy", gateway.control_addr);
        async move {
            let response = client()
                .put(url)
                .json(&serde_json::json!({"min_load_gap": gap, "max_load_skew": skew}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    };
    put(7, 2.5).await;
    ws.send(Message::Text(
        r#"{"type":"set_policy","id":"final","min_load_gap":6,"max_load_skew":1.3}"#.into(),
    ))
    .await
    .unwrap();
    loop {
        if let ServerMessage::Ack(ack) = next_message(&mut ws).await.unwrap() {
            assert_eq!(record_pair(&ack.policy), (6, 1.3));
            break;
        }
    }
    let now: PolicySettings = client()
        .get(format!("http://{}/admin/policy", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(pair_of(&now), (6, 1.3));
    put(final_pair.0, final_pair.1).await;
    let (spills, updates) = observer.await.unwrap();
    assert_eq!(updates.last(), Some(&final_pair));
    assert_eq!(pair_of(gateway.routing_table().policy()), final_pair);

    let mut by_pair: BTreeMap<String, usize> = BTreeMap::new();
    for event in &spills {
        assert!(
            known_pair(event.min_load_gap, event.max_load_skew),
            "decision with a mixed pair: {event:?}"
        );
        // The numbers behind the decision satisfy the rule with that very pair.
        assert!(
            event.preferred_load.saturating_sub(event.min_load) > event.min_load_gap
                && event.preferred_load as f64 > event.mean_load * event.max_load_skew,
            "{event:?}"
        );
        assert!(matches!(
            event.branch.get(),
            Some(
                Branch::ExplicitRoutingKeySpillover | Branch::ExplicitRoutingKeyNoEligibleCandidate
            )
        ));
        *by_pair
            .entry(format!("{}/{}", event.min_load_gap, event.max_load_skew))
            .or_default() += 1;
    }
    let distinct: HashSet<(u64, u64)> = spills
        .iter()
        .map(|e| (e.min_load_gap, e.max_load_skew.to_bits()))
        .collect();
    let counters = assert_all_idle(&gateway).await;
    eprintln!(
        "DRILL thresholds: requests={} writes_http={writes} writes_ws={writes} explain_samples={samples} \
         spill_events={} by_pair={by_pair:?} policy_updates_seen={} final={final_pair:?} final_active={counters:?}",
        requests.load(Ordering::SeqCst),
        spills.len(),
        updates.len(),
    );
    assert!(!spills.is_empty(), "the storm produced spills");
    assert!(
        distinct.len() >= 2,
        "spills under at least two pairs: {by_pair:?}"
    );
    gateway_is_healthy(&gateway).await;
    assert_no_panic(log_from);
    Arc::into_inner(gateway).unwrap().shutdown().await;
}
