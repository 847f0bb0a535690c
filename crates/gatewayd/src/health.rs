//! Active health probes: `GET {url}{health_path}` for every worker every `[health] interval_ms`.
//!
//! A worker goes unhealthy after `unhealthy_threshold` consecutive failures (or at once on a failed
//! connect when passive marking is on) and comes back after `healthy_threshold` consecutive
//! successes. Health is applied through the router, which swaps the routing snapshot without
//! rebuilding the ring. The probe URIs are built once per configuration or membership change (the
//! admin owner publishes both, static and discovered workers merged), not per probe.
//!
//! A worker's very first probe decides at once: with `[health] wait_for_first_probe` new workers
//! start unhealthy and the first success lets them in; a membership change wakes the prober so a
//! new worker is probed right away instead of at the next round. Every failure has a reason
//! ([`ProbeFailure`]), logged when it flips a worker and counted in
//! `bch_probe_failures_total{worker,reason}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bch_core::router::Router;
use bytes::Bytes;
use futures_util::future::join_all;
use http::{Request, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, HealthConfig, Member, SharedConfig, SharedMembers};
use crate::metrics::Metrics;

/// Why a probe failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeFailure {
    /// No TCP connection: refused, unreachable, or the connect timed out.
    Refused,
    /// Connected, but no answer within `[health] timeout_ms`.
    Timeout,
    /// The worker answered with this non-2xx status.
    Status(u16),
    /// The exchange broke, or the probe URI is invalid.
    Error,
}

impl ProbeFailure {
    /// The `reason` label: `refused`, `timeout`, `status` or `error`.
    pub fn reason(self) -> &'static str {
        match self {
            ProbeFailure::Refused => "refused",
            ProbeFailure::Timeout => "timeout",
            ProbeFailure::Status(_) => "status",
            ProbeFailure::Error => "error",
        }
    }
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeFailure::Status(code) => write!(f, "status {code}"),
            other => f.write_str(other.reason()),
        }
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

/// One worker's probe: its URL (the streak's key) and the URI probed, `None` when the worker's URL
/// and health path make no valid URI (reported once, and probed as failing).
struct Probe {
    url: String,
    uri: Option<Uri>,
}

/// The probes for `members` under `config`'s probe path, by name.
fn probes(config: &Config, members: &[Member]) -> HashMap<String, Probe> {
    members
        .iter()
        .map(|member| {
            let path = config.probe_path(member.health_path.as_deref());
            let uri = path
                .parse()
                .ok()
                .and_then(|path| member.url.join(Some(&path)).ok());
            if uri.is_none() {
                tracing::warn!(worker = %member.spec.name, path, "health path makes no valid URI; the worker's probes fail");
            }
            let probe = Probe {
                url: member.spec.url.clone(),
                uri,
            };
            (member.spec.name.clone(), probe)
        })
        .collect()
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
    /// `bch_probe_failures_total`.
    pub metrics: Arc<Metrics>,
    /// Stops the prober.
    pub shutdown: CancellationToken,
}

