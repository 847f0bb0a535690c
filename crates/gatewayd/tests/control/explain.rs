//! `GET /admin/explain`: a routing decision explained without reserving load.

use crate::common::*;

use super::*;

#[tokio::test]
async fn explain_answers_without_reserving_load() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let mut config = test_config(&[&a, &b]);
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    let gateway = start(config).await;
    let client = client();

    let mut first = None;
    for _ in 0..20 {
        let answer = get_json(&control(&gateway, "/admin/explain?routing_key=session-1")).await;
        assert_eq!(answer["branch"], "explicit_routing_key_hit", "{answer}");
        assert!(answer["worker"].is_string(), "{answer}");
        assert_eq!(answer["worker"], answer["preferred"], "{answer}");
        assert!(answer["bound"].is_object(), "{answer}");
        assert_eq!(answer["policy"]["kind"], "bounded_consistent_hashing");
        if let Some(first) = &first {
            assert_eq!(&answer, first, "an idle fleet gives the same answer");
        }
        first = Some(answer);
    }
    for worker in workers(&gateway).await {
        assert_eq!(worker["active"], 0, "{worker}");
        assert_eq!(worker["requests_total"], 0, "{worker}");
    }
    let first = first.unwrap();
    // A real request goes where explain said.
    let response = client
        .get(data(&gateway, "/v1/models"))
        .header(ROUTING_KEY, "session-1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["x-bch-worker"],
        first["worker"].as_str().unwrap()
    );

    // Implicit: the same hashing as an Authorization header, never spills.
    let implicit = get_json(&control(
        &gateway,
        "/admin/explain?routing_key=Bearer%20abc&explicit=false",
    ))
    .await;
    assert_eq!(implicit["branch"], "implicit_routing_key_hit", "{implicit}");
    let response = client
        .get(data(&gateway, "/v1/models"))
        .header("authorization", "Bearer abc")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["x-bch-branch"],
        "implicit_routing_key_hit"
    );
    assert_eq!(
        response.headers()["x-bch-worker"],
        implicit["worker"].as_str().unwrap()
    );

    let target = get_json(&control(&gateway, "/admin/explain?target_worker=b")).await;
    assert_eq!(target["branch"], "target_worker_hit");
    assert_eq!(target["worker"], "b");
    let by_index = get_json(&control(&gateway, "/admin/explain?target_worker=0")).await;
    assert_eq!(by_index["worker"], "a");
    let miss = get_json(&control(&gateway, "/admin/explain?target_worker=zzz")).await;
    assert_eq!(miss["branch"], "target_worker_miss");
    assert!(miss["worker"].is_null());

    let keyless = get_json(&control(&gateway, "/admin/explain")).await;
    assert_eq!(keyless["branch"], "keyless");

    for bad in [
        "/admin/explain?routing_key=k&bogus=1",
        "/admin/explain?routing_key=k&explicit=maybe",
        "/admin/explain?routing_key=",
        // Not UTF-8 once decoded: the data plane ignores such a header, so explain refuses it too
        // rather than answering for a repaired key.
        "/admin/explain?routing_key=%FF%FE",
        // Bytes no header can carry, so no request has such a key; a repeated parameter would
        // explain one of two keys.
        "/admin/explain?routing_key=a%00b",
        "/admin/explain?routing_key=a%0D%0Ax-smg-target-worker:%20b",
        "/admin/explain?routing_key=a%0Ab",
        "/admin/explain?routing_key=%20padded",
        "/admin/explain?routing_key=a%00b&explicit=false",
        "/admin/explain?target_worker=a%0D%0A",
        "/admin/explain?routing_key=one&routing_key=two",
        "/admin/explain?routing_key=k&explicit=true&explicit=false",
        "/admin/explain?target_worker=a&target_worker=b",
    ] {
        let response = client.get(control(&gateway, bad)).send().await.unwrap();
        assert_eq!(response.status(), 400, "{bad}");
        error_message(&response.json().await.unwrap());
    }
    let long = "k".repeat(129);
    let response = client
        .get(control(
            &gateway,
            &format!("/admin/explain?routing_key={long}"),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    // Every explain above left the counters alone.
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    let total: u64 = workers(&gateway)
        .await
        .iter()
        .map(|w| w["requests_total"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 2, "only the two real requests were counted");
    gateway.shutdown().await;
}

/// `full=NAME` answers what a key would get were NAME full; the answer says what a request that
/// finds no room waits for, and each worker's capacity and full flag.
#[tokio::test]
async fn explain_answers_for_full_workers() {
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let mut config = test_config(&[&a, &b, &c]);
    config.policy.kind = bch_core::policy::PolicyKind::BoundedConsistentHashing;
    let gateway = start(config).await;
    let client = client();

    let free = get_json(&control(&gateway, "/admin/explain?routing_key=session-1")).await;
    let preferred = free["worker"].as_str().unwrap().to_owned();
    assert!(free["wait"].is_null(), "{free}");
    for worker in free["fleet_loads"].as_array().unwrap() {
        assert!(worker["capacity"].is_null(), "no cap configured: {worker}");
        assert_eq!(worker["full"], false, "{worker}");
    }

    let path = format!("/admin/explain?routing_key=session-1&full={preferred}");
    let moved = get_json(&control(&gateway, &path)).await;
    assert_eq!(moved["branch"], "explicit_routing_key_capacity_spill");
    assert_eq!(moved["preferred"], preferred.as_str());
    assert_ne!(moved["worker"], preferred.as_str(), "{moved}");
    let marked: Vec<&Value> = moved["fleet_loads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["full"] == true)
        .collect();
    assert_eq!(marked.len(), 1, "{moved}");

    // An implicit key waits for its own worker.
    let implicit = get_json(&control(
        &gateway,
        "/admin/explain?routing_key=Bearer%20abc&explicit=false",
    ))
    .await;
    let own = implicit["worker"].as_str().unwrap().to_owned();
    let held = get_json(&control(
        &gateway,
        &format!("/admin/explain?routing_key=Bearer%20abc&explicit=false&full={own}"),
    ))
    .await;
    assert_eq!(held["branch"], "implicit_routing_key_full", "{held}");
    assert!(held["worker"].is_null(), "{held}");
    assert_eq!(held["wait"], serde_json::json!({"for_worker": own}));

    // Every worker full: a keyless request waits for any.
    let all = get_json(&control(&gateway, "/admin/explain?full=a&full=b&full=c")).await;
    assert_eq!(all["branch"], "fleet_full", "{all}");
    assert_eq!(all["wait"], "for_any_worker", "{all}");

    let response = client
        .get(control(&gateway, "/admin/explain?full=nobody"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(
        error_message(&response.json().await.unwrap()).contains("nobody"),
        "the unknown worker is named"
    );
    // Explaining reserved nothing.
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    gateway.shutdown().await;
}
