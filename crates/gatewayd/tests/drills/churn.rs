//! Membership churn under load: workers added and removed through the admin API during a storm.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::common::*;
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, RoutingKey};
use gatewayd::config::Config;
use tokio_util::sync::CancellationToken;

use super::*;

/// A membership change through the admin API and when it was issued and answered.
struct Change {
    issued: Instant,
    returned: Instant,
    op: String,
    removed: Option<String>,
    added: Option<String>,
    members: Vec<(String, String)>,
}

/// Where each key lands with `members` (strict policy, all healthy), by a fresh core router.
fn placements(members: &[(String, String)], keys: &[String]) -> HashMap<String, String> {
    let specs = members
        .iter()
        .map(|(name, url)| WorkerSpec {
            name: name.clone(),
            url: url.clone(),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        })
        .collect();
    let router = Router::new(specs, Config::default().policy_settings()).unwrap();
    let table = router.table();
    keys.iter()
        .map(|key| {
            let decision = table.explain(&RoutingKey::Explicit(
                ExplicitKey::parse(key.as_bytes()).unwrap(),
            ));
            let worker = decision.worker.expect("a worker");
            (key.clone(), table.workers()[worker].spec.name.clone())
        })
        .collect()
}

struct Observed {
    key: String,
    sent: Instant,
    received: Instant,
    status: u16,
    worker: String,
    served_by: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_churn_under_load() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let rounds = scaled(3, 20);
    let mut fakes = Vec::new();
    for i in 0..5 {
        fakes.push(fake_worker(&format!("w{i}")).await);
    }
    let all: Vec<(String, String)> = fakes
        .iter()
        .map(|f| (f.state.name.clone(), f.url()))
        .collect();
    let mut config = config_for(&all[..4]);
    // Health is not under test here: keep probes out of the way so placement is the ring's alone.
    config.health.interval = Duration::from_millis(3_600_000);
    let gateway = Arc::new(start(config).await);
    let keys: Vec<String> = (0..120).map(|i| format!("churn-key-{i}")).collect();

    let done = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let observed = Arc::new(Mutex::new(Vec::<Observed>::new()));
    let mut clients = Vec::new();
    for c in 0..16usize {
        let (gateway, done, stop, observed, keys) = (
            Arc::clone(&gateway),
            Arc::clone(&done),
            stop.clone(),
            Arc::clone(&observed),
            keys.clone(),
        );
        clients.push(tokio::spawn(async move {
            let client = bch_drill::tls::http_client().build().unwrap();
            let url = format!("http://{}/v1/churn", gateway.data_addr);
            let mut n = c as u64;
            while !stop.is_cancelled() {
                n += 16;
                let key = &keys[(mix(n) % keys.len() as u64) as usize];
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header(ROUTING_KEY, key)
                    .body("{}")
                    .send()
                    .await
                    .expect("gateway answers");
                let received = Instant::now();
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default()
                };
                let record = Observed {
                    key: key.clone(),
                    sent,
                    received,
                    status: response.status().as_u16(),
                    worker: header("x-bch-worker"),
                    served_by: header("x-worker-name"),
                };
                let _ = response.bytes().await;
                observed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(record);
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }

    let http = client();
    let control = format!("http://{}", gateway.control_addr);
    let mut members: Vec<(String, String)> = all[..4].to_vec();
    let mut changes: Vec<Change> = Vec::new();
    let script = ["-w2", "+w4", "+w2", "-w0", "-w4", "+w0"];
    let never = CancellationToken::new();
    for _ in 0..rounds {
        for step in script {
            let next = done.load(Ordering::SeqCst) + 150;
            progress(&done, next, &never).await;
            let name = &step[1..];
            let issued = Instant::now();
            let (removed, added) = if step.starts_with('-') {
                let response = http
                    .delete(format!("{control}/admin/workers/{name}"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200, "{step}");
                members.retain(|(n, _)| n != name);
                (Some(name.to_owned()), None)
            } else {
                let url = all.iter().find(|(n, _)| n == name).unwrap().1.clone();
                let response = http
                    .post(format!("{control}/admin/workers"))
                    .json(&serde_json::json!({"name": name, "url": url}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 201, "{step}");
                members.push((name.to_owned(), url));
                (None, Some(name.to_owned()))
            };
            changes.push(Change {
                issued,
                returned: Instant::now(),
                op: step.to_owned(),
                removed,
                added,
                members: members.clone(),
            });
        }
    }
    let next = done.load(Ordering::SeqCst) + 150;
    progress(&done, next, &never).await;
    stop.cancel();
    for c in clients {
        c.await.unwrap();
    }

    // The model: placements for the initial membership and after each change.
    let mut states = vec![placements(&all[..4], &keys)];
    for change in &changes {
        states.push(placements(&change.members, &keys));
    }
    // Keys move only as the ring says: between two memberships, only keys owned by the worker that
    // left (or taken by the one that joined) change hands.
    let mut moved_per_change = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        let (before, after) = (&states[i], &states[i + 1]);
        let moved: Vec<&String> = keys.iter().filter(|k| before[*k] != after[*k]).collect();
        for key in &moved {
            let involved = change.removed.as_deref() == Some(before[*key].as_str())
                || change.added.as_deref() == Some(after[*key].as_str());
            assert!(
                involved,
                "{}: {key} moved {} -> {}",
                change.op, before[*key], after[*key]
            );
        }
        moved_per_change.push(moved.len());
    }
    let observed = std::mem::take(&mut *observed.lock().unwrap_or_else(PoisonError::into_inner));
    let mut after_removal_checked = 0;
    let mut ambiguous = 0;
    for r in &observed {
        assert_eq!(r.status, 200, "{}", r.key);
        assert_eq!(r.worker, r.served_by, "the named worker served it");
        // Membership i (0 = initial) may be in force from when change i was issued until change
        // i + 1 returned.
        let allowed: Vec<usize> = (0..=changes.len())
            .filter(|&i| {
                let from_ok = i == 0 || changes[i - 1].issued <= r.received;
                let until_ok = i == changes.len() || changes[i].returned >= r.sent;
                from_ok && until_ok
            })
            .collect();
        if allowed.len() > 1 {
            ambiguous += 1;
        }
        assert!(
            allowed.iter().any(|&i| states[i][&r.key] == r.worker),
            "{} went to {} but the ring says {:?}",
            r.key,
            r.worker,
            allowed
                .iter()
                .map(|&i| &states[i][&r.key])
                .collect::<Vec<_>>()
        );
        // No request is routed to a removed worker after the removal returned (until it is re-added).
        for (i, change) in changes.iter().enumerate() {
            let Some(removed) = &change.removed else {
                continue;
            };
            let readded = changes[i + 1..]
                .iter()
                .find(|c| c.added.as_ref() == Some(removed))
                .map(|c| c.issued);
            if r.sent > change.returned && readded.is_none_or(|t| r.received < t) {
                after_removal_checked += 1;
                assert_ne!(&r.worker, removed, "routed to {removed} after its removal");
            }
        }
    }
    let counters = assert_all_idle(&gateway).await;
    eprintln!(
        "DRILL membership_churn: requests={} changes={} keys={} moved_keys_per_change={moved_per_change:?} \
         checked_after_removal={after_removal_checked} in_change_window={ambiguous} final_members={:?} final_active={counters:?}",
        observed.len(),
        changes.len(),
        keys.len(),
        members.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
    );
    assert!(after_removal_checked > 0);
    gateway_is_healthy(&gateway).await;
    assert_no_panic(log_from);
    Arc::into_inner(gateway).unwrap().shutdown().await;
}
