//! A fleet of real HTTP workers that record every request to one path (the load scraper's
//! `/metrics`, the prober's `/health`): how many are in flight now and at most, and when each
//! worker was asked; every other path answers `ok` at once. What the scraper's and the prober's
//! pacing tests both count.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::{any, get};
use gatewayd::config::{Config, WorkerConfig};
use tokio::time::Instant;

/// What every worker of one test has seen, shared: requests to the counted path in flight now and
/// at most, and when each worker was asked.
#[derive(Default)]
pub struct Fleet {
    pub in_flight: AtomicUsize,
    pub most_in_flight: AtomicUsize,
    /// `(worker index, when its request arrived)`, in arrival order.
    pub calls: Mutex<Vec<(usize, Instant)>>,
}

/// One worker's view: its index in the fleet, what it answers on the counted path and after how
/// long.
struct Worker {
    index: usize,
    body: &'static str,
    answer_after: Duration,
    fleet: Arc<Fleet>,
}

/// One request in flight at a worker, counted out when dropped.
struct InFlight(Arc<Fleet>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn counted(State(worker): State<Arc<Worker>>) -> &'static str {
    let fleet = &worker.fleet;
    let now = fleet.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    // Counted out when the answer is sent or the gateway gives up on it, whichever comes first.
    let _in_flight = InFlight(Arc::clone(fleet));
    fleet.most_in_flight.fetch_max(now, Ordering::SeqCst);
    fleet
        .calls
        .lock()
        .unwrap()
        .push((worker.index, Instant::now()));
    // A slow engine: the request stays in flight, so concurrent ones overlap.
    tokio::time::sleep(worker.answer_after).await;
    worker.body
}

/// Starts `count` workers on `127.0.0.1:0`, answering `path` with `body` after `answer_after`
/// and anything else at once.
pub async fn start_fleet(
    count: usize,
    path: &'static str,
    body: &'static str,
    answer_after: Duration,
) -> (Vec<SocketAddr>, Arc<Fleet>) {
    let fleet = Arc::new(Fleet::default());
    let mut addrs = Vec::new();
    for index in 0..count {
        let worker = Arc::new(Worker {
            index,
            body,
            answer_after,
            fleet: Arc::clone(&fleet),
        });
        let app = axum::Router::new()
            .route(path, get(counted))
            .fallback(any(|| async { "ok" }))
            .with_state(worker);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }
    (addrs, fleet)
}

/// A gateway configuration with the workers at `addrs`, named `w0`, `w1`, ...
pub fn config(addrs: &[SocketAddr]) -> Config {
    let mut config = Config::default();
    config.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
    config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
    config.workers = addrs
        .iter()
        .enumerate()
        .map(|(index, addr)| WorkerConfig {
            name: Some(format!("w{index}")),
            ..WorkerConfig::from_url(&format!("http://{addr}"))
        })
        .collect();
    config
}

/// Waits (bounded) until every one of `count` workers has been asked `rounds` times since
/// `since` (`None`: since the fleet started); answers the requests since then.
pub async fn wait_rounds(
    fleet: &Fleet,
    count: usize,
    rounds: usize,
    since: Option<Instant>,
) -> Vec<(usize, Instant)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut calls = fleet.calls.lock().unwrap().clone();
        calls.retain(|(_, at)| since.is_none_or(|since| *at >= since));
        let mut per_worker = vec![0; count];
        for (index, _) in &calls {
            per_worker[*index] += 1;
        }
        if per_worker.iter().all(|n| *n >= rounds) {
            return calls;
        }
        assert!(
            Instant::now() < deadline,
            "requests per worker: {per_worker:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The times between consecutive requests to `worker` among `calls`.
pub fn gaps(calls: &[(usize, Instant)], worker: usize) -> Vec<Duration> {
    let times: Vec<Instant> = calls
        .iter()
        .filter(|(i, _)| *i == worker)
        .map(|(_, t)| *t)
        .collect();
    times.windows(2).map(|pair| pair[1] - pair[0]).collect()
}
