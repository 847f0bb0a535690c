//! The load scraper at fleet scale, against real HTTP workers that record every scrape: no more
//! than `[load] max_concurrent_scrapes` scrapes are ever in flight at once, and a fleet too large
//! to scrape every `scrape_interval_ms` under `max_scrapes_per_second` is scraped in longer
//! rounds, its scrapes spread over the round, with every worker's sample kept fresh (never read as
//! stale) within the documented bound.

use crate::common;
use crate::counting_fleet::{self, Fleet};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bch_core::fleet_load::LoadSource;
use gatewayd::RunningGateway;
use gatewayd::config::Config;
use tokio::time::Instant;

/// The metrics text every worker answers.
const METRICS: &str = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\nvllm:num_requests_waiting 0\n";

/// Starts `count` workers answering scrapes after `answer_after` and anything else (health
/// probes) at once.
async fn start_fleet(count: usize, answer_after: Duration) -> (Vec<SocketAddr>, Arc<Fleet>) {
    counting_fleet::start_fleet(count, "/metrics", METRICS, answer_after).await
}

fn config(addrs: &[SocketAddr]) -> Config {
    let mut config = counting_fleet::config(addrs);
    config.load.source = LoadSource::WorkerMetrics;
    config
}

/// Waits (bounded) until every one of `count` workers has been scraped `rounds` times; answers
/// the scrapes seen so far.
async fn wait_rounds(fleet: &Fleet, count: usize, rounds: usize) -> Vec<(usize, Instant)> {
    counting_fleet::wait_rounds(fleet, count, rounds, None).await
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
        let scrapes = fleet.calls.lock().unwrap().clone();
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
        for gap in counting_fleet::gaps(&scrapes, worker) {
            assert!(gap <= stale_after, "w{worker}: {gap:?} between two scrapes");
        }
    }
    gateway.shutdown().await;
}
