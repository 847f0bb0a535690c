//! The Prometheus rules and the Grafana dashboard in `<workspace>/deploy/` only name metrics that
//! a running gateway really exports: a renamed metric fails here, not silently on a dashboard.
//! (`promtool check rules` and `promtool test rules` run in CI, see `.ci/run`.)

use crate::common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::*;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every `bch_…` identifier in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("bch_") {
        let start = i + at;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |n| start + n);
        if boundary {
            names.insert(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

#[tokio::test]
async fn rules_and_dashboard_name_only_exported_metrics() {
    let a = fake_worker("a").await;
    let gateway = start(test_config(&[&a])).await;
    client()
        .get(format!("http://{}/v1/models", gateway.data_addr))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    // Every family's series names from its `# TYPE` line, so a family with no series yet (no
    // probe has failed) still counts.
    let exported: BTreeSet<String> = gateway
        .metrics_text()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .flat_map(|l| {
            let (family, kind) = l.split_once(' ').unwrap();
            // The family's own name too: prose in descriptions names histograms by family.
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["", "_bucket", "_sum", "_count"],
                _ => &[""],
            };
            suffixes.iter().map(move |s| format!("{family}{s}"))
        })
        .collect();
    let files = [
        "prometheus/bch-alerts.yml",
        "prometheus/bch-alerts.test.yml",
        "grafana/bch-gateway.json",
    ];
    for file in files {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        let used = names_in(&text);
        assert!(!used.is_empty(), "{file} names no metric");
        let unknown: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics gatewayd does not export: {unknown:?}\nexported: {exported:?}"
        );
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/bch-gateway.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    assert!(dashboard["panels"].as_array().unwrap().len() >= 8);
    gateway.shutdown().await;
}

/// Every replica has the whole membership, so the dashboard's worker counts are per replica: a sum
/// over the replicas of a fleet of 8 workers behind 3 gateways says 24.
#[test]
fn dashboard_worker_counts_are_per_replica() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/bch-gateway.json")).unwrap(),
    )
    .unwrap();
    let per_replica = [
        "bch_discovery_workers",
        "bch_worker_healthy",
        "bch_worker_draining",
    ];
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            if !per_replica.iter().any(|gauge| expr.contains(gauge)) {
                continue;
            }
            checked += 1;
            let grouping = expr
                .split_once(" by (")
                .and_then(|(_, rest)| rest.split_once(')'))
                .map(|(labels, _)| labels);
            assert!(
                grouping.is_some_and(|labels| labels.split(',').any(|l| l.trim() == "instance")),
                "panel {:?}: {expr} adds up the replicas' counts of one membership",
                panel["title"]
            );
        }
    }
    assert!(checked >= 4, "the worker-count panels are gone");
}
