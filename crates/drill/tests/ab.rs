//! The A/B harness end to end: a simulated worker stands in for the gateway's data plane and a tiny
//! fake control plane records every policy switch.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::{get, put};
use bch_drill::ab::{AbConfig, parse_cells, run_ab, write_plot};
use bch_drill::sim::SimConfig;
use bch_drill::storm::StormConfig;
use bch_drill::worker::spawn_worker;
use reqwest::Url;
use serde_json::{Value, json};

type Calls = Arc<Mutex<Vec<Value>>>;

async fn fake_control(calls: Calls) -> Url {
    let app = Router::new()
        .route(
            "/admin/policy",
            put(|State(calls): State<Calls>, axum::Json(body): axum::Json<Value>| async move {
                calls.lock().unwrap().push(body.clone());
                axum::Json(body)
            }),
        )
        .route(
            "/admin/workers",
            get(|| async {
                axum::Json(json!({"workers": [{"name": "sim", "url": "http://x", "healthy": true, "active": 0,
                    "requests_total": 0, "spilled_in_total": 0, "spilled_out_total": 0, "errors_total": 0}]}))
            }),
        )
        .with_state(calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Url::parse(&format!("http://{addr}")).unwrap()
}

#[tokio::test]
async fn cells_and_repetitions_run_interleaved_and_every_output_is_written() {
    let worker = spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "sim",
        SimConfig::default().with_time_scale(0.1),
    )
    .await
    .unwrap();
    let calls = Calls::default();
    let control = fake_control(calls.clone()).await;
    let config = AbConfig {
        storm: StormConfig {
            gateway: Url::parse(&worker.url()).unwrap(),
            groups: 4,
            siblings: 4,
            keys: 2,
            concurrency: 2,
            prefix_tokens: 32,
            suffix_tokens: 4,
            max_tokens: 2,
            progress: false,
            ..StormConfig::default()
        },
        control,
        replica_controls: Vec::new(),
        control_token: None,
        cells: parse_cells("strict,gap=1,gap=2:skew=1.25").unwrap(),
        reps: 2,
    };
    let mut seen = Vec::new();
    let report = run_ab(&config, |run| seen.push((run.rep, run.cell.clone())))
        .await
        .unwrap();

    let strict = json!({"kind": "consistent_hashing"});
    let gap1 =
        json!({"kind": "bounded_consistent_hashing", "min_load_gap": 1, "max_load_skew": 1.5});
    let gap2 =
        json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.25});
    // Repetition 2 runs the cells in reverse.
    assert_eq!(
        *calls.lock().unwrap(),
        vec![
            strict.clone(),
            gap1.clone(),
            gap2.clone(),
            gap2,
            gap1,
            strict
        ]
    );
    let expected: Vec<(usize, String)> = [
        (1, "strict"),
        (1, "gap=1"),
        (1, "gap=2:skew=1.25"),
        (2, "gap=2:skew=1.25"),
        (2, "gap=1"),
        (2, "strict"),
    ]
    .into_iter()
    .map(|(r, c)| (r, c.to_owned()))
    .collect();
    assert_eq!(seen, expected);
    assert_eq!(report.runs.len(), 6);
    assert_eq!(
        report.runs.iter().map(|r| r.order).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert_eq!(report.runs[0].policy, json!({"kind": "consistent_hashing"}));
    // Each run used fresh prompts: the cache never carries a cell's prefixes into the next run.
    let seeds: std::collections::BTreeSet<u64> =
        report.runs.iter().map(|r| r.report.shape.seed).collect();
    assert_eq!(seeds.len(), 6);
    for run in &report.runs {
        assert_eq!((run.report.ok, run.report.errors), (16, 0));
        assert!(run.report.drain.as_ref().unwrap().all_zero);
    }

    assert_eq!(report.baseline, "strict");
    assert_eq!(report.cells.len(), 3);
    assert!(report.cells[0].ratio.is_none());
    for cell in &report.cells[1..] {
        let ratio = cell.ratio.unwrap();
        assert_eq!(ratio.n, 2);
        assert!(ratio.ci_low.unwrap() <= ratio.ratio && ratio.ratio <= ratio.ci_high.unwrap());
    }
    assert!(
        report
            .cells
            .iter()
            .all(|c| c.runs == 2 && c.drained && c.throughput_rps > 0.0)
    );
    assert_eq!(report.verdict.len(), 3, "{:?}", report.verdict);
    let table = report.to_string();
    assert!(
        table.contains("vs strict (95% CI)") && table.contains("1 (baseline)"),
        "{table}"
    );

    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("ab.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    let back: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(back["cells"][1]["label"], "gap=1");
    assert_eq!(back["runs"].as_array().unwrap().len(), 6);

    let svg = dir.path().join("ab.svg");
    write_plot(&report, &svg).unwrap();
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("gap=2:skew=1.25")
            && svg.contains("time to first token")
    );
    let png = dir.path().join("ab.png");
    write_plot(&report, &png).unwrap();
    assert!(std::fs::read(png).unwrap().starts_with(b"\x89PNG"));
}

