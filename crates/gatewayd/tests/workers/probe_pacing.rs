//! The health prober at fleet scale, against real HTTP workers that record every probe: no more
//! than `[health] max_concurrent_probes` probes are ever in flight at once, a round's probes are
//! spread over `interval_ms` instead of sent in one burst, and every worker is still probed once
//! per interval.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::{any, get};
use gatewayd::config::{Config, WorkerConfig};
use tokio::time::Instant;

/// What every worker of the test has seen, shared: probes in flight now and at most, and when
/// each worker was probed.
#[derive(Default)]
struct Fleet {
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// `(worker index, when its probe arrived)`, in arrival order.
    probes: Mutex<Vec<(usize, Instant)>>,
}

/// One worker's view: its index in the fleet, and how long it takes to answer a probe.
struct Worker {
    index: usize,
    answer_after: Duration,
    fleet: Arc<Fleet>,
}

/// One probe in flight at a worker, counted out when dropped.
struct InFlight(Arc<Fleet>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn health(State(worker): State<Arc<Worker>>) -> &'static str {
    let fleet = &worker.fleet;
    let now = fleet.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    // Counted out when the answer is sent or the gateway gives up on it, whichever comes first.
    let _in_flight = InFlight(Arc::clone(fleet));
    fleet.most_in_flight.fetch_max(now, Ordering::SeqCst);
    fleet
        .probes
        .lock()
        .unwrap()
        .push((worker.index, Instant::now()));
    // A slow engine: the probe stays in flight, so concurrent probes overlap.
    tokio::time::sleep(worker.answer_after).await;
    "ok"
}

/// Starts `count` workers on `127.0.0.1:0`, answering probes after `answer_after` and anything
/// else at once.
async fn start_fleet(count: usize, answer_after: Duration) -> (Vec<SocketAddr>, Arc<Fleet>) {
    let fleet = Arc::new(Fleet::default());
    let mut addrs = Vec::new();
    for index in 0..count {
        let worker = Arc::new(Worker {
            index,
            answer_after,
            fleet: Arc::clone(&fleet),
        });
        let app = axum::Router::new()
            .route("/health", get(health))
            .fallback(any(|| async { "ok" }))
            .with_state(worker);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }
    (addrs, fleet)
}

fn config(addrs: &[SocketAddr]) -> Config {
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

/// Waits (bounded) until every one of `count` workers has been probed `rounds` times since
/// `since`; answers the probes since then.
async fn wait_rounds(
    fleet: &Fleet,
    count: usize,
    rounds: usize,
    since: Instant,
) -> Vec<(usize, Instant)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut probes = fleet.probes.lock().unwrap().clone();
        probes.retain(|(_, at)| *at >= since);
        let mut per_worker = vec![0; count];
        for (index, _) in &probes {
            per_worker[*index] += 1;
        }
        if per_worker.iter().all(|n| *n >= rounds) {
            return probes;
        }
        assert!(
            Instant::now() < deadline,
            "probes per worker: {per_worker:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn probes_are_capped_and_spread_over_the_interval_and_each_worker_is_probed_every_interval() {
    const WORKERS: usize = 200;
    let interval = Duration::from_millis(1_000);
    let (addrs, fleet) = start_fleet(WORKERS, Duration::from_millis(20)).await;
    let mut config = config(&addrs);
    config.health.interval = interval;
    config.health.timeout = Duration::from_millis(900);
    config.health.max_concurrent_probes = 8;
    let gateway = common::start(config).await;
    // The first probes of the 200 workers present at start go at once (so waiting for the first
    // probe stays quick), but never more than 8 at a time.
    gateway.first_probes_applied().await;
    // The periodic probes that came due while the first ones (200 of 20 ms, 8 at a time: some
    // 500 ms) held every slot waited, and came late; from here on they come on time.
    let settled = Instant::now();
    let probes = wait_rounds(&fleet, WORKERS, 3, settled).await;
    let most = fleet.most_in_flight.load(Ordering::SeqCst);
    assert!(most <= 8, "{most} probes in flight at once, the cap is 8");
    assert_eq!(most, 8, "the first probes reached the cap");

    // Spread: the probes of a round come at offsets of the interval stable per worker, about 20
    // per 100 ms, not all 200 within a few milliseconds. Half the fleet in one 100 ms window is
    // asserted against, as timers on a loaded machine fire late and in clumps.
    let periodic: Vec<Instant> = probes.iter().map(|(_, at)| *at).collect();
    for (at, start) in periodic.iter().enumerate() {
        let within = periodic[at..]
            .iter()
            .take_while(|t| **t - *start < Duration::from_millis(100))
            .count();
        assert!(
            within <= WORKERS / 2,
            "{within} periodic probes within 100 ms of probe {at}: a burst, not a spread"
        );
    }
    // Each worker still probed once per interval: its probes are about one interval apart (half
    // an interval either side for a loaded machine).
    for worker in 0..WORKERS {
        let times: Vec<Instant> = probes
            .iter()
            .filter(|(i, _)| *i == worker)
            .map(|(_, t)| *t)
            .collect();
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= interval / 2 && gap <= interval * 3 / 2,
                "w{worker}: {gap:?} between two probes, the interval is {interval:?}"
            );
        }
    }
    gateway.shutdown().await;
}
