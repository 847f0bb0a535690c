//! Active health probes: `GET {url}{health_path}` for every worker every `[health] interval_ms`,
//! each worker at its own offset of the interval (stable per worker) so a large fleet's probes
//! spread over the interval instead of leaving in one burst, and at most
//! `[health] max_concurrent_probes` in flight ([`schedule`]). A failed worker's first failed
//! probe therefore comes within `interval_ms + timeout_ms` of its failure while the cap keeps up
//! (docs/configuration.md).
//!
//! A worker goes unhealthy after `unhealthy_threshold` consecutive failures (or at once on a failed
//! connect when passive marking is on) and comes back after `healthy_threshold` consecutive
//! successes. Health is applied through the router, which swaps the routing snapshot without
//! rebuilding the ring. The probe URIs are built once per configuration or membership change (the
//! admin owner publishes both, static and discovered workers merged), not per probe.
//!
//! A worker's very first probe decides at once: with `[health] wait_for_first_probe` new workers
//! start unhealthy and the first success lets them in; a membership change wakes the prober so a
//! new worker is probed right away instead of at its offset of the next interval. Every failure has a reason
//! ([`ProbeFailure`]), logged when it flips a worker and counted in
//! `bch_probe_failures_total{worker,reason}`, a family this module registers ([`ProbeFailures`]).
//!
//! A front end that has reason to doubt a worker but did not see it fail itself (Envoy reports
//! serving a fallback, which anyone on the picker port can claim) asks for a probe of that worker
//! now ([`ProbeRequests`]); the probe's result decides, never the report. With passive marking on,
//! a failed probe of a worker asked about marks it unhealthy at once, as a failed connect the
//! gateway saw itself would.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bch_core::router::{Router, RoutingTable};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use http::{Request, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::ServerName;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use failures::{ProbeFailure, ProbeFailures};
use learned_models::ModelsList;
use schedule::Schedule;

use crate::config::{Config, HealthConfig, Member, SharedConfig, SharedMembers};
use crate::log_limit::{Component, LimitedLog, LineBudget, SuppressedLines};
use crate::per_worker::{Check, TableKeys, Targets, WorkerKey};
use crate::upstream::tls::WorkerConnector;
use crate::upstream::{WorkerTls, tls_problem};

/// A worker is probed on request at most once per this time; requests in between are dropped,
/// so reports cannot turn the prober into a flood of requests to a worker.
pub const PROBE_REQUEST_GAP: Duration = Duration::from_secs(1);

/// How often the summaries of suppressed health-change lines are looked for: their periods are
/// much longer, and each look walks every worker that logged lately.
const LINES_FLUSH_GAP: Duration = Duration::from_secs(1);

/// Asks the prober to probe one worker now. Cheap and never waits. The requests waiting are a
/// set, one per worker: a peer reporting without end about some workers coalesces into one
/// request each and never crowds out the request about another (a bounded queue of reports
/// would drop it, and a worker really failing would wait for the next full round). The set holds
/// at most one key per worker reported about, and the prober empties it every round. Cloned by
/// each front end that reports doubts.
#[derive(Debug, Clone)]
pub struct ProbeRequests(Arc<PendingProbes>);

/// The prober's end of [`ProbeRequests`].
#[derive(Debug)]
pub struct ProbeRequestQueue(Arc<PendingProbes>);

/// The workers asked about and not yet taken by the prober, and its wake-up.
#[derive(Debug, Default)]
struct PendingProbes {
    /// Held only to insert one key or to take them all, never across an await.
    workers: Mutex<HashSet<WorkerKey>>,
    wake: Notify,
}

impl PendingProbes {
    fn lock(&self) -> MutexGuard<'_, HashSet<WorkerKey>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ProbeRequestQueue {
    /// Waits until some request arrives (at once if one arrived since the last wait).
    async fn arrived(&self) {
        self.0.wake.notified().await;
    }

    /// The workers asked about since the last call, each once.
    fn take(&mut self) -> Vec<WorkerKey> {
        self.0.lock().drain().collect()
    }
}