#[tokio::test]
async fn an_unreachable_control_plane_fails_before_any_storm() {
    let worker = spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "sim",
        SimConfig::default(),
    )
    .await
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let control = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    drop(listener);
    let config = AbConfig {
        storm: StormConfig {
            gateway: Url::parse(&worker.url()).unwrap(),
            progress: false,
            ..StormConfig::default()
        },
        control: control.clone(),
        replica_controls: Vec::new(),
        control_token: None,
        cells: parse_cells("strict,gap=1").unwrap(),
        reps: 1,
    };
    let error = format!("{:#}", run_ab(&config, |_| {}).await.unwrap_err());
    assert!(
        error.contains("control plane") && error.contains("unreachable"),
        "{error}"
    );
    assert_eq!(worker.stats().requests_total, 0);
}

/// Several replicas: requests go round-robin over every data plane, every cell's policy (with its
/// load source) is put in force on every control plane, and the report says how many replicas.
#[tokio::test]
async fn several_replicas_share_the_storm_and_every_policy_switch() {
    let mut workers = Vec::new();
    for name in ["replica-a", "replica-b"] {
        let worker = spawn_worker(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            name,
            SimConfig::default().with_time_scale(0.1),
        )
        .await
        .unwrap();
        workers.push(worker);
    }
    let (calls_a, calls_b) = (Calls::default(), Calls::default());
    let (control_a, control_b) = (
        fake_control(calls_a.clone()).await,
        fake_control(calls_b.clone()).await,
    );
    let config = AbConfig {
        storm: StormConfig {
            gateway: Url::parse(&workers[0].url()).unwrap(),
            replicas: vec![Url::parse(&workers[1].url()).unwrap()],
            groups: 2,
            siblings: 4,
            keys: 1,
            concurrency: 1,
            prefix_tokens: 32,
            suffix_tokens: 4,
            max_tokens: 2,
            progress: false,
            ..StormConfig::default()
        },
        control: control_a,
        replica_controls: vec![control_b],
        control_token: None,
        cells: parse_cells("gap=2:load=worker_metrics,gap=2").unwrap(),
        reps: 1,
    };
    let report = run_ab(&config, |_| {}).await.unwrap();
    assert_eq!(report.replicas, 2);
    assert!(report.to_string().contains("2 gateway replicas"));
    let sent: Vec<u64> = workers.iter().map(|w| w.stats().requests_total).collect();
    assert_eq!(sent, vec![8, 8], "16 requests, one each in turn");
    let calls = calls_a.lock().unwrap().clone();
    assert_eq!(calls, *calls_b.lock().unwrap());
    let sources: Vec<&Value> = calls.iter().map(|c| &c["load_source"]).collect();
    assert_eq!(sources, [&json!("worker_metrics"), &json!("local")]);
    for run in &report.runs {
        assert_eq!(run.report.shape.replicas, 2);
        assert!(run.report.drain.as_ref().unwrap().all_zero);
    }
}
