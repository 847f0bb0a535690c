//! The A/B harness end to end: a simulated worker stands in for the gateway's data plane and a tiny
//! fake control plane keeps a policy, answers `GET /admin/policy`, applies and records every
//! `PUT /admin/policy` (refusing the ones a test tells it to), and lists the worker.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, put};
use bch_drill::ab::{AbConfig, AbReport, parse_cells, run_ab, write_plot};
use bch_drill::sim::SimConfig;
use bch_drill::storm::StormConfig;
use bch_drill::worker::{WorkerHandle, spawn_worker};
use reqwest::Url;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What the fake control plane holds.
struct Control {
    policy: Value,
    puts: Vec<Value>,
    /// A `PUT` with this `min_load_gap` is refused with a 400.
    refuse_gap: Option<u64>,
    worker_url: String,
}

type Shared = Arc<Mutex<Control>>;

/// The policy the fake gateway starts with: not one any cell sets, so a restore is visible.
fn original_policy() -> Value {
    json!({"kind": "bounded_consistent_hashing", "min_load_gap": 3, "max_load_skew": 2.0,
        "spill_order": "hash_seeded", "virtual_nodes": 150, "load_source": "local",
        "admission": {"max_in_flight_per_worker": 0, "queue_timeout_ms": 0, "max_queued": 1024,
            "retry_after_ms": 1000, "max_waiting": 0, "max_kv_usage": 0.0}})
}

async fn put_policy(
    State(state): State<Shared>,
    axum::Json(body): axum::Json<Value>,
) -> axum::response::Response {
    let mut state = state.lock().unwrap();
    state.puts.push(body.clone());
    if state.refuse_gap.is_some() && body["min_load_gap"].as_u64() == state.refuse_gap {
        return (StatusCode::BAD_REQUEST, "refused by the test").into_response();
    }
    for (k, v) in body.as_object().unwrap() {
        state.policy[k] = v.clone();
    }
    axum::Json(state.policy.clone()).into_response()
}

async fn fake_control(worker: &WorkerHandle, refuse_gap: Option<u64>) -> (Url, Shared) {
    let state = Arc::new(Mutex::new(Control {
        policy: original_policy(),
        puts: Vec::new(),
        refuse_gap,
        worker_url: worker.url(),
    }));
    let app = Router::new()
        .route(
            "/admin/policy",
            put(put_policy).get(|State(state): State<Shared>| async move {
                axum::Json(state.lock().unwrap().policy.clone())
            }),
        )
        .route(
            "/admin/workers",
            get(|State(state): State<Shared>| async move {
                let url = state.lock().unwrap().worker_url.clone();
                axum::Json(json!({"workers": [{"name": "sim", "url": url, "healthy": true, "active": 0,
                    "requests_total": 0, "spilled_in_total": 0, "spilled_out_total": 0, "errors_total": 0}]}))
            }),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (Url::parse(&format!("http://{addr}")).unwrap(), state)
}

async fn sim_worker() -> WorkerHandle {
    spawn_worker(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "sim",
        SimConfig::default().with_time_scale(0.05),
    )
    .await
    .unwrap()
}

fn config(worker: &WorkerHandle, control: Url, cells: &str, reps: usize) -> AbConfig {
    AbConfig {
        storm: StormConfig {
            gateway: Url::parse(&worker.url()).unwrap(),
            groups: 4,
            siblings: 4,
            keys: 2,
            concurrency: 2,
            prefix_tokens: 32,
            suffix_tokens: 4,
            max_tokens: 2,
            seed: 42,
            progress: false,
            ..StormConfig::default()
        },
        seed_given: true,
        control,
        replica_controls: Vec::new(),
        control_token: None,
        cells: parse_cells(cells).unwrap(),
        reps,
    }
}

#[tokio::test]
async fn cells_and_repetitions_run_interleaved_and_the_policy_is_restored() {
    let worker = sim_worker().await;
    let (control, state) = fake_control(&worker, None).await;
    let config = config(&worker, control, "strict,gap=1,gap=2:skew=1.25", 2);
    let mut seen = Vec::new();
    let report = run_ab(&config, &CancellationToken::new(), |run| {
        seen.push((run.rep, run.cell.clone()))
    })
    .await
    .unwrap();

    let strict = json!({"kind": "consistent_hashing"});
    let gap1 = json!({"kind": "bounded_consistent_hashing", "min_load_gap": 1, "max_load_skew": 1.5,
        "spill_order": "ring"});
    let gap2 = json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.25,
        "spill_order": "ring"});
    // Repetition 2 runs the cells in reverse; then the policy found is put back, every field.
    let state = state.lock().unwrap();
    assert_eq!(
        state.puts,
        vec![
            strict.clone(),
            gap1.clone(),
            gap2.clone(),
            gap2,
            gap1,
            strict,
            original_policy()
        ]
    );
    assert_eq!(state.policy, original_policy());
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
    check_report(&report);
}