impl ProbeRequests {
    /// The front ends' end of the requests and the prober's.
    pub fn channel() -> (Self, ProbeRequestQueue) {
        let pending = Arc::new(PendingProbes::default());
        (Self(Arc::clone(&pending)), ProbeRequestQueue(pending))
    }

    /// Asks for a probe of `worker` now; `false` when a request about it was already waiting
    /// (this one joins it).
    pub fn probe(&self, worker: WorkerKey) -> bool {
        let added = self.0.lock().insert(worker);
        if added {
            // A permit is stored when the prober is busy probing, so the request is not lost.
            self.0.wake.notify_one();
        }
        added
    }
}

/// Consecutive probe results of one worker.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Streak {
    successes: u32,
    failures: u32,
    /// Health when the streak was last updated: if something else (passive marking, a reload)
    /// changed it since, the streak restarts so a worker needs fresh successes to come back.
    seen_healthy: Option<bool>,
}

impl Streak {
    /// Counts one probe result (`ok`) of a worker whose health is `healthy` right now, and answers
    /// the health it should flip to when the streak reached its threshold.
    fn observe(&mut self, ok: bool, healthy: bool, thresholds: &HealthConfig) -> Option<bool> {
        if self.seen_healthy.is_none() && ok && !healthy {
            // The first probe of a worker that waits for it: one success lets it in.
            self.seen_healthy = Some(true);
            self.successes = 1;
            return Some(true);
        }
        if self.seen_healthy != Some(healthy) {
            *self = Streak {
                seen_healthy: Some(healthy),
                ..Streak::default()
            };
        }
        if ok {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
        }
        if healthy && self.failures >= thresholds.unhealthy_threshold {
            Some(false)
        } else if !healthy && self.successes >= thresholds.healthy_threshold {
            Some(true)
        } else {
            None
        }
    }
}

/// The probe check: a worker's health path (its own, else `[health] path`) on its URL; `None` when
/// they make no valid URI (reported once, and probed as failing).
struct Probe;

impl Check for Probe {
    type Target = Option<Uri>;

    fn path<'a>(config: &'a Config, member: &'a Member) -> &'a str {
        config.probe_path(member.health_path.as_deref())
    }

    fn target(member: &Member, path: &str, uri: Option<Uri>) -> Self::Target {
        if uri.is_none() {
            tracing::warn!(worker = %member.spec.name, path, "health path makes no valid URI; the worker's probes fail");
        }
        uri
    }
}

/// What the prober needs besides the router: the configuration in force (re-read every round),
/// the wake-up a membership change sends, where failures are counted, and when to stop.
pub struct Prober {
    /// The routing table whose workers are probed and whose health is set.
    pub router: Arc<Router>,
    /// Timing, thresholds and paths.
    pub config: SharedConfig,
    /// The merged membership in force (static and discovered), with each worker's probe path.
    pub members: SharedMembers,
    /// Notified by the admin owner on a membership change: probe now.
    pub probe_now: Arc<Notify>,
    /// Workers a front end asked to have probed now (see [`ProbeRequests`]).
    pub requests: ProbeRequestQueue,
    /// `bch_probe_failures_total`.
    pub failures: Arc<ProbeFailures>,
    /// `bch_log_lines_suppressed_total`: health changes beyond a worker's `[log]` budget of lines.
    pub suppressed: Arc<SuppressedLines>,
    /// Counts the times the prober caught up with first probes (every worker then in the table
    /// has had its first probe applied), so a waiter (the demo, before its traffic) learns when
    /// every worker present at start has had its first probe.
    pub rounds: tokio::sync::watch::Sender<u64>,
    /// Stops the prober.
    pub shutdown: CancellationToken,
    /// TLS toward `https://` workers, the data plane's.
    pub tls: Arc<WorkerTls>,
}

