//! The picker serves one pool (`[picker] model`): in a two-model fleet every endpoint it names,
//! the chosen one and each fallback, is a worker of its model, placed by that pool's own ring
//! and rule, and its decisions are counted under that model; `GET /admin/picker` says so.

use crate::common;

use bch_core::routing_key::{ExplicitKey, RoutingKey};
use common::envoy::*;
use common::*;

use crate::sessions::{name_at, picker_gateway, wait_released};

#[tokio::test]
async fn a_picker_on_model_b_names_only_model_bs_workers() {
    let mut workers = Vec::new();
    for name in ["a0", "a1", "a2", "b0", "b1", "b2"] {
        workers.push(fake_worker(name).await);
    }
    let refs: Vec<&FakeWorker> = workers.iter().collect();
    let gateway = picker_gateway(&refs, |config| {
        for worker in &mut config.workers {
            let model = if worker.name.as_deref().unwrap().starts_with('a') {
                "alpha"
            } else {
                "beta"
            };
            worker.models = vec![model.to_owned()];
        }
        config.picker.model = Some("beta".into());
        config.picker.fallbacks = 4;
    })
    .await;
    let picker = gateway.picker_addr.expect("picker listening");
    let status: serde_json::Value = client()
        .get(format!("http://{}/admin/picker", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        status,
        serde_json::json!({"enabled": true, "model": "beta", "workers": ["b0", "b1", "b2"], "routable_workers": 3})
    );
    let table = gateway.routing_table();
    let beta = table.pool_of_model("beta").unwrap();
    let mut keyed = 0;
    for n in 0..24 {
        let key = format!("session-{n}");
        // Every other request is keyless: the least loaded of the pool, and its fallbacks.
        let pairs = [("x-smg-routing-key", key.as_str())];
        let headers: &[(&str, &str)] = if n % 2 == 0 { &pairs } else { &[] };
        let mut envoy = FakeEnvoy::open(picker).await;
        let (endpoints, _) = picked(&envoy.exchange(request_headers(headers)).await);
        let names: Vec<String> = (endpoints.split(','))
            .map(|endpoint| name_at(&gateway, endpoint))
            .collect();
        assert!(
            names.iter().all(|name| name.starts_with('b')),
            "{key}: {names:?}"
        );
        assert_eq!(names.len(), 3, "the chosen one and both other beta workers");
        if n % 2 == 0 {
            keyed += 1;
            let explicit = RoutingKey::Explicit(ExplicitKey::parse(key.as_bytes()).unwrap());
            let expected = table.explain_in(&explicit, beta).worker.unwrap();
            assert_eq!(names[0], table.workers()[expected].spec.name, "{key}");
        }
        envoy.close();
        wait_released(&gateway).await;
    }
    let metrics = gateway.metrics_text();
    for (line, count) in [
        (
            r#"bch_branch_total{branch="explicit_routing_key_hit",model="beta"}"#,
            keyed,
        ),
        (
            r#"bch_branch_total{branch="keyless",model="beta"}"#,
            24 - keyed,
        ),
        (
            r#"bch_branch_total{branch="explicit_routing_key_hit",model="alpha"}"#,
            0,
        ),
    ] {
        assert!(
            metrics.contains(&format!("{line} {count}\n")),
            "{line} {count}: {metrics}"
        );
    }
    gateway.shutdown().await;
}
