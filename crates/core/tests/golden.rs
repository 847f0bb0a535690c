//! Golden vectors computed by an independent implementation of SGLang Model Gateway's placement and
//! of the bounded rule (`fixtures/*.json`, copied verbatim from the design's shared cases).

use std::collections::HashMap;

use bch_core::explain::{Explainer, Scenario};
use bch_core::fleet_load::{FleetSample, LoadSource};
use bch_core::policy::{PolicyKind, PolicySettings, SpillOrder};
use bch_core::ring::{Ring, hash_position};
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, RoutingKey};
use serde::Deserialize;

const RING_PARITY: &str = include_str!("fixtures/ring_parity.json");
const BOUNDED: &str = include_str!("fixtures/bounded_decisions.json");

#[derive(Deserialize)]
struct RingParity {
    hashes: HashMap<String, String>,
    all_healthy: Placements,
    one_unhealthy: Placements,
    ring_shares: HashMap<String, f64>,
}

#[derive(Deserialize)]
struct Placements {
    workers: Vec<String>,
    unhealthy: Vec<String>,
    placements: Vec<Placement>,
}

#[derive(Deserialize)]
struct Placement {
    key: String,
    worker: String,
}

#[derive(Deserialize)]
struct Bounded {
    workers: Vec<String>,
    cases: Vec<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    bursts: Vec<Burst>,
}

#[derive(Deserialize)]
struct Burst {
    workers: Vec<String>,
    routing_key: String,
    requests: usize,
    min_load_gap: u64,
    max_load_skew: f64,
    expect_loads: HashMap<String, u64>,
}

/// Splits a golden case into the scenario (the `gatewayd explain` input schema) and its expectation.
fn split_case(
    workers: &[String],
    case: &serde_json::Map<String, serde_json::Value>,
) -> (Scenario, Option<String>, String) {
    let mut input = case.clone();
    input.insert("workers".into(), serde_json::json!(workers));
    let worker = input.remove("expect_worker").unwrap();
    let branch = input.remove("expect_branch").unwrap();
    let scenario = serde_json::from_value(serde_json::Value::Object(input)).unwrap();
    (
        scenario,
        serde_json::from_value(worker).unwrap(),
        branch.as_str().unwrap().to_owned(),
    )
}

fn specs(urls: &[String]) -> Vec<WorkerSpec> {
    urls.iter()
        .enumerate()
        .map(|(i, url)| WorkerSpec {
            name: format!("w{i}"),
            url: url.clone(),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        })
        .collect()
}

#[test]
fn hashes_match() {
    let parity: RingParity = serde_json::from_str(RING_PARITY).unwrap();
    assert!(!parity.hashes.is_empty());
    for (input, expected) in &parity.hashes {
        let expected: u64 = expected.parse().unwrap();
        assert_eq!(
            hash_position(input.as_bytes()),
            expected,
            "hash of {input:?}"
        );
    }
}

#[test]
fn placements_match_with_all_healthy_and_one_unhealthy() {
    let parity: RingParity = serde_json::from_str(RING_PARITY).unwrap();
    for set in [&parity.all_healthy, &parity.one_unhealthy] {
        let router = Router::new(specs(&set.workers), PolicySettings::default()).unwrap();
        for url in &set.unhealthy {
            let index = set.workers.iter().position(|w| w == url).unwrap();
            assert!(router.set_health(&format!("w{index}"), false));
        }
        let table = router.table();
        assert!(!set.placements.is_empty());
        for placement in &set.placements {
            let key = ExplicitKey::parse(placement.key.as_bytes()).unwrap();
            let decision = table.explain(&RoutingKey::Explicit(key));
            let got = &table.workers()[decision.worker.unwrap()].spec.url;
            assert_eq!(got, &placement.worker, "key {:?}", placement.key);
        }
    }
}

#[test]
fn ring_shares_match() {
    let parity: RingParity = serde_json::from_str(RING_PARITY).unwrap();
    let workers = &parity.all_healthy.workers;
    let shares = Ring::build(workers, 150).shares();
    for (url, expected) in &parity.ring_shares {
        let index = workers.iter().position(|w| w == url).unwrap();
        assert!(
            (shares[index] - expected).abs() < 1e-6,
            "{url}: {} vs {expected}",
            shares[index]
        );
    }
}

#[test]
fn bounded_decisions_match() {
    let bounded: Bounded = serde_json::from_str(BOUNDED).unwrap();
    assert!(bounded.cases.len() >= 70);
    let mut explainer = Explainer::new();
    for case in &bounded.cases {
        let (scenario, expect_worker, expect_branch) = split_case(&bounded.workers, case);
        assert_eq!(scenario.policy, PolicyKind::BoundedConsistentHashing);
        let answer = explainer.explain(&scenario).unwrap();
        assert_eq!(answer.worker, expect_worker, "{scenario:?}");
        assert_eq!(answer.branch.as_str(), expect_branch, "{scenario:?}");
    }
}

