//! Active health probes: `GET {url}{health_path}` for every worker every `[health] interval_ms`.
//!
//! A worker goes unhealthy after `unhealthy_threshold` consecutive failures (or at once on a failed
//! connect when passive marking is on) and comes back after `healthy_threshold` consecutive
//! successes. Health is applied through the router, which swaps the routing snapshot without
//! rebuilding the ring. The probe URIs are built once per configuration or membership change (the
//! admin owner publishes both, static and discovered workers merged), not per probe.

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
use tokio_util::sync::CancellationToken;

use crate::config::{Config, HealthConfig, Member, SharedConfig, SharedMembers};

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

/// Probes every worker of the router's table until `shutdown`, with the timing, thresholds and
/// paths of the configuration and membership in force (re-read every round).
pub async fn run(
    router: Arc<Router>,
    config: SharedConfig,
    members: SharedMembers,
    shutdown: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(connector);
    let mut streaks: HashMap<String, Streak> = HashMap::new();
    let mut built_for: Option<(Arc<Config>, Arc<Vec<Member>>)> = None;
    let mut by_name = HashMap::new();
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
        let table = router.table();
        let rounds = table.workers().iter().filter_map(|worker| {
            let probe = by_name.get(&worker.spec.name)?;
            let client = client.clone();
            Some(async move {
                let ok = probe_once(&client, probe.uri.as_ref(), timeout).await;
                (worker.spec.name.clone(), probe.url.clone(), ok)
            })
        });
        let results = join_all(rounds).await;
        let table = router.table();
        streaks.retain(|url, _| table.workers().iter().any(|w| &w.spec.url == url));
        for (name, url, ok) in results {
            let Some(index) = table.index_of(&name) else {
                continue;
            };
            let healthy = table.health()[index];
            let streak = streaks.entry(url).or_default();
            let Some(to) = streak.observe(ok, healthy, &current.health) else {
                continue;
            };
            if router.set_health(&name, to) {
                streak.seen_healthy = Some(to);
                if to {
                    tracing::info!(worker = %name, "worker healthy again");
                } else {
                    tracing::warn!(worker = %name, failures = streak.failures, "worker marked unhealthy");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(current.health.interval_ms)) => {}
        }
    }
}

async fn probe_once(
    client: &Client<HttpConnector, Empty<Bytes>>,
    uri: Option<&Uri>,
    timeout: Duration,
) -> bool {
    let Some(uri) = uri else {
        return false;
    };
    let Ok(request) = Request::get(uri.clone()).body(Empty::new()) else {
        return false;
    };
    match tokio::time::timeout(timeout, client.request(request)).await {
        Ok(Ok(response)) => response.status().is_success(),
        _ => false,
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
        streak.seen_healthy = Some(false);
        assert_eq!(streak.observe(true, false, &thresholds), None);
        assert_eq!(streak.observe(true, false, &thresholds), Some(true));
        // Passive marking flipped the worker to unhealthy behind the prober's back: the two
        // successes seen while it was unhealthy do not count, it needs two fresh ones.
        let mut streak = Streak::default();
        assert_eq!(streak.observe(true, true, &thresholds), None);
        assert_eq!(streak.observe(true, false, &thresholds), None);
        assert_eq!(streak.observe(true, false, &thresholds), Some(true));
        // A failure resets the successes.
        let mut streak = Streak::default();
        streak.observe(true, false, &thresholds);
        streak.observe(false, false, &thresholds);
        assert_eq!(streak.observe(true, false, &thresholds), None);
    }
}