/// Probes every worker of the router's table until shutdown, with the timing, thresholds and
/// paths of the configuration and membership in force (re-read every round).
pub async fn run(prober: Prober) {
    let Prober {
        router,
        config,
        members,
        probe_now,
        metrics,
        shutdown,
    } = prober;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(connector);
    let mut streaks: HashMap<String, Streak> = HashMap::new();
    let mut built_for: Option<(Arc<Config>, Arc<Vec<Member>>)> = None;
    let mut by_name = HashMap::new();
    // A wake-up from `probe_now` probes only the workers never probed yet; the full rounds keep
    // their interval however often the membership changes (a DNS source may, every second). The
    // interval is read every loop, so one a reload changed counts from the last full round.
    let mut last_full: Option<tokio::time::Instant> = None;
    loop {
        let current = config.load_full();
        let membership = members.load_full();
        let fresh = built_for
            .as_ref()
            .is_some_and(|(c, m)| Arc::ptr_eq(c, &current) && Arc::ptr_eq(m, &membership));
        if !fresh {
            by_name = probes(&current, &membership);
            built_for = Some((Arc::clone(&current), membership));
        }
        let timeout = Duration::from_millis(current.health.timeout_ms);
        let interval = Duration::from_millis(current.health.interval_ms);
        let full = last_full.is_none_or(|at| at.elapsed() >= interval);
        if full {
            last_full = Some(tokio::time::Instant::now());
        }
        let table = router.table();
        let due = table
            .workers()
            .iter()
            .filter(|worker| full || !streaks.contains_key(&worker.spec.url));
        let rounds = due.filter_map(|worker| {
            let probe = by_name.get(&worker.spec.name)?;
            let client = client.clone();
            Some(async move {
                let result = probe_once(&client, probe.uri.as_ref(), timeout).await;
                (worker.spec.name.clone(), probe.url.clone(), result)
            })
        });
        let results = join_all(rounds).await;
        let table = router.table();
        streaks.retain(|url, _| table.workers().iter().any(|w| &w.spec.url == url));
        metrics.retain_probe_failures(|name| table.index_of(name).is_some());
        for (name, url, result) in results {
            let Some(index) = table.index_of(&name) else {
                continue;
            };
            if let Err(failure) = result {
                metrics.record_probe_failure(&name, failure.reason());
                tracing::debug!(worker = %name, reason = %failure, "probe failed");
            }
            let healthy = table.health()[index];
            let streak = streaks.entry(url).or_default();
            let first = streak.seen_healthy.is_none();
            let Some(to) = streak.observe(result.is_ok(), healthy, &current.health) else {
                if first
                    && !healthy
                    && let Err(failure) = result
                {
                    tracing::warn!(worker = %name, reason = %failure, "worker failed its first probe; no traffic until a probe passes");
                }
                continue;
            };
            if router.set_health(&name, to) {
                streak.seen_healthy = Some(to);
                match result {
                    Ok(()) if first => {
                        tracing::info!(worker = %name, "worker passed its first probe; taking traffic")
                    }
                    Ok(()) => tracing::info!(worker = %name, "worker healthy again"),
                    Err(failure) => {
                        tracing::warn!(worker = %name, failures = streak.failures, reason = %failure, "worker marked unhealthy")
                    }
                }
            }
        }
        let next_full = last_full.map_or_else(tokio::time::Instant::now, |at| at + interval);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = probe_now.notified() => {}
            _ = tokio::time::sleep_until(next_full) => {}
        }
    }
}

async fn probe_once(
    client: &Client<HttpConnector, Empty<Bytes>>,
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
        Ok(Err(error)) if error.is_connect() => Err(ProbeFailure::Refused),
        Ok(Err(_)) => Err(ProbeFailure::Error),
        Err(_) => Err(ProbeFailure::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streak_flips_at_thresholds_and_restarts_when_health_changed_elsewhere() {
        let thresholds = HealthConfig {
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            ..HealthConfig::default()
        };
        let mut streak = Streak::default();
        assert_eq!(streak.observe(false, true, &thresholds), None);
        assert_eq!(streak.observe(false, true, &thresholds), None);
        assert_eq!(streak.observe(false, true, &thresholds), Some(false));
        // A new worker waiting for its first probe: one success lets it in, a failure keeps it
        // out until the normal threshold of successes.
        let mut waiting = Streak::default();
        assert_eq!(waiting.observe(true, false, &thresholds), Some(true));
        let mut waiting = Streak::default();
        assert_eq!(waiting.observe(false, false, &thresholds), None);
        assert_eq!(waiting.observe(true, false, &thresholds), None);
        assert_eq!(waiting.observe(true, false, &thresholds), Some(true));
        streak.seen_healthy = Some(false);
        assert_eq!(streak.observe(true, false, &thresholds), None);
        assert_eq!(streak.observe(true, false, &thresholds), Some(true));
        // Passive marking flipped the worker to unhealthy behind the prober's back: the two
        // successes seen while it was unhealthy do not count, it needs two fresh ones.
        let mut streak = Streak::default();
        assert_eq!(streak.observe(true, true, &thresholds), None);
        assert_eq!(streak.observe(true, false, &thresholds), None);
        assert_eq!(streak.observe(true, false, &thresholds), Some(true));
        // A failure resets the successes (of a worker probed before).
        let mut streak = Streak {
            seen_healthy: Some(false),
            ..Streak::default()
        };
        streak.observe(true, false, &thresholds);
        streak.observe(false, false, &thresholds);
        assert_eq!(streak.observe(true, false, &thresholds), None);
    }
}
