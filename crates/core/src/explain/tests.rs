//! The explainer's unit tests: defaults and refusals, `worker_metrics` scenarios, pools by model
//! and full workers, each against answers worked out by hand.

use super::*;

fn scenario(json: &str) -> Scenario {
    serde_json::from_str(json).unwrap()
}

#[test]
fn defaults_and_errors() {
    let mut explainer = Explainer::new();
    let s = scenario(r#"{"workers":["http://a","http://b"],"routing_key":"k","explicit":true}"#);
    assert_eq!((s.min_load_gap, s.max_load_skew), (2, 1.5));
    let answer = explainer.explain(&s).unwrap();
    assert_eq!(answer.branch, Branch::ExplicitRoutingKeyHit);
    assert_eq!(answer.worker, answer.preferred);
    let stray = scenario(
        r#"{"workers":["http://a"],"loads":{"http://z":1},"routing_key":"k","explicit":true}"#,
    );
    assert!(
        explainer
            .explain(&stray)
            .unwrap_err()
            .to_string()
            .contains("loads")
    );
    let bad = scenario(
        r#"{"workers":["http://a"],"routing_key":"k","explicit":true,"max_load_skew":0.5}"#,
    );
    assert!(explainer.explain(&bad).is_err());
    assert!(
        serde_json::from_str::<Scenario>(
            r#"{"workers":[],"routing_key":"k","explicit":true,"x":1}"#
        )
        .is_err()
    );
}

#[test]
fn worker_metrics_scenarios_use_the_reports_and_say_so() {
    let mut explainer = Explainer::new();
    // near-idle-key prefers :30004 (docs/explain.md). Locally it has 1 in flight, but the
    // worker reports 3 (two more from other replicas): the bound fires on the fleet number.
    let base = r#""workers":["http://127.0.0.1:30001","http://127.0.0.1:30002","http://127.0.0.1:30003","http://127.0.0.1:30004"],"loads":{"http://127.0.0.1:30004":1},"reported":{"http://127.0.0.1:30004":3},"routing_key":"near-idle-key","explicit":true"#;
    let local = explainer
        .explain(&scenario(&format!("{{{base}}}")))
        .unwrap();
    assert_eq!(local.branch, Branch::ExplicitRoutingKeyHit);
    assert_eq!(local.load_signal, Some(LoadSignal::Local));
    assert_eq!(
        local.fleet_loads[3].fleet, 3,
        "fleet numbers are shown in local mode too"
    );
    assert_eq!(local.fleet_loads[3].used, 1);
    let fleet = explainer
        .explain(&scenario(&format!(
            r#"{{{base},"load_source":"worker_metrics"}}"#
        )))
        .unwrap();
    assert_eq!(fleet.branch, Branch::ExplicitRoutingKeySpillover);
    assert_eq!(fleet.bound.unwrap().preferred_load, 3);
    assert_eq!(
        fleet.load_signal,
        Some(LoadSignal::Mixed),
        "three workers have no report"
    );
    assert_eq!(fleet.fleet_loads[3].signal, LoadSignal::WorkerMetrics);
    assert_eq!(fleet.fleet_loads[0].signal, LoadSignal::Local);
    // The list is named as in `/admin/explain`, where `loads` is the map of local counts.
    let json = serde_json::to_value(&fleet).unwrap();
    assert_eq!(json["fleet_loads"][3]["fleet"], 3, "{json}");
    assert!(json.get("loads").is_none(), "{json}");
    // Classic scenarios keep their classic answer shape.
    let classic = scenario(r#"{"workers":["http://a"],"routing_key":"k","explicit":true}"#);
    let answer = explainer.explain(&classic).unwrap();
    assert!(answer.fleet_loads.is_empty() && answer.load_signal.is_none());
}

#[test]
fn a_model_decides_in_its_pool_on_its_own_ring_and_loads() {
    let mut explainer = Explainer::new();
    let workers = r#""workers":["http://a","http://b","http://c","http://d"],"models":{"http://a":["m1"],"http://b":["m1"],"http://c":["m2"],"http://d":["m2","m1"]}"#;
    let in_m2 = explainer
        .explain(&scenario(&format!(
            r#"{{{workers},"model":"m2","routing_key":"k","explicit":true}}"#
        )))
        .unwrap();
    assert!(matches!(
        in_m2.worker.as_deref(),
        Some("http://c" | "http://d")
    ));
    assert_eq!(in_m2.model.as_deref(), Some("m2"));
    // The pool's answer is a one-model fleet's answer over its workers, loads included: the
    // other pool's load does not count in the bound's mean.
    let loaded =
        r#""loads":{"http://a":9,"http://c":1},"model":"m2","routing_key":"k","explicit":true"#;
    let pooled = explainer
        .explain(&scenario(&format!("{{{workers},{loaded}}}")))
        .unwrap();
    let alone_loads = loaded.replace(r#""http://a":9,"#, "");
    let alone = explainer
        .explain(&scenario(&format!(
            r#"{{"workers":["http://c","http://d"],{alone_loads}}}"#
        )))
        .unwrap();
    assert_eq!(
        (pooled.worker, pooled.branch, pooled.bound),
        (alone.worker, alone.branch, alone.bound)
    );
    assert_eq!(alone.model, None);
    let missing = scenario(&format!(
        r#"{{{workers},"routing_key":"k","explicit":true}}"#
    ));
    assert_eq!(
        explainer.explain(&missing),
        Err(ScenarioError::MissingModel)
    );
    let unknown = scenario(&format!(
        r#"{{{workers},"model":"m3","routing_key":"k","explicit":true}}"#
    ));
    assert_eq!(
        explainer.explain(&unknown),
        Err(ScenarioError::UnknownModel("m3".into()))
    );
}

#[test]
fn full_workers_move_explicit_keys_and_hold_implicit_ones() {
    let mut explainer = Explainer::new();
    let workers = r#""workers":["http://a","http://b","http://c"]"#;
    let free = explainer
        .explain(&scenario(&format!(
            r#"{{{workers},"routing_key":"k","explicit":true}}"#
        )))
        .unwrap();
    let preferred = free.preferred.clone().unwrap();
    // The preferred worker at its cap of 2: the explicit key moves at once, although the
    // bound alone (2 − 0 ≤ gap 2) would keep it.
    let at_cap = format!(
        r#"{{{workers},"loads":{{"{preferred}":2}},"max_in_flight_per_worker":2,"routing_key":"k","explicit":true}}"#
    );
    let moved = explainer.explain(&scenario(&at_cap)).unwrap();
    assert_eq!(moved.branch, Branch::ExplicitRoutingKeyCapacitySpill);
    assert_ne!(moved.worker, moved.preferred);
    assert_eq!(moved.preferred.as_deref(), Some(preferred.as_str()));
    assert!(moved.wait.is_none());
    // The same key as an implicit one waits for its worker.
    let implicit = at_cap.replace(r#""explicit":true"#, r#""explicit":false"#);
    let held = explainer.explain(&scenario(&implicit)).unwrap();
    assert_eq!(held.branch, Branch::ImplicitRoutingKeyFull);
    assert_eq!(held.worker, None);
    assert_eq!(held.wait, Some(WaitsFor::ForWorker(preferred)));
    // Every worker saturated by its engine: the explicit key waits for any worker.
    let all_full = format!(
        r#"{{{workers},"engine_full":{{"http://a":true,"http://b":true,"http://c":true}},"routing_key":"k","explicit":true}}"#
    );
    let waits = explainer.explain(&scenario(&all_full)).unwrap();
    assert_eq!(
        (waits.worker.clone(), waits.branch, waits.wait.clone()),
        (None, Branch::FleetFull, Some(WaitsFor::ForAnyWorker))
    );
    let json = serde_json::to_value(&waits).unwrap();
    assert_eq!(json["wait"], "for_any_worker", "{json}");
    let stray = format!(
        r#"{{{workers},"max_in_flight":{{"http://z":1}},"routing_key":"k","explicit":true}}"#
    );
    let error = explainer.explain(&scenario(&stray)).unwrap_err();
    assert!(error.to_string().contains("max_in_flight"), "{error}");
}
