//! bch-drill through a real gatewayd: the 6:2 burst on simulated workers, storm accounting against
//! the gateway's own metrics, and a small A/B run producing every cell.

mod common;

use std::time::Duration;

use bch_core::policy::PolicyKind;
use bch_drill::ab::{AbConfig, parse_cells, run_ab};
use bch_drill::sim::SimConfig;
use bch_drill::storm::{StormConfig, run_storm};
use bch_drill::worker::{Fault, WorkerHandle, spawn_workers};
use gatewayd::config::{Config, WorkerConfig};

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
                reqwest::Client::new()
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

    let metrics = reqwest::get(format!("{control}metrics"))
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
        control: format!("http://{}", gateway.control_addr).parse().unwrap(),
        replica_controls: Vec::new(),
        control_token: None,
        cells: parse_cells("strict,gap=1,gap=2").unwrap(),
        reps: 2,
    };
    let mut runs = Vec::new();
    let report = run_ab(&config, |run| runs.push(run.cell.clone()))
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
    // The last cell written is what the gateway now runs.
    let policy: serde_json::Value =
        reqwest::get(format!("http://{}/admin/policy", gateway.control_addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let last = runs.last().unwrap();
    let expected_kind = if last == "strict" {
        "consistent_hashing"
    } else {
        "bounded_consistent_hashing"
    };
    assert_eq!(policy["kind"], expected_kind);
    gateway.shutdown().await;
}