/// The same vectors in `worker_metrics` mode, as one replica alone sees them: every worker reports
/// exactly this replica's requests (a scrape right after the loads were reached), so the fleet
/// number is the local one and every decision must be unchanged.
#[test]
fn bounded_decisions_match_in_worker_metrics_mode_for_one_replica() {
    let bounded: Bounded = serde_json::from_str(BOUNDED).unwrap();
    let mut explainer = Explainer::new();
    for case in &bounded.cases {
        let (mut scenario, expect_worker, expect_branch) = split_case(&bounded.workers, case);
        scenario.load_source = LoadSource::WorkerMetrics;
        for url in &bounded.workers {
            let local = scenario.loads.get(url).copied().unwrap_or(0);
            scenario.reported.insert(url.clone(), local);
        }
        let answer = explainer.explain(&scenario).unwrap();
        assert_eq!(answer.worker, expect_worker, "{scenario:?}");
        assert_eq!(answer.branch.as_str(), expect_branch, "{scenario:?}");
    }
}

/// How a burst meets the scraper in `worker_metrics` mode.
#[derive(Debug, Clone, Copy)]
enum Scrapes {
    /// `local` mode: no scraping at all.
    Off,
    /// One scrape of the idle fleet just before the burst, none during it: the burst splits inside
    /// one scrape interval, on the requests the replica sent since the scrape.
    BeforeTheBurst,
    /// A scrape after every request, each reporting exactly this replica's requests.
    AfterEveryRequest,
}

#[test]
fn bursts_land_six_to_two() {
    for scrapes in [
        Scrapes::Off,
        Scrapes::BeforeTheBurst,
        Scrapes::AfterEveryRequest,
    ] {
        bursts_land_six_to_two_with(scrapes);
    }
}

fn scrape_exactly(router: &Router) {
    for worker in router.table().workers() {
        let local = worker.stats.active();
        let sample = FleetSample {
            reported: local,
            local_at_scrape: local,
        };
        router.publish_sample(&worker.stats, sample, 1);
    }
}

fn bursts_land_six_to_two_with(scrapes: Scrapes) {
    let bounded: Bounded = serde_json::from_str(BOUNDED).unwrap();
    let gaps: Vec<u64> = bounded.bursts.iter().map(|b| b.min_load_gap).collect();
    assert_eq!(gaps, vec![0, 1, 2, 4]);
    for burst in &bounded.bursts {
        let policy = PolicySettings {
            min_load_gap: burst.min_load_gap,
            max_load_skew: burst.max_load_skew,
            load_source: match scrapes {
                Scrapes::Off => LoadSource::Local,
                _ => LoadSource::WorkerMetrics,
            },
            ..Default::default()
        };
        let router = Router::new(specs(&burst.workers), policy).unwrap();
        let key = RoutingKey::Explicit(ExplicitKey::parse(burst.routing_key.as_bytes()).unwrap());
        if !matches!(scrapes, Scrapes::Off) {
            scrape_exactly(&router);
        }
        let held: Vec<_> = (0..burst.requests)
            .map(|_| {
                let routed = router.route(&key);
                if matches!(scrapes, Scrapes::AfterEveryRequest) {
                    scrape_exactly(&router);
                }
                routed
            })
            .collect();
        let table = router.table();
        for (url, expected) in &burst.expect_loads {
            let worker = table.workers().iter().find(|w| &w.spec.url == url).unwrap();
            assert_eq!(
                worker.stats.active(),
                *expected,
                "gap {} {url} {scrapes:?}",
                burst.min_load_gap
            );
        }
        drop(held);
        assert!(table.workers().iter().all(|w| w.stats.active() == 0));
    }
}

/// Loads `[p,0,0,0]` on the preferred worker: with gap 2 and skew 1.5 the key stays for p <= 2 and
/// spills at p = 3; with gap 0 it spills at p = 1.
#[test]
fn near_idle_vectors() {
    let workers: Vec<String> = (1..=4)
        .map(|i| format!("http://127.0.0.1:3000{i}"))
        .collect();
    let mut explainer = Explainer::new();
    let base = Scenario {
        workers: workers.clone(),
        loads: HashMap::new(),
        healthy: HashMap::new(),
        routing_key: "near-idle-key".into(),
        explicit: true,
        min_load_gap: 2,
        max_load_skew: 1.5,
        spill_order: SpillOrder::Ring,
        policy: PolicyKind::BoundedConsistentHashing,
        load_source: LoadSource::Local,
        reported: HashMap::new(),
        local_at_scrape: HashMap::new(),
        max_in_flight_per_worker: 0,
        max_in_flight: HashMap::new(),
        engine_full: HashMap::new(),
        models: HashMap::new(),
        model: None,
    };
    let preferred = explainer.explain(&base).unwrap().worker.unwrap();
    for (gap, p, spills) in [
        (2, 0, false),
        (2, 1, false),
        (2, 2, false),
        (2, 3, true),
        (0, 0, false),
        (0, 1, true),
    ] {
        let mut scenario = base.clone();
        scenario.min_load_gap = gap;
        scenario.loads.insert(preferred.clone(), p);
        let answer = explainer.explain(&scenario).unwrap();
        assert_eq!(
            answer.worker.as_ref() != Some(&preferred),
            spills,
            "gap {gap} p {p}"
        );
    }
}
