//! The fleet-wide load scraper: while `[load] source` is `worker_metrics`, once a round it reads
//! each worker's Prometheus text and publishes the reported load
//! into the worker's sample cell, which the routing decision reads without a lock
//! (docs/replicas.md). It also publishes what the engine says of its saturation (waiting
//! requests, KV-cache usage) into the worker's engine cell, which the capacity rule compares with
//! `[admission] max_waiting` and `max_kv_usage`; while either is set it scrapes under `local` too,
//! for the engine report alone.
//!
//! A round is `scrape_interval_ms`, or longer for a fleet too large to scrape that often under
//! `max_scrapes_per_second`; its scrapes start evenly spread over it, at most
//! `max_concurrent_scrapes` in flight, and the staleness limit grows with the round, so a fleet
//! of 10,000 costs what the cap allows, not 100,000 scrapes a second.
//!
//! Off the request path in every way: its own thread with a single-threaded runtime (scrapes
//! never take a data-plane worker thread from a request), its own HTTP connections, each scrape
//! bounded by a timeout below the interval and each body by a cap.
//! Routing never waits for it; a worker whose scrapes fail keeps its last good sample and engine
//! report until they are `stale_after_ms` old, then falls back to local load and forgets the
//! report (a worker is never held full by a report nobody renews). Each change of a worker's scrape state is logged once, and counted in `/metrics`.
//!
//! Files: `gauges` (the recognised engines and the text), `scrape` (one HTTP scrape and its
//! failures), `status` (per-worker history and counters), `collector` (the scraper's families on
//! `/metrics`, registered by [`ScrapeStats::register`]).

mod collector;
mod gauges;
mod scrape;
mod status;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bch_core::fleet_load::{FleetSample, LoadSource};
use bch_core::policy::PolicySettings;
use bch_core::router::{Router, Worker};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use http::Uri;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use scrape::Failure;
pub use status::ScrapeStats;

use crate::config::{Config, Member, SharedConfig, SharedMembers};
use crate::log_limit::{Component, LimitedLog, LineBudget, SuppressedLines};
use crate::metrics::LabelValue;
use crate::per_worker::{Check, TableKeys, Targets, WorkerKey};
use crate::upstream::WorkerTls;
use gauges::Reading;
use status::{Change, EngineReading, Track};

/// The scrape check: a worker's metrics path (its own, else `[load] metrics_path`) on its URL.
struct Scrape;

impl Check for Scrape {
    /// `None` when URL and path make no `http://` or `https://` URI (the scrape fails as
    /// `bad_uri`).
    type Target = Option<scrape::Target>;

    fn path<'a>(config: &'a Config, member: &'a Member) -> &'a str {
        member
            .metrics_path
            .as_deref()
            .unwrap_or(&config.load.metrics_path)
    }

    fn target(member: &Member, _: &str, uri: Option<Uri>) -> Self::Target {
        uri.and_then(|uri| scrape::Target::new(&uri, member.server_name.clone()))
    }
}

/// The scraper's own state, kept between rounds.
struct Scraper {
    router: Arc<Router>,
    config: SharedConfig,
    stats: Arc<ScrapeStats>,
    /// Each worker's kept-alive connection, between rounds.
    connections: HashMap<WorkerKey, scrape::Connection>,
    targets: Targets<Scrape>,
    tracks: HashMap<WorkerKey, Track>,
    /// What the scraper is doing, `None` when it does not scrape.
    scraping: Option<Purpose>,
    /// Each worker's budget of state-change lines: one that flaps is not logged every round.
    lines: LimitedLog<WorkerKey>,
    /// TLS toward `https://` workers, the data plane's.
    tls: Arc<WorkerTls>,
}

/// Why the scraper scrapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// `worker_metrics`: the fleet-wide load, and the engine reports with it.
    FleetLoad,
    /// `local` with an engine limit (`max_waiting` or `max_kv_usage`) on: the engine reports only;
    /// the rule reads local load, so no load sample is published.
    EngineReports,
}

impl Purpose {
    /// Why to scrape under `policy` (the policy in force: its load source and admission), if at
    /// all.
    fn of(policy: &PolicySettings) -> Option<Purpose> {
        if policy.load_source == LoadSource::WorkerMetrics {
            Some(Purpose::FleetLoad)
        } else if policy.admission.engine_limits() {
            Some(Purpose::EngineReports)
        } else {
            None
        }
    }
}