/// Probes every worker of the router's table until shutdown, with the timing, thresholds, cap
/// and paths of the configuration and membership in force (re-read on every wake-up): each worker
/// once per `interval_ms` at its own offset of the interval, a new worker and one a front end
/// asked about at once, at most `max_concurrent_probes` at a time (see [`schedule`]). Each
/// result is applied as soon as it is in, so one hung worker delays no other's.
pub async fn run(prober: Prober) {
    let Prober {
        router,
        config,
        members,
        probe_now,
        mut requests,
        failures,
        suppressed,
        rounds,
        shutdown,
        tls,
    } = prober;
    // `[log]` takes effect at a restart, like the rest of the section.
    let budget = LineBudget::of(&config.load().log);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // Each probe has its timeout; the handshake's own only keeps a stuck one from holding a pooled
    // connection's slot longer.
    let connector = WorkerConnector::new(connector, tls, config.load().health.timeout);
    let mut probing = Probing {
        client: Client::builder(TokioExecutor::new()).build(connector.clone()),
        connector,
        members: Arc::clone(&members),
        router,
        failures,
        models: Targets::new(Arc::clone(&members)),
        targets: Targets::new(members),
        schedule: Schedule::new(config.load().health.interval, Instant::now()),
        running: FuturesUnordered::new(),
        synced: None,
        streaks: HashMap::new(),
        asked_at: HashMap::new(),
        lines: LimitedLog::new(Component::Prober, budget, suppressed),
    };
    // Whether workers whose first probe is pending joined since `rounds` was last counted: with
    // none at all, the first (empty) round is applied at once.
    let mut firsts_to_announce = true;
    let mut last_flush = Instant::now();
    loop {
        let current = config.load_full();
        let now = Instant::now();
        firsts_to_announce |= probing.sync(&current, now);
        probing.take_asks(requests.take(), now);
        probing.schedule.advance(now);
        probing.start_due(&current);
        if firsts_to_announce && probing.schedule.firsts_pending() == 0 {
            firsts_to_announce = false;
            rounds.send_modify(|done| *done += 1);
        }
        let wake = probing.schedule.next_due();
        let next_due = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let done = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = probe_now.notified() => None,
            _ = requests.arrived() => None,
            Some(done) = probing.running.next(), if !probing.running.is_empty() => Some(done),
            _ = next_due => None,
        };
        if let Some(done) = done {
            probing.apply(done, &current.health);
            // Every other result already in is applied in this wake-up too.
            while let Some(Some(done)) = probing.running.next().now_or_never() {
                probing.apply(done, &current.health);
            }
            // The summaries walk every worker that logged lately: once a second, not per result.
            if last_flush.elapsed() >= LINES_FLUSH_GAP {
                last_flush = Instant::now();
                probing.flush_lines();
            }
        }
    }
}

/// One finished probe: whose, how it went, and the worker's models list when it passed and
/// `learn_models` asked for it.
struct Done {
    key: WorkerKey,
    result: Result<(), ProbeFailure>,
    models: Option<Vec<String>>,
}

/// The prober's state between wake-ups.
struct Probing {
    client: Client<WorkerConnector, Empty<Bytes>>,
    /// The client's connector, told each `https://` worker's server name.
    connector: WorkerConnector,
    /// The membership the targets come from, read again for the server names when they change.
    members: SharedMembers,
    router: Arc<Router>,
    failures: Arc<ProbeFailures>,
    targets: Targets<Probe>,
    /// Each worker's `/v1/models`, asked when `[health] learn_models` is on.
    models: Targets<ModelsList>,
    /// When each worker is probed next, and the probes due and not started.
    schedule: Schedule,
    /// The probes started and not finished (at most `max_concurrent_probes`, but for a cap a
    /// reload lowered).
    running: FuturesUnordered<BoxFuture<'static, Done>>,
    /// The membership generation the schedule was last given, and each of its workers' index in
    /// that generation's tables: a result is applied without a walk of the table.
    synced: Option<(u64, HashMap<WorkerKey, usize>)>,
    /// Each probed worker's consecutive results; a worker without one was never probed.
    streaks: HashMap<WorkerKey, Streak>,
    /// When each worker was last probed on request ([`PROBE_REQUEST_GAP`]).
    asked_at: HashMap<WorkerKey, Instant>,
    /// Each worker's budget of health-change lines: one that flaps is not logged every round.
    lines: LimitedLog<WorkerKey>,
}

