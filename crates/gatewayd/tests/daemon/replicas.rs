//! Three real `gatewayd` processes in front of two slow simulated workers, as a fleet behind an L4
//! balancer runs them (docs/replicas.md): eight requests with one routing key, one at a time,
//! 300 ms apart, round-robin over the replicas, all held open. With `local` load each replica
//! sees at most three of them and none spills (8:0); with `worker_metrics` the replicas see each
//! other's requests through the workers' gauges and place them as one gateway does (6:2). Then
//! the requests end three ways — read to the end, aborted by the client, and cut by killing their
//! replica — and every counter returns to 0.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bch_drill::sim::SimConfig;
use bch_drill::worker::{WorkerHandle, spawn_worker};
use serde_json::{Value, json};
use tokio::time::Instant;

const KEY: &str = "fleet-session";
const REPLICAS: usize = 3;
const REQUESTS: usize = 8;

/// A running `gatewayd`; killed on drop.
pub(crate) struct Replica {
    child: Child,
    /// Its data plane's `host:port`.
    pub(crate) data: String,
    /// Its control plane's `host:port`.
    pub(crate) control: String,
    _config: tempfile::TempDir,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    fn start(workers: &[WorkerHandle], source: &str) -> Replica {
        Replica::start_with(workers, source, 100, "")
    }

