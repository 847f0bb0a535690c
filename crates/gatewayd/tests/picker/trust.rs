//! What the picker takes on a peer's word: anything that reaches the picker port speaks ext_proc,
//! so a report of a served fallback only asks the gateway's own prober to look, and a routing
//! key is held to the same grammar as on the data plane.

use crate::common;
use crate::sessions::{name_at, picker_gateway, total_active, wait_released};

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::envoy::*;
use common::*;
use gatewayd::RunningGateway;

/// Waits (bounded) until `condition` holds on the gateway.
async fn eventually(
    gateway: &RunningGateway,
    what: &str,
    condition: impl Fn(&RunningGateway) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !condition(gateway) {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Opens a stream for `key`, then reports Envoy served its first listed fallback; the stream
/// stays open. Returns the stream and the chosen worker's name.
async fn claim_fallback(gateway: &RunningGateway, key: &str) -> (FakeEnvoy, String) {
    let mut envoy = FakeEnvoy::open(gateway.picker_addr.unwrap()).await;
    let (list, _) = picked(
        &envoy
            .exchange(request_headers(&[("x-smg-routing-key", key)]))
            .await,
    );
    let endpoints: Vec<&str> = list.split(',').collect();
    assert!(
        endpoints.len() > 1,
        "fallbacks listed (the other workers are still routable): {list}"
    );
    let chosen = name_at(gateway, endpoints[0]);
    envoy
        .exchange(response_headers(Some(endpoints[1]), false))
        .await;
    (envoy, chosen)
}

#[tokio::test]
async fn a_peer_claiming_fallbacks_for_every_worker_takes_none_out_of_rotation() {
    let workers = [
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    ];
    let gateway = picker_gateway(&workers.iter().collect::<Vec<_>>(), |config| {
        // Only the start-up round and the probes the reports ask for run during the test.
        config.health.interval = Duration::from_secs(60);
    })
    .await;
    let mut blamed = std::collections::BTreeSet::new();
    for i in 0..24 {
        let (mut envoy, chosen) = claim_fallback(&gateway, &format!("hostile-{i}")).await;
        blamed.insert(chosen);
        envoy.close();
    }
    assert_eq!(blamed.len(), 3, "every worker was blamed at least once");
    wait_released(&gateway).await;
    // The reports asked the prober to look: every blamed worker is probed again (it answers).
    for worker in &workers {
        let state = &worker.state;
        eventually(&gateway, "a probe of each blamed worker", |_| {
            state.health_probes.load(Ordering::SeqCst) >= 2
        })
        .await;
    }
    let table = gateway.routing_table();
    assert_eq!(
        table.healthy_flags(),
        [true, true, true],
        "a peer's word alone marks no worker unhealthy"
    );
    for worker in table.workers() {
        assert_eq!(worker.stats.errors_total(), 0, "{}", worker.spec.name);
    }
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains("bch_picker_fallback_reports_total 24"),
        "{metrics}"
    );
    assert!(metrics.contains("bch_retries_total 0"), "{metrics}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_reported_worker_that_is_really_dead_is_marked_unhealthy_by_the_probe() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let gateway = picker_gateway(&[&a, &b, &c], |config| {
        // No full round and no threshold reached on their own: only the asked-for probe can.
        config.health.interval = Duration::from_secs(60);
        config.health.unhealthy_threshold = 5;
    })
    .await;
    let key = "dead-on-arrival";
    let dead = preferred_worker(&gateway, key).await;
    let victim = [a, b, c]
        .into_iter()
        .find(|w| w.state.name == dead)
        .unwrap();
    // It dies after the start-up round probed it alive.
    let state = std::sync::Arc::clone(&victim.state);
    eventually(&gateway, "the start-up probe", |_| {
        state.health_probes.load(Ordering::SeqCst) >= 1
    })
    .await;
    victim.stop().await;
    let (mut envoy, chosen) = claim_fallback(&gateway, key).await;
    assert_eq!(chosen, dead);
    let index = gateway.routing_table().index_of(&dead).unwrap();
    eventually(&gateway, "the dead worker marked unhealthy", |gateway| {
        !gateway.routing_table().healthy_flags()[index]
    })
    .await;
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains(&format!(
            "bch_probe_failures_total{{worker=\"{dead}\",reason=\"refused\"}} 1"
        )),
        "the gateway's own probe decided: {metrics}"
    );
    assert_eq!(
        gateway.routing_table().workers()[index]
            .stats
            .errors_total(),
        0,
        "the report itself counts no error against the worker"
    );
    envoy.close();
    wait_released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_routing_key_no_http_client_could_send_is_ignored_and_counted_as_on_the_data_plane() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = picker_gateway(&[&a, &b], |_| {}).await;
    let picker = gateway.picker_addr.unwrap();
    for (key, reason) in [
        ("line\r\nbreak", "control_character"),
        ("nul\u{0}byte", "control_character"),
        ("tab\tinside", "control_character"),
        (" padded", "surrounding_space"),
    ] {
        let mut envoy = FakeEnvoy::open(picker).await;
        envoy
            .exchange(request_headers(&[
                ("x-smg-routing-key", key),
                ("cookie", "session=1"),
            ]))
            .await;
        let answer = envoy.exchange(response_headers(None, true)).await;
        assert_eq!(
            set_headers(&answer)[1],
            (
                "x-bch-branch".to_owned(),
                "implicit_routing_key_hit".to_owned()
            ),
            "{key:?} is ignored as if absent: the cookie routes"
        );
        let metrics = gateway.metrics_text();
        assert!(
            metrics.contains(&format!(
                "bch_ignored_routing_keys_total{{reason=\"{reason}\"}}"
            )),
            "{key:?} counted as {reason}: {metrics}"
        );
    }
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains("bch_ignored_routing_keys_total{reason=\"control_character\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("bch_ignored_routing_keys_total{reason=\"surrounding_space\"} 1"),
        "{metrics}"
    );
    assert_eq!(total_active(&gateway), 0);
    gateway.shutdown().await;
}