impl Probing {
    /// Brings the targets and the schedule up to the configuration and membership in force;
    /// answers whether workers joined (their first probes are due now). The per-worker state of
    /// workers that left is forgotten here, once per membership change, not per probe.
    fn sync(&mut self, current: &Arc<Config>, now: Instant) -> bool {
        // The table first, then the membership (see `Targets::refresh`).
        let table = self.router.table();
        let refreshed = self.targets.refresh(current);
        if refreshed {
            self.connector
                .set_server_names(server_names(&self.members.load()));
        }
        if current.health.learn_models {
            self.models.refresh(current);
        }
        self.schedule.set_interval(current.health.interval, now);
        let generation = table.membership_generation();
        if !refreshed && self.synced.as_ref().is_some_and(|(g, _)| *g == generation) {
            return false;
        }
        let workers = self.targets.of_table(&table);
        let keys: Vec<WorkerKey> = workers.iter().map(|(_, key)| key.clone()).collect();
        let pending = self.schedule.firsts_pending();
        self.schedule.set_members(&keys, now);
        let joined = self.schedule.firsts_pending() > pending;
        let indices = (table.workers().iter().enumerate())
            .map(|(index, worker)| (WorkerKey::of_worker(worker), index))
            .collect();
        self.synced = Some((generation, indices));
        let members = TableKeys::of(&table);
        self.streaks.retain(|key, _| members.contains(key));
        self.asked_at.retain(|key, _| members.contains(key));
        self.failures.retain(|key| members.contains(key));
        joined
    }

