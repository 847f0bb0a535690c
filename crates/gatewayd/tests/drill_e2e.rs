//! bch-drill through a real gatewayd: the 6:2 burst on simulated workers, storm accounting against
//! the gateway's own metrics, and a small A/B run producing every cell.

mod common;

use std::time::Duration;

use bch_core::policy::PolicyKind;
use bch_drill::ab::{AbConfig, parse_cells, run_ab};
use bch_drill::sim::SimConfig;
use bch_drill::storm::{PrefixScope, StormConfig, run_storm};
use bch_drill::worker::{Fault, WorkerHandle, spawn_workers};
use gatewayd::config::{Config, WorkerConfig};
use tokio_util::sync::CancellationToken;

async fn sim_workers(count: usize, time_scale: f64) -> Vec<WorkerHandle> {
    spawn_workers(count, 0, SimConfig::default().with_time_scale(time_scale))
        .await
        .unwrap()
}

fn config_for(workers: &[WorkerHandle], kind: PolicyKind, gap: u64) -> Config {
    let mut config = common::test_config(&[]);
    config.policy.kind = kind;
    config.policy.min_load_gap = gap;
    config.policy.max_load_skew = 1.5;
    config.workers = workers
        .iter()
        .map(|w| WorkerConfig {
            name: Some(w.name().to_owned()),
            url: w.url(),
            ring_id: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            server_name: None,
            models: Vec::new(),
        })
        .collect();
    config
}

/// Polls the gateway's in-process counters until `total` requests are in flight.
async fn wait_in_flight(gateway: &gatewayd::RunningGateway, total: u64) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let table = gateway.routing_table();
            let sum: u64 = table.workers().iter().map(|w| w.stats.active()).sum();
            if sum >= total {
                return;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("requests in flight");
}

#[tokio::test]
async fn eight_held_same_key_requests_land_six_to_two_bounded_and_eight_to_zero_strict() {
    for (kind, gap, expect) in [
        (PolicyKind::BoundedConsistentHashing, 1, (6, 2)),
        (PolicyKind::BoundedConsistentHashing, 2, (6, 2)),
        (PolicyKind::BoundedConsistentHashing, 4, (6, 2)),
        (PolicyKind::ConsistentHashing, 2, (8, 0)),
    ] {
        let workers = sim_workers(2, 0.0).await;
        // Held in flight: the simulated engines accept but send nothing until the fault clears.
        for w in &workers {
            w.set_fault(Fault::StallFirstByte);
        }
        let gateway = common::start(config_for(&workers, kind, gap)).await;
        let url = format!("http://{}/v1/chat/completions", gateway.data_addr);
        let mut requests = Vec::new();
        for i in 0..8u64 {
            let url = url.clone();
            requests.push(tokio::spawn(async move {
                bch_drill::tls::http_client().build().unwrap()
                    .post(url)
                    .header("x-smg-routing-key", "session-a")
                    .json(&serde_json::json!({"messages":[{"role":"user","content":"hello"}],"max_tokens":4}))
                    .send()
                    .await
                    .unwrap()
            }));
            // One at a time, so each request sees the load of the ones before it.
            wait_in_flight(&gateway, i + 1).await;
        }
        let mut loads: Vec<u64> = gateway
            .routing_table()
            .workers()
            .iter()
            .map(|w| w.stats.active())
            .collect();
        loads.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!((loads[0], loads[1]), expect, "{kind:?} gap {gap}");
        for w in &workers {
            w.set_fault(Fault::None);
        }
        for r in requests {
            let response = r.await.unwrap();
            assert_eq!(response.status(), 200);
            response.bytes().await.unwrap();
        }
        assert!(
            common::wait_all_idle(&gateway)
                .await
                .iter()
                .all(|(_, n)| *n == 0)
        );
        gateway.shutdown().await;
    }
}