/// What a two-repetition report over three cells must hold.
fn check_report(report: &AbReport) {
    assert_eq!(report.runs.len(), 6);
    assert_eq!(
        report.runs.iter().map(|r| r.order).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    // Each run used fresh prompts, derived from the recorded base seed.
    let seeds: std::collections::BTreeSet<u64> =
        report.runs.iter().map(|r| r.report.shape.seed).collect();
    assert_eq!(seeds.len(), 6);
    assert!(report.runs.iter().all(|r| r.report.shape.seed != 42));
    for run in &report.runs {
        assert_eq!((run.report.ok, run.report.errors), (16, 0));
        assert!(run.report.drain.as_ref().unwrap().all_zero);
    }
    let meta = &report.meta;
    assert_eq!((meta.seed, meta.seed_given), (42, true));
    assert!(meta.tool.starts_with("bch-drill "), "{}", meta.tool);
    assert!(meta.started_at.ends_with('Z') && meta.started_at <= meta.finished_at);
    assert_eq!(meta.policy_before, original_policy());
    assert!(meta.policy_restored && meta.restore_error.is_none());
    assert_eq!(meta.workers.len(), 1);
    let sim = meta.workers[0]
        .sim
        .as_ref()
        .expect("a simulated worker reports its settings");
    assert_eq!(sim.time_scale, 0.05);

    assert_eq!(report.baseline, "strict");
    assert!(report.cells[0].ratio.is_none() && report.cells[0].ttft_mean_ratio.is_none());
    for cell in &report.cells[1..] {
        for ratio in [cell.ratio, cell.ttft_mean_ratio, cell.ttft_p99_ratio] {
            let ratio = ratio.unwrap();
            assert_eq!(ratio.n, 2);
            assert!(ratio.ci_low.unwrap() <= ratio.ratio && ratio.ratio <= ratio.ci_high.unwrap());
        }
        let cached = cell.cached_difference.unwrap();
        assert!(cached.ci_low.unwrap() <= cached.mean && cached.mean <= cached.ci_high.unwrap());
        assert!(cell.cached_reported);
    }
    assert_eq!(report.comparisons.len(), 1, "gap=1 against gap=2:skew=1.25");
    assert_eq!(
        (
            report.comparisons[0].a.as_str(),
            report.comparisons[0].b.as_str()
        ),
        ("gap=1", "gap=2:skew=1.25")
    );
    assert!(report.comparisons[0].throughput.is_some());
    // Two repetitions cannot carry a claim of "alike": the verdict says so.
    assert!(
        report
            .verdict
            .iter()
            .any(|l| l.starts_with("WARNING: only 2 repetitions per cell")),
        "{:?}",
        report.verdict
    );
    let table = report.to_string();
    assert!(
        table.contains("paired vs strict") && table.contains("gap=2:skew=1.25 / gap=1"),
        "{table}"
    );

    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("ab.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(report).unwrap()).unwrap();
    let back: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(back["cells"][1]["label"], "gap=1");
    assert_eq!(back["meta"]["workers"][0]["sim"]["time_scale"], 0.05);
    assert_eq!(back["runs"].as_array().unwrap().len(), 6);

    let svg = dir.path().join("ab.svg");
    write_plot(report, &svg).unwrap();
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("gap=2:skew=1.25")
            && svg.contains("time to first token")
            && svg.contains("spill and cached tokens")
            && svg.contains("2 repetitions, interleaved"),
        "the chart has its panels and subtitle"
    );
    let png = dir.path().join("ab.png");
    write_plot(report, &png).unwrap();
    assert!(std::fs::read(png).unwrap().starts_with(b"\x89PNG"));
}

#[tokio::test]
async fn a_refused_policy_still_restores_the_one_found() {
    let worker = sim_worker().await;
    let (control, state) = fake_control(&worker, Some(4)).await;
    let config = config(&worker, control, "strict,gap=1,gap=4", 1);
    let error = format!(
        "{:#}",
        run_ab(&config, &CancellationToken::new(), |_| {})
            .await
            .unwrap_err()
    );
    assert!(
        error.contains("switching the policy to cell gap=4") && error.contains("put back"),
        "{error}"
    );
    let state = state.lock().unwrap();
    assert_eq!(state.puts.last(), Some(&original_policy()));
    assert_eq!(state.policy, original_policy());
}

#[tokio::test]
async fn an_interruption_stops_the_runs_and_restores_the_policy() {
    let worker = sim_worker().await;
    let (control, state) = fake_control(&worker, None).await;
    let config = config(&worker, control, "strict,gap=1", 3);
    let cancel = CancellationToken::new();
    let mut runs = 0;
    // Interrupted as soon as the first run has finished: the second is cut short.
    let error = run_ab(&config, &cancel, |_| {
        runs += 1;
        cancel.cancel();
    })
    .await
    .unwrap_err();
    assert_eq!(runs, 1);
    let error = format!("{error:#}");
    assert!(error.contains("interrupted during run 2 of 6"), "{error}");
    let state = state.lock().unwrap();
    assert_eq!(state.puts.last(), Some(&original_policy()));
    assert_eq!(state.policy, original_policy());
}

#[tokio::test]
async fn an_unreachable_control_plane_fails_before_any_storm() {
    let worker = sim_worker().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let control = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    drop(listener);
    let config = config(&worker, control, "strict,gap=1", 1);
    let error = format!(
        "{:#}",
        run_ab(&config, &CancellationToken::new(), |_| {})
            .await
            .unwrap_err()
    );
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
    let (control_a, state_a) = fake_control(&workers[0], None).await;
    let (control_b, state_b) = fake_control(&workers[0], None).await;
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
        seed_given: true,
        control: control_a,
        replica_controls: vec![control_b],
        control_token: None,
        cells: parse_cells("gap=2:load=worker_metrics,gap=2").unwrap(),
        reps: 1,
    };
    let report = run_ab(&config, &CancellationToken::new(), |_| {})
        .await
        .unwrap();
    assert_eq!(report.replicas, 2);
    assert!(report.to_string().contains("2 gateway replicas"));
    let sent: Vec<u64> = workers.iter().map(|w| w.stats().requests_total).collect();
    assert_eq!(sent, vec![8, 8], "16 requests, one each in turn");
    // Both cells, then the restore, on each replica.
    let calls = state_a.lock().unwrap().puts.clone();
    assert_eq!(calls, state_b.lock().unwrap().puts);
    let sources: Vec<&Value> = calls.iter().map(|c| &c["load_source"]).collect();
    assert_eq!(
        sources,
        [&json!("worker_metrics"), &json!("local"), &json!("local")]
    );
    assert_eq!(calls.last(), Some(&original_policy()));
    assert!(report.meta.policy_restored);
    assert_eq!(report.meta.gateway.split(',').count(), 2);
    assert_eq!(report.meta.control.split(',').count(), 2);
    for run in &report.runs {
        assert_eq!(run.report.shape.replicas, 2);
        assert!(run.report.drain.as_ref().unwrap().all_zero);
    }
}

