//! The load scraper at fleet scale, against real HTTP workers that record every scrape: no more
//! than `[load] max_concurrent_scrapes` scrapes are ever in flight at once, and a fleet too large
//! to scrape every `scrape_interval_ms` under `max_scrapes_per_second` is scraped in longer
//! rounds, its scrapes spread over the round, with every worker's sample kept fresh (never read as
//! stale) within the documented bound.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::{any, get};
use bch_core::fleet_load::LoadSource;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use tokio::time::Instant;

/// What every worker of one test has seen, shared: scrapes in flight now and at most, and when
/// each worker was scraped.
#[derive(Default)]
struct Fleet {
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// `(worker index, when its scrape arrived)`, in arrival order.
    scrapes: Mutex<Vec<(usize, Instant)>>,
}

/// One worker's view: its index in the fleet, and how long it takes to answer a scrape.
struct Worker {
    index: usize,
    answer_after: Duration,
    fleet: Arc<Fleet>,
}

/// One scrape in flight at a worker, counted out when dropped.
struct InFlight(Arc<Fleet>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn metrics(State(worker): State<Arc<Worker>>) -> String {
    let fleet = &worker.fleet;
    let now = fleet.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    // Counted out when the answer is sent or the gateway gives up on it, whichever comes first.
    let _in_flight = InFlight(Arc::clone(fleet));
    fleet.most_in_flight.fetch_max(now, Ordering::SeqCst);
    fleet
        .scrapes
        .lock()
        .unwrap()
        .push((worker.index, Instant::now()));
    // A slow engine: the scrape stays in flight, so concurrent scrapes overlap.
    tokio::time::sleep(worker.answer_after).await;
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
        .to_owned()
}

/// Starts `count` workers on `127.0.0.1:0`, answering scrapes after `answer_after` and anything
/// else (health probes) at once.
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
            .route("/metrics", get(metrics))
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
    config.load.source = LoadSource::WorkerMetrics;
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

/// Waits (bounded) until every one of `count` workers has been scraped `rounds` times; answers
/// the scrapes seen so far.
async fn wait_rounds(fleet: &Fleet, count: usize, rounds: usize) -> Vec<(usize, Instant)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let scrapes = fleet.scrapes.lock().unwrap().clone();
        let mut per_worker = vec![0; count];
        for (index, _) in &scrapes {
            per_worker[*index] += 1;
        }
        if per_worker.iter().all(|n| *n >= rounds) {
            return scrapes;
        }
        assert!(
            Instant::now() < deadline,
            "scrapes per worker: {per_worker:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `bch_worker_load_stale` lines of the gateway's `/metrics` that say a worker is stale.
fn stale_workers(gateway: &RunningGateway) -> Vec<String> {
    gateway
        .metrics_text()
        .lines()
        .filter(|l| l.starts_with("bch_worker_load_stale{") && !l.ends_with(" 0"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn never_more_scrapes_in_flight_than_max_concurrent_scrapes() {
    let (addrs, fleet) = start_fleet(24, Duration::from_millis(30)).await;
    let mut config = config(&addrs);
    config.load.scrape_interval = Duration::from_millis(400);
    config.load.stale_after = Duration::from_millis(5_000);
    config.load.max_concurrent_scrapes = 3;
    let gateway = common::start(config).await;
    // Without the cap, 24 starts within 80 ms of scrapes that take 30 ms overlap far beyond 3;
    // a scrape times out 320 ms after it is sent, whatever it waited for a permit.
    wait_rounds(&fleet, addrs.len(), 3).await;
    let most = fleet.most_in_flight.load(Ordering::SeqCst);
    assert_eq!(
        most, 3,
        "at most 3 scrapes in flight, and the cap was reached"
    );
    let metrics = gateway.metrics_text();
    let failures: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("bch_load_scrape_failures_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(
        failures, 0,
        "a scrape waiting for a permit does not time out: {metrics}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_fleet_paced_below_its_interval_is_spread_and_stays_fresh() {
    const WORKERS: usize = 20;
    let (addrs, fleet) = start_fleet(WORKERS, Duration::ZERO).await;
    let mut config = config(&addrs);
    config.load.scrape_interval = Duration::from_millis(50);
    config.load.stale_after = Duration::from_millis(150);
    config.load.max_scrapes_per_second = 40;
    // 20 workers at 40 scrapes/s: starts spread over 500 ms, a round of 540 ms (500 ms plus one
    // timeout of 40 ms), far longer than stale_after_ms; the limit grows with it, to 640 ms.
    let period = config.load.round_period(WORKERS);
    assert_eq!(period, Duration::from_millis(540));
    assert_eq!(
        config.load.spread_window(WORKERS),
        Duration::from_millis(500)
    );
    let stale_after = config.load.stale_after_for(WORKERS);
    assert_eq!(stale_after, Duration::from_millis(640));
    let gateway = common::start(config).await;

    // Every worker starts stale (no sample yet) until its first scrape's round is over.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stale_workers(&gateway).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", stale_workers(&gateway));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Then read as stale at no point of four rounds, though each worker is scraped only every
    // 540 ms.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stale = stale_workers(&gateway);
        assert!(stale.is_empty(), "stale: {stale:?}");
        let scrapes = fleet.scrapes.lock().unwrap().clone();
        let least = (0..WORKERS)
            .map(|w| scrapes.iter().filter(|(i, _)| *i == w).count())
            .min()
            .unwrap();
        if least >= 4 {
            break;
        }
        assert!(Instant::now() < deadline, "{least} rounds within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let scrapes = wait_rounds(&fleet, WORKERS, 4).await;

    // Spread: the first round's 20 scrapes start over the window (the last 475 ms after the
    // first), not at once; half of it is asserted, as timers on a loaded machine fire late.
    let first = &scrapes[..WORKERS];
    let span = first.last().unwrap().1 - first[0].1;
    assert!(
        span >= Duration::from_millis(250),
        "first round spans {span:?}"
    );
    // Paced: no more than 40 scrapes in any second (a second holds at most two rounds' worth of
    // starts at 25 ms apart, plus one at its edge).
    for (at, (_, start)) in scrapes.iter().enumerate() {
        let within = scrapes[at..]
            .iter()
            .take_while(|(_, t)| *t - *start < Duration::from_secs(1))
            .count();
        assert!(
            within <= 41,
            "{within} scrapes within a second from scrape {at}"
        );
    }
    // Fresh: each worker's consecutive scrapes are at most the staleness limit apart.
    for worker in 0..WORKERS {
        let times: Vec<Instant> = scrapes
            .iter()
            .filter(|(i, _)| *i == worker)
            .map(|(_, t)| *t)
            .collect();
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap <= stale_after, "w{worker}: {gap:?} between two scrapes");
        }
    }
    gateway.shutdown().await;
}