/// Where the fourth held request of `key` goes once three of its requests hold its preferred worker
/// (loads `[3,0,0,0,0]`, gap 2, skew 1.5: the fourth spills), by the gateway's own counters.
async fn fourth_request_target(
    gateway: &gatewayd::RunningGateway,
    key: &str,
) -> (usize, Vec<tokio::task::JoinHandle<reqwest::Response>>) {
    let url = format!("http://{}/v1/chat/completions", gateway.data_addr);
    let mut requests = Vec::new();
    let before: Vec<u64> = gateway
        .routing_table()
        .workers()
        .iter()
        .map(|w| w.stats.requests_total())
        .collect();
    for i in 0..4u64 {
        let (url, key) = (url.clone(), key.to_owned());
        requests.push(tokio::spawn(async move {
            bch_drill::tls::http_client().build().unwrap()
                .post(url)
                .header("x-smg-routing-key", key)
                .json(&serde_json::json!({"messages":[{"role":"user","content":"hi"}],"max_tokens":1}))
                .send()
                .await
                .unwrap()
        }));
        wait_in_flight(gateway, i + 1).await;
    }
    let table = gateway.routing_table();
    let served: Vec<u64> = table
        .workers()
        .iter()
        .zip(&before)
        .map(|(w, b)| w.stats.requests_total() - b)
        .collect();
    let target = served
        .iter()
        .position(|&n| n == 1)
        .expect("one spilled request");
    assert_eq!(served.iter().sum::<u64>(), 4, "{served:?}");
    (target, requests)
}

