//! Active health probes: `GET {url}{health_path}` for every worker every `[health] interval_ms`.
//!
//! A worker goes unhealthy after `unhealthy_threshold` consecutive failures (or at once on a failed
//! connect when passive marking is on) and comes back after `healthy_threshold` consecutive
//! successes. Health is applied through the router, which swaps the routing snapshot without
//! rebuilding the ring.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::WorkerUrl;
use crate::gateway::Gateway;

#[derive(Default, Clone, Copy)]
struct Streak {
    successes: u32,
    failures: u32,
    /// Health when the streak was last updated: if something else (passive marking, a reload)
    /// changed it since, the streak restarts so a worker needs fresh successes to come back.
    seen_healthy: Option<bool>,
}

/// Runs probes until shutdown.
pub async fn run(gateway: Arc<Gateway>) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(connector);
    let mut streaks: HashMap<String, Streak> = HashMap::new();
    loop {
        let config = gateway.config.load_full();
        let interval = Duration::from_millis(config.health.interval_ms);
        let timeout = Duration::from_millis(config.health.timeout_ms);
        let table = gateway.router.table();
        let probes = table.workers().iter().map(|worker| {
            let path = config.health_path_for(&worker.spec.url).to_owned();
            let client = client.clone();
            let url = worker.spec.url.clone();
            async move {
                let ok = probe(&client, &url, &path, timeout).await;
                (url, ok)
            }
        });
        let results = join_all(probes).await;
        let table = gateway.router.table();
        streaks.retain(|url, _| table.workers().iter().any(|w| &w.spec.url == url));
        for (url, ok) in results {
            let Some(index) = table.workers().iter().position(|w| w.spec.url == url) else {
                continue;
            };
            let name = &table.workers()[index].spec.name;
            let healthy = table.health()[index];
            let streak = streaks.entry(url).or_default();
            if streak.seen_healthy != Some(healthy) {
                *streak = Streak {
                    seen_healthy: Some(healthy),
                    ..Streak::default()
                };
            }
            if ok {
                streak.successes = streak.successes.saturating_add(1);
                streak.failures = 0;
            } else {
                streak.failures = streak.failures.saturating_add(1);
                streak.successes = 0;
            }
            if healthy
                && streak.failures >= config.health.unhealthy_threshold
                && gateway.router.set_health(name, false)
            {
                streak.seen_healthy = Some(false);
                tracing::warn!(worker = %name, failures = streak.failures, "worker marked unhealthy");
            } else if !healthy
                && streak.successes >= config.health.healthy_threshold
                && gateway.router.set_health(name, true)
            {
                streak.seen_healthy = Some(true);
                tracing::info!(worker = %name, "worker healthy again");
            }
        }
        tokio::select! {
            _ = gateway.shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

async fn probe(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    path: &str,
    timeout: Duration,
) -> bool {
    let Ok(base) = WorkerUrl::parse(url) else {
        return false;
    };
    let Ok(path) = path.parse() else {
        return false;
    };
    let Ok(uri) = base.join(Some(&path)) else {
        return false;
    };
    let Ok(request) = Request::get(uri).body(Empty::new()) else {
        return false;
    };
    match tokio::time::timeout(timeout, client.request(request)).await {
        Ok(Ok(response)) => response.status().is_success(),
        _ => false,
    }
}