/// Starts the scraper on a thread of its own (`bch-load-scraper`) that runs until `shutdown` is
/// cancelled or the calling runtime shuts down, whichever comes first. It scrapes the workers of
/// `members` (static and discovered, with their metrics paths) under the settings of `config`,
/// publishes into the router's worker samples and counts in `stats`; state-change lines beyond
/// each worker's `[log]` budget are counted in `suppressed`.
///
/// # Errors
/// The thread or its runtime could not be created (the OS refused a thread or an epoll handle).
pub fn spawn(
    router: Arc<Router>,
    config: SharedConfig,
    members: SharedMembers,
    stats: Arc<ScrapeStats>,
    suppressed: Arc<SuppressedLines>,
    tls: Arc<WorkerTls>,
    shutdown: &CancellationToken,
) -> std::io::Result<()> {
    // Tied to the caller's runtime as well as to `shutdown`: a gateway whose runtime is dropped
    // without a shutdown (a test that ends) stops its scraper too, instead of leaving a thread
    // scraping until the process exits.
    let stop = shutdown.child_token();
    let on_runtime_drop = stop.clone().drop_guard();
    tokio::spawn(async move {
        let _stop_when_dropped = on_runtime_drop;
        std::future::pending::<()>().await
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("bch-load-scraper".to_owned())
        .spawn(move || {
            let _on_panic = ClearSamplesOnPanic(Arc::clone(&router));
            let sinks = (stats, suppressed);
            runtime.block_on(run(router, config, members, sinks, tls, stop));
        })?;
    Ok(())
}

/// Only the scraper marks samples stale, so a scraper that died would leave every worker's last
/// sample fresh for good; on a panic it clears them instead, and routing falls back to local load.
struct ClearSamplesOnPanic(Arc<Router>);

impl Drop for ClearSamplesOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for worker in self.0.table().workers() {
                self.0.clear_sample(&worker.stats);
                worker.stats.engine_report().clear();
            }
            tracing::error!(
                "the load scraper stopped on a panic: every worker is routed on local load, without engine reports, until gatewayd restarts"
            );
        }
    }
}