    /// Starts a replica over `workers` with load source `source`, scraping every
    /// `scrape_interval_ms`, with `extra` (whole TOML tables) appended to its configuration.
    pub(crate) fn start_with(
        workers: &[WorkerHandle],
        source: &str,
        scrape_interval_ms: u64,
        extra: &str,
    ) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gatewayd.toml");
        let mut text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ncontrol_listen = \"127.0.0.1:0\"\n\
             [policy]\nkind = \"bounded_consistent_hashing\"\nmin_load_gap = 2\nmax_load_skew = 1.5\n\
             [load]\nsource = \"{source}\"\nscrape_interval_ms = {scrape_interval_ms}\nstale_after_ms = 500\n\
             [log]\nlevel = \"warn\"\n{extra}"
        );
        for w in workers {
            text.push_str(&format!(
                "[[workers]]\nname = \"{}\"\nurl = \"{}\"\n",
                w.name(),
                w.url()
            ));
        }
        std::fs::write(&path, text).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gatewayd"))
            .args(["--config", path.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        // Keep draining stderr for the process's whole life, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let banner = rx
            .iter()
            .find(|l| l.starts_with("gatewayd: data plane"))
            .expect("gatewayd prints where it listens");
        let after = |label: &str| {
            let rest = banner.split(label).nth(1).unwrap();
            rest.split("http://")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .to_owned()
        };
        Replica {
            data: after("data plane"),
            control: after("control plane"),
            child,
            _config: dir,
        }
    }

    /// The JSON answer of `GET path` on its control plane.
    pub(crate) async fn get(&self, path: &str) -> Value {
        bch_drill::tls::get(format!("http://{}{path}", self.control))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Sum over the workers of the load the rule reads right now for `KEY`.
    async fn seen(&self) -> u64 {
        let explain = self.get(&format!("/admin/explain?routing_key={KEY}")).await;
        explain["fleet_loads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["used"].as_u64().unwrap())
            .sum()
    }

    /// Sends one streamed request; returns once the headers are in, the stream held open.
    async fn send(&self, client: &reqwest::Client, i: usize) -> reqwest::Response {
        let response = client
            .post(format!("http://{}/v1/chat/completions", self.data))
            .header("x-smg-routing-key", KEY)
            .json(&json!({
                "messages": [{"role": "user", "content": format!("request {i}")}],
                "max_tokens": 100,
                "stream": true,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response
    }
}

/// Two workers slow enough that a stream stays open for about 5 s (100 tokens, 50 ms a step).
async fn slow_workers() -> Vec<WorkerHandle> {
    let config = SimConfig {
        decode_step_base_ms: 50.0,
        decode_step_per_running_ms: 0.0,
        ..SimConfig::default()
    };
    let mut workers = Vec::new();
    for i in 0..2 {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        workers.push(
            spawn_worker(addr, format!("w{i}"), config.clone())
                .await
                .unwrap(),
        );
    }
    workers
}

/// Places the eight requests and answers where they landed, with their responses.
async fn place(
    replicas: &[Replica],
    wait_for_scrapes: bool,
) -> (BTreeMap<String, usize>, Vec<(usize, reqwest::Response)>) {
    let client = bch_drill::tls::http_client().build().unwrap();
    let mut held = Vec::new();
    let mut landed = BTreeMap::new();
    for i in 0..REQUESTS {
        let replica = &replicas[i % REPLICAS];
        if i > 0 {
            // The scenario's spacing: longer than a scrape interval.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        if wait_for_scrapes {
            // On a loaded machine a scrape can come late: wait (bounded) until this replica's
            // rule sees every request already open, whichever replica sent it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while replica.seen().await < i as u64 {
                assert!(
                    Instant::now() < deadline,
                    "replica never saw {i} open requests"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let response = replica.send(&client, i).await;
        let worker = response.headers()["x-bch-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        *landed.entry(worker).or_insert(0) += 1;
        held.push((i, response));
    }
    (landed, held)
}

/// Ends the requests three ways: replica 0's are read to the end, replica 1's are dropped by the
/// client, replica 2 is killed while its streams run. Then waits until every counter is 0.
async fn end_and_drain(
    mut replicas: Vec<Replica>,
    held: Vec<(usize, reqwest::Response)>,
    workers: &[WorkerHandle],
) {
    let mut read = Vec::new();
    let mut aborted = Vec::new();
    for (i, response) in held {
        match i % REPLICAS {
            0 => read.push(response),
            1 => aborted.push(response),
            _ => {} // dropped with their replica below
        }
    }
    let killed = replicas.pop().unwrap();
    drop(killed);
    drop(aborted);
    for response in read {
        let body = response.text().await.unwrap();
        assert!(body.contains("[DONE]"), "a read stream ends normally");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sims: Vec<(u64, u64)> = workers
            .iter()
            .map(|w| (w.stats().running, w.stats().waiting))
            .collect();
        let mut records = Vec::new();
        for replica in &replicas {
            records.extend(
                replica.get("/admin/workers").await["workers"]
                    .as_array()
                    .unwrap()
                    .clone(),
            );
        }
        let zero = |r: &Value, field: &str| r.get(field).is_none_or(|v| v == 0);
        let idle = sims.iter().all(|s| *s == (0, 0))
            && records
                .iter()
                .all(|r| zero(r, "active") && zero(r, "load") && zero(r, "reported_load"));
        if idle {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not idle: workers {sims:?}, records {records:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_replicas_each_see_a_third_and_never_spill() {
    let workers = slow_workers().await;
    let replicas: Vec<Replica> = (0..REPLICAS)
        .map(|_| Replica::start(&workers, "local"))
        .collect();
    let (landed, held) = place(&replicas, false).await;
    assert_eq!(
        landed.values().copied().collect::<Vec<_>>(),
        vec![8],
        "{landed:?}"
    );
    end_and_drain(replicas, held, &workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_metrics_replicas_place_like_one_gateway() {
    let workers = slow_workers().await;
    let replicas: Vec<Replica> = (0..REPLICAS)
        .map(|_| Replica::start(&workers, "worker_metrics"))
        .collect();
    let (landed, held) = place(&replicas, true).await;
    let mut split: Vec<usize> = landed.values().copied().collect();
    split.sort_unstable();
    assert_eq!(split, vec![2, 6], "{landed:?}");
    // The last replica's view says which signal decided and shows both numbers.
    let explain = replicas[1]
        .get(&format!("/admin/explain?routing_key={KEY}"))
        .await;
    assert_eq!(explain["load_signal"], "worker_metrics", "{explain:#}");
    let locals: u64 = explain["fleet_loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["local"].as_u64().unwrap())
        .sum();
    assert_eq!(locals, 3, "replica 1 sent three of the eight: {explain:#}");
    end_and_drain(replicas, held, &workers).await;
}
