//! The fleet-wide load scraper: while `[load] source` is `worker_metrics`, every
//! `scrape_interval_ms` it reads each worker's Prometheus text and publishes the reported load
//! into the worker's sample cell, which the routing decision reads without a lock
//! (docs/replicas.md).
//!
//! Off the request path in every way: one task, its own HTTP client, each scrape bounded by a
//! timeout below the interval and a body cap. Routing never waits for it; a worker whose scrapes
//! fail keeps its last good sample until it is `stale_after_ms` old and then falls back to local
//! load. Each change of a worker's scrape state is logged once, and counted in `/metrics`.
//!
//! Files: `gauges` (the recognised engines and the text), `scrape` (one HTTP scrape and its
//! failures), `status` (per-worker history and counters).

mod gauges;
mod scrape;
mod status;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bch_core::fleet_load::{FleetSample, LoadSource};
use bch_core::router::{Router, Worker};
use futures_util::future::join_all;
use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use scrape::Failure;
pub use status::ScrapeStats;

use crate::config::{Config, SharedConfig};
use status::{Change, Track};

/// The metrics URI of each worker of `config`, by URL; `None` when URL and path make no URI.
fn targets(config: &Config) -> HashMap<String, Option<Uri>> {
    let Ok(members) = config.members() else {
        // The configuration in force was validated when it was put in force.
        return HashMap::new();
    };
    members
        .into_iter()
        .map(|member| {
            let path = member
                .metrics_path
                .as_deref()
                .unwrap_or(&config.load.metrics_path);
            let uri = path
                .parse()
                .ok()
                .and_then(|path| member.url.join(Some(&path)).ok());
            (member.spec.url, uri)
        })
        .collect()
}

/// The scraper's own state, kept between rounds.
struct Scraper {
    router: Arc<Router>,
    config: SharedConfig,
    stats: Arc<ScrapeStats>,
    client: scrape::ScrapeClient,
    built_for: Option<Arc<Config>>,
    targets: HashMap<String, Option<Uri>>,
    tracks: HashMap<String, Track>,
    scraping: bool,
}

/// Runs the scraper until `shutdown`, with the settings of the configuration in force (re-read
/// every round, so a `load_source` switch or a reload takes effect within one interval).
pub async fn run(
    router: Arc<Router>,
    config: SharedConfig,
    stats: Arc<ScrapeStats>,
    shutdown: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let mut scraper = Scraper {
        router,
        config,
        stats,
        client: Client::builder(TokioExecutor::new()).build(connector),
        built_for: None,
        targets: HashMap::new(),
        tracks: HashMap::new(),
        scraping: false,
    };
    loop {
        let started = Instant::now();
        let interval = scraper.round().await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(started + interval) => {}
        }
    }
}

impl Scraper {
    /// One round: scrape every worker (or stop scraping in `local` mode); answers the interval
    /// until the next.
    async fn round(&mut self) -> Duration {
        let current = self.config.load_full();
        let interval = Duration::from_millis(current.load.scrape_interval_ms);
        if current.load.source != LoadSource::WorkerMetrics {
            self.stop();
            return interval;
        }
        if !self.scraping {
            tracing::info!(
                interval_ms = current.load.scrape_interval_ms,
                "load source worker_metrics: scraping every worker's metrics"
            );
            self.scraping = true;
        }
        if !self
            .built_for
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &current))
        {
            self.targets = targets(&current);
            self.built_for = Some(Arc::clone(&current));
        }
        let table = self.router.table();
        let sent_at = Instant::now();
        let results = self.scrape_all(table.workers(), &current).await;
        let stale_after = Duration::from_millis(current.load.stale_after_ms);
        let now = Instant::now();
        for (worker, result) in table.workers().iter().zip(&results) {
            self.observe(worker, sent_at, *result, &current);
            let track = self.tracks.entry(worker.spec.url.clone()).or_default();
            if track.went_stale(now, stale_after) {
                worker.stats.fleet_sample().mark_stale();
                tracing::warn!(worker = %worker.spec.name, stale_after_ms = current.load.stale_after_ms, "no good load scrape for stale_after_ms: routing on local load for this worker");
            }
        }
        let outcomes = table
            .workers()
            .iter()
            .zip(&results)
            .map(|(w, r)| (w.spec.url.as_str(), r.map(|_| ())));
        self.stats.record_round(outcomes, |url| {
            table.workers().iter().any(|w| w.spec.url == url)
        });
        self.tracks
            .retain(|url, _| table.workers().iter().any(|w| &w.spec.url == url));
        interval
    }

    /// Scrapes every worker at once; each result is the reported load and this replica's
    /// in-flight count on the worker when its scrape was sent.
    async fn scrape_all(
        &self,
        workers: &[Worker],
        config: &Config,
    ) -> Vec<Result<FleetSample, Failure>> {
        let timeout = config.load.scrape_timeout();
        let max_bytes = config.load.max_scrape_bytes;
        let custom = config.load.custom_gauges();
        let scrapes = workers.iter().map(|worker| {
            let uri = self.targets.get(&worker.spec.url).and_then(Option::as_ref);
            async move {
                let local_at_scrape = worker.stats.active();
                let reading = scrape::scrape(&self.client, uri, timeout, max_bytes, custom).await?;
                Ok(FleetSample {
                    reported: reading.load,
                    local_at_scrape,
                })
            }
        });
        join_all(scrapes).await
    }

    /// Publishes a good sample and logs a change of the worker's scrape state.
    fn observe(
        &mut self,
        worker: &Worker,
        sent_at: Instant,
        result: Result<FleetSample, Failure>,
        config: &Config,
    ) {
        if let Ok(sample) = result {
            let wall_ms =
                crate::clock::now_ms().saturating_sub(sent_at.elapsed().as_millis() as u64);
            worker.stats.fleet_sample().publish(sample, wall_ms);
        }
        let track = self.tracks.entry(worker.spec.url.clone()).or_default();
        let never_good = track.never_good();
        for change in track.observe(sent_at, result.map(|_| ())) {
            let name = &worker.spec.name;
            match change {
                Change::Failing(failure) if never_good => {
                    tracing::warn!(worker = %name, reason = %failure.reason(), error = %failure, "load scrape failed: routing on local load for this worker");
                }
                Change::Failing(failure) => {
                    tracing::warn!(worker = %name, reason = %failure.reason(), error = %failure, stale_after_ms = config.load.stale_after_ms, "load scrape failed: keeping the last good sample until it is stale");
                }
                Change::Recovered => tracing::info!(worker = %name, "load scrape works again"),
                Change::UsingSample => {
                    tracing::debug!(worker = %name, "routing on the worker's reported load");
                }
            }
        }
    }

    /// `local` mode: no scraping, and no sample left for the rule to read if the source comes
    /// back (it starts from fresh scrapes).
    fn stop(&mut self) {
        if !self.scraping {
            return;
        }
        self.scraping = false;
        for worker in self.router.table().workers() {
            worker.stats.fleet_sample().clear();
        }
        self.tracks.clear();
        tracing::info!("load source local: scraping stopped");
    }
}