/// Runs the scraper until `shutdown`, with the settings of the configuration in force (re-read
/// every round, so a `load_source` switch or a reload takes effect within one round).
async fn run(
    router: Arc<Router>,
    config: SharedConfig,
    members: SharedMembers,
    (stats, suppressed): (Arc<ScrapeStats>, Arc<SuppressedLines>),
    tls: Arc<WorkerTls>,
    shutdown: CancellationToken,
) {
    // `[log]` takes effect at a restart, like the rest of the section.
    let budget = LineBudget::of(&config.load().log);
    let mut scraper = Scraper {
        lines: LimitedLog::new(Component::Scraper, budget, suppressed),
        router,
        config,
        stats,
        connections: HashMap::new(),
        targets: Targets::new(members),
        tracks: HashMap::new(),
        scraping: None,
        tls,
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
    /// One round: scrape every worker (or stop scraping when neither the load source nor an
    /// engine limit needs it); answers the round's length, the time from its start to the next.
    async fn round(&mut self) -> Duration {
        let current = self.config.load_full();
        let interval = current.load.scrape_interval;
        // The table first: the admin owner stores the membership before the router's table, so
        // the membership read after it has every worker of the table but one that just left. Its
        // policy is the one in force, admission included.
        let table = self.router.table();
        let Some(purpose) = Purpose::of(table.policy()) else {
            self.stop();
            return interval;
        };
        self.start(purpose, interval);
        if self.targets.refresh(&current) {
            // A connection is to the worker's address, whatever path is asked on it; a worker
            // that left has its connection closed.
            let targets = &self.targets;
            self.connections.retain(|key, _| targets.contains(key));
        }
        let workers = self.targets.of_table(&table);
        // A fleet too large to scrape every interval under `max_scrapes_per_second` is scraped
        // in longer rounds, and its samples may age by as much more before they are stale.
        let period = current.load.round_period(workers.len());
        let results = self.scrape_all(&workers, &current, purpose).await;
        let stale_after = current.load.stale_after_for(workers.len());
        let now = Instant::now();
        for (worker, key) in &workers {
            let track = self.tracks.entry(key.clone()).or_default();
            if track.went_stale(now, stale_after) {
                self.router.mark_sample_stale(&worker.stats);
                worker.stats.engine_report().clear();
                self.stats.set_engine_report(key, None);
                if self.lines.admit(key, &worker.spec.name, now.into_std()) {
                    tracing::warn!(worker = %worker.spec.name, stale_after_ms = crate::config::millis::as_millis(stale_after), "no good load scrape for stale_after_ms: routing on local load for this worker");
                }
            }
        }
        let tracks = &self.tracks;
        self.lines.flush(now.into_std(), |key| {
            let worker = workers.iter().find(|(_, k)| k == key);
            let name = worker.map_or_else(|| key.to_string(), |(w, _)| w.spec.name.clone());
            (name, tracks.get(key).map(Track::describe))
        });
        let outcomes = workers.iter().zip(&results).map(|((_, key), r)| (key, *r));
        let members = TableKeys::of(&table);
        self.stats
            .record_round(outcomes, |key| members.contains(key));
        self.tracks.retain(|key, _| members.contains(key));
        period
    }

    /// Scrapes `workers` once each, their starts spread evenly over the round's spread window
    /// ([`crate::config::LoadConfig::spread_window`]) and at most `max_concurrent_scrapes` in
    /// flight (a scrape due while the cap is reached waits for a permit), and publishes each good
    /// sample as soon as it is in (the engine report, and for [`Purpose::FleetLoad`] the reported
    /// load and this replica's in-flight count on the worker when its scrape was sent), so one
    /// hung worker does not age the others' samples. A scrape not answered within
    /// `scrape_timeout` of being sent is a `Timeout`, and its connection is dropped with it.
    /// Answers each worker's outcome.
    async fn scrape_all(
        &mut self,
        workers: &[(&Worker, WorkerKey)],
        config: &Config,
        purpose: Purpose,
    ) -> Vec<Result<(), Failure>> {
        let round_start = Instant::now();
        let window = config.load.spread_window(workers.len());
        let timeout = config.load.scrape_timeout();
        let max_bytes = config.load.max_scrape_bytes;
        let custom = config.load.custom_gauges();
        let tls = &*self.tls;
        let permits = Semaphore::new(config.load.max_concurrent_scrapes);
        let count = workers.len().max(1) as u128;
        let mut outcomes: Vec<Result<(), Failure>> = vec![Err(Failure::Timeout); workers.len()];
        let mut scrapes: FuturesUnordered<_> = workers
            .iter()
            .enumerate()
            .map(|(index, (worker, key))| {
                let target = self.targets.get(key).and_then(Option::as_ref);
                let reuse = self.connections.remove(key);
                let offset = window.as_nanos() * index as u128 / count;
                let start = round_start + Duration::from_nanos(offset as u64);
                let permits = &permits;
                async move {
                    tokio::time::sleep_until(start).await;
                    // Never closed: the semaphore lives as long as the round.
                    let _permit = permits.acquire().await.ok();
                    let sent_at = Instant::now();
                    let local_at_scrape = worker.stats.active();
                    let open = scrape::Opener {
                        tls,
                        handshake_timeout: timeout,
                    };
                    let scrape = scrape::scrape(target, reuse, open, max_bytes, custom);
                    let (reading, connection) = tokio::time::timeout(timeout, scrape)
                        .await
                        .unwrap_or((Err(Failure::Timeout), None));
                    (index, sent_at, reading, local_at_scrape, connection)
                }
            })
            .collect();
        while let Some((index, sent_at, reading, local_at_scrape, connection)) =
            scrapes.next().await
        {
            let (worker, key) = &workers[index];
            if let Ok(reading) = &reading {
                publish(
                    &self.router,
                    &self.stats,
                    worker,
                    key,
                    sent_at,
                    reading,
                    local_at_scrape,
                    purpose,
                );
            }
            let outcome = reading.map(|_| ());
            observe(
                &mut self.tracks,
                &mut self.lines,
                worker,
                key,
                sent_at,
                outcome,
                config,
            );
            outcomes[index] = outcome;
            if let Some(connection) = connection {
                self.connections.insert(key.clone(), connection);
            }
        }
        outcomes
    }

    /// Scraping for `purpose` from this round on, said once per change. Leaving `worker_metrics`
    /// for engine reports alone forgets every load sample, as stopping does.
    fn start(&mut self, purpose: Purpose, interval: Duration) {
        if self.scraping == Some(purpose) {
            return;
        }
        let interval_ms = crate::config::millis::as_millis(interval);
        match purpose {
            Purpose::FleetLoad => tracing::info!(
                interval_ms,
                "load source worker_metrics: scraping every worker's metrics"
            ),
            Purpose::EngineReports => {
                if self.scraping.is_some() {
                    self.clear_samples();
                }
                tracing::info!(
                    interval_ms,
                    "load source local with an engine limit (max_waiting or max_kv_usage): scraping every worker's metrics for its engine report only"
                );
            }
        }
        self.scraping = Some(purpose);
    }

    /// `local` mode without engine limits: no scraping, and no sample or engine report left for
    /// the rules to read if scraping comes back (it starts from fresh scrapes).
    fn stop(&mut self) {
        if self.scraping.is_none() {
            return;
        }
        self.scraping = None;
        self.clear_samples();
        for worker in self.router.table().workers() {
            worker.stats.engine_report().clear();
        }
        self.stats.clear_engine_reports();
        self.tracks.clear();
        // Nobody polls an idle connection in `local` mode: one a worker closed would sit in
        // CLOSE-WAIT until the source came back.
        self.connections.clear();
        self.targets.clear();
        tracing::info!("load source local, no engine limit: scraping stopped");
    }

    /// Forgets every worker's load sample: the rule reads local load.
    fn clear_samples(&self) {
        for worker in self.router.table().workers() {
            self.router.clear_sample(&worker.stats);
        }
    }
}

/// Publishes a good scrape of `worker` (sent at `sent_at`) for the rules: its engine report always,
/// and its load sample when the rule reads samples (`purpose`), stamped with the wall-clock time
/// the scrape was sent, through `router` so its fleet aggregates follow the sample.
// One call per good scrape with what the round already holds; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
fn publish(
    router: &Router,
    stats: &ScrapeStats,
    worker: &Worker,
    key: &WorkerKey,
    sent_at: Instant,
    reading: &Reading,
    local_at_scrape: u64,
    purpose: Purpose,
) {
    worker
        .stats
        .engine_report()
        .publish(reading.engine_report());
    stats.set_engine_report(key, Some(EngineReading::of(reading)));
    if purpose == Purpose::FleetLoad {
        let sample = FleetSample {
            reported: reading.load,
            local_at_scrape,
        };
        let wall_ms = crate::clock::now_ms().saturating_sub(sent_at.elapsed().as_millis() as u64);
        router.publish_sample(&worker.stats, sample, wall_ms);
    }
}

/// Logs a change of the worker's scrape state (kept in `tracks`) within the worker's budget of
/// lines (`lines`).
fn observe(
    tracks: &mut HashMap<WorkerKey, Track>,
    lines: &mut LimitedLog<WorkerKey>,
    worker: &Worker,
    key: &WorkerKey,
    sent_at: Instant,
    result: Result<(), Failure>,
    config: &Config,
) {
    let track = tracks.entry(key.clone()).or_default();
    let never_good = track.never_good();
    for change in track.observe(sent_at, result) {
        let name = &worker.spec.name;
        // The debug line of a fresh sample is no state an operator reads at `info`: not counted.
        if change != Change::UsingSample && !lines.admit(key, name, sent_at.into_std()) {
            continue;
        }
        match change {
            Change::Failing(failure) if never_good => {
                tracing::warn!(worker = %name, reason = %failure.reason().as_str(), error = %failure, "load scrape failed: routing on local load for this worker");
            }
            Change::Failing(failure) => {
                tracing::warn!(worker = %name, reason = %failure.reason().as_str(), error = %failure, stale_after_ms = crate::config::millis::as_millis(config.load.stale_after), "load scrape failed: keeping the last good sample until it is stale");
            }
            Change::Recovered => tracing::info!(worker = %name, "load scrape works again"),
            Change::UsingSample => {
                tracing::debug!(worker = %name, "routing on the worker's reported load");
            }
        }
    }
}