    /// Hands the schedule the workers front ends asked about, but those probed on request within
    /// [`PROBE_REQUEST_GAP`].
    fn take_asks(&mut self, asked: Vec<WorkerKey>, now: Instant) {
        for key in asked {
            let recent = self
                .asked_at
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < PROBE_REQUEST_GAP);
            if !recent && self.schedule.ask(&key) {
                self.asked_at.insert(key, now);
            }
        }
    }

    /// Starts the probes due, while fewer than `max_concurrent_probes` run.
    fn start_due(&mut self, current: &Config) {
        let timeout = current.health.timeout;
        while self.running.len() < current.health.max_concurrent_probes {
            let Some(key) = self.schedule.next_start() else {
                return;
            };
            let uri = self.targets.get(&key).cloned().flatten();
            let models =
                (current.health.learn_models).then(|| self.models.get(&key).cloned().flatten());
            let client = self.client.clone();
            self.running.push(Box::pin(async move {
                let result = probe_once(&client, uri.as_ref(), timeout).await;
                let models = match (&result, models) {
                    (Ok(()), Some(uri)) => {
                        learned_models::ask(&client, uri.as_ref(), timeout).await
                    }
                    _ => None,
                };
                Done {
                    key,
                    result,
                    models,
                }
            }));
        }
    }

    /// Applies one finished probe to the table in force (nothing for a worker that left).
    fn apply(&mut self, done: Done, thresholds: &HealthConfig) {
        let Some(finished) = self.schedule.finished(&done.key) else {
            return;
        };
        let table = self.router.table();
        let indexed = self.synced.as_ref().and_then(|(generation, indices)| {
            let index = *indices.get(&done.key)?;
            (*generation == table.membership_generation()).then_some(index)
        });
        // A membership change not yet synced: the one walk of the table.
        let Some(index) = indexed.or_else(|| done.key.index_in(&table)) else {
            return;
        };
        if let Some(list) = done.models {
            table.workers()[index].stats.set_reported_models(list);
        }
        self.observe(
            &table,
            index,
            done.key,
            done.result,
            finished.asked,
            thresholds,
        );
    }

    /// Logs the summaries of suppressed health-change lines whose period ended.
    fn flush_lines(&mut self) {
        let table = self.router.table();
        let indices = self.synced.as_ref().map(|(_, indices)| indices);
        self.lines.flush(std::time::Instant::now(), |key| {
            let index = indices
                .and_then(|indices| indices.get(key).copied())
                .filter(|index| table.workers().get(*index).is_some_and(|w| key.is(&w.spec)));
            match index {
                Some(index) => {
                    let healthy = table.healthy_flags()[index];
                    let state = if healthy { "healthy" } else { "unhealthy" };
                    (
                        table.workers()[index].spec.name.clone(),
                        Some(state.to_owned()),
                    )
                }
                None => (key.to_string(), None),
            }
        });
    }

    /// Counts one probe result of the worker at `index` of `table` and flips its health when its
    /// streak reached a threshold (the status change), or at once when the probe was `asked` for,
    /// failed, and passive marking is on.
    fn observe(
        &mut self,
        table: &RoutingTable,
        index: usize,
        key: WorkerKey,
        result: Result<(), ProbeFailure>,
        asked: bool,
        thresholds: &HealthConfig,
    ) {
        let name = &table.workers()[index].spec.name;
        let reason = result.err().map(|failure| failure.to_string());
        table.workers()[index]
            .stats
            .set_probe_failure(reason.as_deref());
        if let Err(failure) = result {
            self.failures.record(&key, failure.reason());
            tracing::debug!(worker = %name, reason = %failure, "probe failed");
        }
        let healthy = table.healthy_flags()[index];
        let streak = self.streaks.entry(key.clone()).or_default();
        let first = streak.seen_healthy.is_none();
        let confirmed_failure = asked && thresholds.passive && healthy && result.is_err();
        let flip = streak
            .observe(result.is_ok(), healthy, thresholds)
            .or(confirmed_failure.then_some(false));
        let Some(to) = flip else {
            if first
                && !healthy
                && let Err(failure) = result
            {
                tracing::warn!(worker = %name, reason = %failure, "worker failed its first probe; no traffic until a probe passes");
            }
            return;
        };
        if self.router.set_health(name, to) {
            streak.seen_healthy = Some(to);
            // The health changed every time; only its line is within the worker's budget.
            if !self.lines.admit(&key, name, std::time::Instant::now()) {
                return;
            }
            match result {
                Ok(()) if first => {
                    tracing::info!(worker = %name, "worker passed its first probe; taking traffic")
                }
                Ok(()) => tracing::info!(worker = %name, "worker healthy again"),
                Err(failure) if confirmed_failure => {
                    tracing::warn!(worker = %name, reason = %failure, "worker failed the probe a served-fallback report asked for; marked unhealthy until probes succeed")
                }
                Err(failure) => {
                    tracing::warn!(worker = %name, failures = streak.failures, reason = %failure, "worker marked unhealthy")
                }
            }
        }
    }
}

/// `host:port` → server name of every `https://` worker of `members`, for the prober's connector.
fn server_names(members: &[Member]) -> HashMap<String, ServerName<'static>> {
    members
        .iter()
        .filter_map(|m| Some((m.url.authority.to_string(), m.server_name.clone()?)))
        .collect()
}

async fn probe_once(
    client: &Client<WorkerConnector, Empty<Bytes>>,
    uri: Option<&Uri>,
    timeout: Duration,
) -> Result<(), ProbeFailure> {
    let uri = uri.ok_or(ProbeFailure::Error)?;
    let request = Request::get(uri.clone())
        .body(Empty::new())
        .map_err(|_| ProbeFailure::Error)?;
    match tokio::time::timeout(timeout, client.request(request)).await {
        Ok(Ok(response)) if response.status().is_success() => Ok(()),
        Ok(Ok(response)) => Err(ProbeFailure::Status(response.status().as_u16())),
        Ok(Err(error)) => Err(match tls_problem(&error) {
            Some(problem) => ProbeFailure::Tls(problem),
            None if error.is_connect() => ProbeFailure::Refused,
            None => ProbeFailure::Error,
        }),
        Err(_) => Err(ProbeFailure::Timeout),
    }
}

mod failures;
mod learned_models;
mod schedule;
#[cfg(test)]
mod tests;