#[tokio::test]
async fn the_spill_order_picks_the_ring_successor_or_the_hash_seeded_first() {
    let workers = sim_workers(5, 0.0).await;
    for w in &workers {
        w.set_fault(Fault::StallFirstByte);
    }
    let urls: Vec<String> = workers.iter().map(WorkerHandle::url).collect();
    let ring = bch_core::ring::Ring::build(&urls, 150);
    // A key whose two orders disagree, so the test tells them apart.
    let (key, ring_next, seeded_first) = (0..100)
        .find_map(|i| {
            let key = format!("hot-{i}");
            let position = bch_core::routing_key::ExplicitKey::parse(key.as_bytes())
                .unwrap()
                .position();
            let walk = ring.workers_from(position);
            let seeded = ring.seeded_order(position);
            let first = *seeded.iter().find(|&&w| w != walk[0]).unwrap();
            (first != walk[1]).then_some((key, walk[1], first))
        })
        .unwrap();
    let gateway = common::start(config_for(
        &workers,
        PolicyKind::BoundedConsistentHashing,
        2,
    ))
    .await;
    let policy_url = format!("http://{}/admin/policy", gateway.control_addr);
    for (order, expected) in [("ring", ring_next), ("hash_seeded", seeded_first)] {
        let answer: serde_json::Value = bch_drill::tls::http_client()
            .build()
            .unwrap()
            .put(&policy_url)
            .json(&serde_json::json!({"spill_order": order}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["spill_order"], order);
        let (target, requests) = fourth_request_target(&gateway, &key).await;
        assert_eq!(target, expected, "{order}: {key}");
        for w in &workers {
            w.set_fault(Fault::None);
        }
        for r in requests {
            let response = r.await.unwrap();
            assert_eq!(response.status(), 200);
            response.bytes().await.unwrap();
        }
        common::wait_all_idle(&gateway).await;
        for w in &workers {
            w.set_fault(Fault::StallFirstByte);
        }
    }
    gateway.shutdown().await;
}

fn metric(text: &str, line_prefix: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn storm_accounting_matches_the_gateways_metrics() {
    let workers = sim_workers(4, 0.002).await;
    let gateway = common::start(config_for(
        &workers,
        PolicyKind::BoundedConsistentHashing,
        2,
    ))
    .await;
    let control: reqwest::Url = format!("http://{}", gateway.control_addr).parse().unwrap();
    let config = StormConfig {
        gateway: format!("http://{}", gateway.data_addr).parse().unwrap(),
        groups: 24,
        siblings: 8,
        keys: 4,
        concurrency: 4,
        prefix_tokens: 256,
        max_tokens: 8,
        control: Some(control.clone()),
        progress: false,
        ..StormConfig::default()
    };
    let report = run_storm(&config).await.unwrap();
    assert_eq!(report.requests, 24 * 8);
    assert_eq!(report.ok, report.requests, "{:?}", report.error_samples);
    let drain = report.drain.as_ref().expect("drain checked");
    assert!(drain.all_zero, "{drain:?}");

    let metrics = bch_drill::tls::get(format!("{control}metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (worker, count) in &report.per_worker {
        let served = metric(
            &metrics,
            &format!("bch_worker_requests_total{{worker=\"{worker}\"}}"),
        );
        assert_eq!(
            served, *count,
            "placement of {worker} per the storm and per the gateway"
        );
    }
    let spills = metric(
        &metrics,
        "bch_branch_total{branch=\"explicit_routing_key_spillover\"}",
    );
    let hits = metric(
        &metrics,
        "bch_branch_total{branch=\"explicit_routing_key_hit\"}",
    );
    assert_eq!(spills + hits, report.requests);
    let gateway_fraction = spills as f64 / report.requests as f64;
    assert!((report.spill_fraction - gateway_fraction).abs() < 1e-9);
    assert!(
        spills > 0,
        "8 concurrent siblings on 4 workers must spill under the bounded rule"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn ab_produces_every_cell_through_a_real_gateway() {
    let workers = sim_workers(2, 0.002).await;
    let gateway = common::start(config_for(&workers, PolicyKind::ConsistentHashing, 2)).await;
    let config = AbConfig {
        storm: StormConfig {
            gateway: format!("http://{}", gateway.data_addr).parse().unwrap(),
            groups: 6,
            siblings: 4,
            keys: 2,
            concurrency: 2,
            prefix_tokens: 128,
            max_tokens: 4,
            progress: false,
            ..StormConfig::default()
        },
        seed_given: true,
        control: format!("http://{}", gateway.control_addr).parse().unwrap(),
        replica_controls: Vec::new(),
        control_token: None,
        cells: parse_cells("strict,gap=1,gap=2").unwrap(),
        reps: 2,
    };
    let before: serde_json::Value =
        bch_drill::tls::get(format!("http://{}/admin/policy", gateway.control_addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let mut runs = Vec::new();
    let report = run_ab(&config, &CancellationToken::new(), |run| {
        runs.push(run.cell.clone())
    })
    .await
    .unwrap();
    assert_eq!(runs.len(), 6);
    assert_eq!(report.cells.len(), 3);
    assert!(
        report
            .cells
            .iter()
            .all(|c| c.runs == 2 && c.throughput_rps > 0.0)
    );
    assert!(!report.verdict.is_empty());
    // The gateway runs the policy it had before, not the last cell's.
    let after: serde_json::Value =
        bch_drill::tls::get(format!("http://{}/admin/policy", gateway.control_addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(after, before);
    assert_eq!(after["kind"], "consistent_hashing");
    assert!(report.meta.policy_restored);
    assert_eq!(report.meta.policy_before, before);
    assert_eq!(report.meta.workers.len(), 2);
    assert!(report.meta.workers.iter().all(|w| w.sim.is_some()));
    gateway.shutdown().await;
}

/// The original bounded-policy A/B's shape on a short run (docs/drill.md, "The original A/B on the
/// simulator"): two workers, one group of 8 siblings at a time, each group with a fresh prefix.
/// Strict keeps every group 8:0; every bounded cell splits every group 6:2 (spill exactly 25%) and
/// has a lower cached-token fraction than strict in every repetition and a lower mean TTFT over the
/// repetitions; the gaps place identically. Real time (scale 1): on a busy machine the timers of a
/// scaled-down simulation are late by more than the 20% TTFT difference being checked.
#[tokio::test]
async fn the_original_ab_shape_reproduces_on_the_simulator() {
    let workers = sim_workers(2, 1.0).await;
    let gateway = common::start(config_for(&workers, PolicyKind::ConsistentHashing, 2)).await;
    let config = AbConfig {
        storm: StormConfig {
            gateway: format!("http://{}", gateway.data_addr).parse().unwrap(),
            groups: 3,
            siblings: 8,
            keys: 8,
            concurrency: 1,
            prefix_tokens: 1024,
            suffix_tokens: 160,
            max_tokens: 2,
            prefix_scope: PrefixScope::Group,
            seed: 1,
            progress: false,
            ..StormConfig::default()
        },
        seed_given: true,
        control: format!("http://{}", gateway.control_addr).parse().unwrap(),
        replica_controls: Vec::new(),
        control_token: None,
        cells: parse_cells("strict,gap=1,gap=2,gap=4").unwrap(),
        reps: 2,
    };
    let report = run_ab(&config, &CancellationToken::new(), |_| {})
        .await
        .unwrap();
    for run in &report.runs {
        let r = &run.report;
        assert_eq!((r.ok, r.errors), (24, 0), "{}", run.cell);
        for (key, placement) in &r.placement {
            let mut counts: Vec<u64> = placement.values().copied().collect();
            counts.sort_unstable_by(|a, b| b.cmp(a));
            let groups = counts.iter().sum::<u64>() / 8;
            let expected = if run.cell == "strict" {
                vec![8 * groups]
            } else {
                vec![6 * groups, 2 * groups]
            };
            assert_eq!(counts, expected, "{} {key}", run.cell);
        }
        let spill = if run.cell == "strict" { 0.0 } else { 0.25 };
        assert_eq!(r.spill_fraction, spill, "{}", run.cell);
        // Every prompt is 1,184 tokens; a sibling hits 1,024 of them or nothing: 7 hits a group
        // under strict, 6 when two siblings are on the second worker.
        let hits = if run.cell == "strict" { 7 } else { 6 };
        assert_eq!(r.cached_tokens, 3 * hits * 1024, "{}", run.cell);
    }
    for cell in &report.cells[1..] {
        let ttft = cell.ttft_mean_ratio.unwrap();
        assert!(ttft.ratio < 1.0, "{} TTFT {ttft:?}", cell.label);
        let cached = cell.cached_difference.unwrap();
        assert!(cached.mean < 0.0, "{} cached {cached:?}", cell.label);
    }
    let spills: Vec<f64> = report.cells[1..].iter().map(|c| c.spill_fraction).collect();
    assert_eq!(spills, [0.25, 0.25, 0.25]);
    gateway.shutdown().await;
}

/// A URL on 127.0.0.1 where nobody listens: a port the system handed out, then released.
fn dead_url() -> reqwest::Url {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url.parse().unwrap()
}

fn replica_storm(gateways: &[&gatewayd::RunningGateway], groups: usize) -> StormConfig {
    let url = |g: &&gatewayd::RunningGateway| -> reqwest::Url {
        format!("http://{}", g.data_addr).parse().unwrap()
    };
    StormConfig {
        gateway: url(&gateways[0]),
        replicas: gateways[1..].iter().map(url).collect(),
        groups,
        siblings: 4,
        keys: 4,
        concurrency: 2,
        prefix_tokens: 64,
        max_tokens: 4,
        progress: false,
        ..StormConfig::default()
    }
}

#[tokio::test]
async fn an_unreachable_replica_in_the_drain_check_is_a_finding_in_the_report() {
    let workers = sim_workers(2, 0.0).await;
    let config = config_for(&workers, PolicyKind::BoundedConsistentHashing, 2);
    let (a, b) = (
        common::start(config.clone()).await,
        common::start(config).await,
    );
    let dead = dead_url();
    let control = |g: &gatewayd::RunningGateway| -> reqwest::Url {
        format!("http://{}", g.control_addr).parse().unwrap()
    };
    let storm = StormConfig {
        control: Some(control(&a)),
        replica_controls: vec![control(&b), dead.clone()],
        ..replica_storm(&[&a, &b], 4)
    };
    let report = run_storm(&storm)
        .await
        .expect("a report, whatever one replica's control plane says");
    let text = report.to_string();
    assert_eq!(report.ok, 16, "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(dead.as_str()))
        .unwrap_or_else(|| panic!("the dead replica is named in\n{text}"));
    assert!(line.contains("unreachable"), "{line}");
    let drain = report.drain.as_ref().expect("drain checked");
    assert!(!drain.all_zero, "not verified on every replica");
    let controls: Vec<&str> = drain.replicas.iter().map(|r| r.control.as_str()).collect();
    assert_eq!(controls[2], dead.as_str());
    assert_eq!(
        drain
            .replicas
            .iter()
            .map(|r| r.error.is_some())
            .collect::<Vec<_>>(),
        [false, false, true]
    );
    assert!(drain.replicas[..2].iter().all(|r| r.all_zero), "{text}");
    assert_eq!(report.per_replica.len(), 2);
    assert!(
        report.per_replica.iter().all(|r| r.outcomes.ok == 8),
        "{text}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// Requests the gateway has routed so far, over all its workers.
fn routed(gateway: &gatewayd::RunningGateway) -> u64 {
    let table = gateway.routing_table();
    table
        .workers()
        .iter()
        .map(|w| w.stats.requests_total())
        .sum()
}

/// The replica-failure drill: two replicas in front of one fleet, the second stopped once it has
/// routed a few requests of a long storm. Without ejection its later requests are refused and
/// counted as such; with `eject_refused_replicas` the first refusal takes it out of the rotation
/// and every refused request is sent to the other replica. Either way the report comes back, adds
/// up, and names the replica whose control plane could not be asked.
#[tokio::test]
async fn a_replica_killed_mid_storm_is_counted_or_ejected_and_the_report_adds_up() {
    for eject in [false, true] {
        let workers = sim_workers(2, 0.1).await;
        let config = config_for(&workers, PolicyKind::BoundedConsistentHashing, 2);
        let (a, b) = (
            common::start(config.clone()).await,
            common::start(config).await,
        );
        let control = |g: &gatewayd::RunningGateway| -> reqwest::Url {
            format!("http://{}", g.control_addr).parse().unwrap()
        };
        let b_control = control(&b);
        let storm = StormConfig {
            eject_refused_replicas: eject,
            control: Some(control(&a)),
            replica_controls: vec![b_control.clone()],
            concurrency: 4,
            ..replica_storm(&[&a, &b], 200)
        };
        let running = tokio::spawn(async move { run_storm(&storm).await });
        tokio::time::timeout(Duration::from_secs(30), async {
            while routed(&b) < 8 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the second replica routes requests");
        b.shutdown().await;
        let report = running.await.unwrap().expect("a report");
        let text = report.to_string();
        let o = &report.outcomes;
        assert_eq!(report.requests, 800);
        assert_eq!(o.total(), 800, "{text}");
        assert_eq!(report.per_replica.len(), 2);
        let [first, second] = [&report.per_replica[0], &report.per_replica[1]];
        assert_eq!(
            first.outcomes.total() + second.outcomes.total() + o.not_sent,
            800
        );
        assert!(second.outcomes.ok >= 8, "{text}");
        assert_eq!(first.ejected_after_s, None, "{text}");
        if eject {
            assert!(second.ejected_after_s.is_some(), "{text}");
            assert_eq!((o.refused, o.not_sent), (0, 0), "{text}");
            assert!(second.refused_and_resent >= 1, "{text}");
            assert_eq!(report.refused_and_resent, second.refused_and_resent);
            assert!(text.contains("EJECTED after"), "{text}");
        } else {
            assert_eq!(second.ejected_after_s, None, "{text}");
            assert!(o.refused > 0, "{text}");
            assert_eq!(o.refused, second.outcomes.refused, "{text}");
            assert_eq!(report.refused_and_resent, 0);
        }
        let drain = report.drain.as_ref().expect("drain checked");
        assert!(!drain.all_zero, "one control plane could not be asked");
        assert_eq!(drain.replicas[0].error, None, "{text}");
        assert!(drain.replicas[1].error.is_some(), "{text}");
        assert!(
            text.lines()
                .any(|l| l.contains(b_control.as_str()) && l.contains("NOT CHECKED")),
            "{text}"
        );
        a.shutdown().await;
    }
}