/// Admission cells send every admission field under `admission` with the TOML names, beside the
/// policy fields (none here: the comparison runs under the policy in force), and the restore puts
/// back the admission settings the gateway reported before the first run.
#[tokio::test]
async fn admission_cells_put_their_settings_and_the_ones_found_are_restored() {
    let worker = sim_worker().await;
    let (control, state) = fake_control(&worker, None).await;
    let found = json!({"max_in_flight_per_worker": 8, "queue_timeout_ms": 100, "max_queued": 64,
        "retry_after_ms": 2000, "max_waiting": 0, "max_kv_usage": 0.0});
    state.lock().unwrap().policy["admission"] = found.clone();
    let mut config = config(
        &worker,
        control,
        "admission=off,max_in_flight_per_worker=4:queue_timeout_ms=500",
        1,
    );
    config.storm.slo_ttft = Some(std::time::Duration::from_secs(30));
    let report = run_ab(&config, &CancellationToken::new(), |_| {})
        .await
        .unwrap();
    assert!(report.meta.policy_restored);
    let puts = state.lock().unwrap().puts.clone();
    assert_eq!(puts.len(), 3, "{puts:?}");
    assert_eq!(
        puts[0],
        json!({"admission": {"max_in_flight_per_worker": 0, "queue_timeout_ms": 0,
            "max_queued": 1024, "retry_after_ms": 1000, "max_waiting": 0, "max_kv_usage": 0.0}})
    );
    assert_eq!(
        puts[1],
        json!({"admission": {"max_in_flight_per_worker": 4, "queue_timeout_ms": 500,
            "max_queued": 1024, "retry_after_ms": 1000, "max_waiting": 0, "max_kv_usage": 0.0}})
    );
    // The restore: the policy found, and its admission settings.
    assert_eq!(puts[2]["admission"], found);
    assert_eq!(puts[2]["kind"], "bounded_consistent_hashing");
    assert_eq!(
        report.cells[1].admission.unwrap().max_in_flight_per_worker,
        4
    );
    // The stub sheds nothing; with a TTFT objective each cell has its goodput, and the table
    // its overload lines.
    assert!(report.cells.iter().all(|c| c.shed == 0 && c.unclean == 0));
    assert!(report.cells.iter().all(|c| c.goodput_rps.unwrap() > 0.0));
    let text = report.to_string();
    assert!(text.contains("goodput/s     shed  unclean"), "{text}");
}
