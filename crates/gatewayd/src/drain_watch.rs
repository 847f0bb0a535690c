//! The drain watcher: notices when a draining worker's last in-flight request ended, logs
//! `worker drained`, tells telemetry clients (a `drained` frame) and, when the drain asked for it,
//! has the admin owner remove the worker.
//!
//! It reads the router's counters every [`POLL`] instead of being told by the data path: a load
//! guard's drop stays one atomic decrement, and a drain is an operator action measured in seconds
//! or minutes, so a tenth of a second of delay is nothing. Nothing is polled while no worker
//! drains beyond one table load.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bch_core::router::Router;
use bch_core::telemetry::WorkerState;
use tokio_util::sync::CancellationToken;

use crate::admin::Admin;
use crate::per_worker::WorkerKey;
use crate::telemetry::Telemetry;

/// How often the watcher looks at draining workers' in-flight counts.
pub const POLL: Duration = Duration::from_millis(100);

/// Watches draining workers until `shutdown`.
pub async fn run(
    admin: Arc<Admin>,
    router: Arc<Router>,
    telemetry: Telemetry,
    shutdown: CancellationToken,
) {
    let mut every = tokio::time::interval(POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Draining workers already announced idle: one `drained` per drain, not one per poll.
    let mut announced: HashSet<WorkerKey> = HashSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        let table = router.table();
        let draining = table
            .workers()
            .iter()
            .zip(table.states())
            .filter(|(_, state)| **state == WorkerState::Draining)
            .map(|(worker, _)| (worker, WorkerKey::of_worker(worker)));
        let idle: Vec<(WorkerKey, String)> = draining
            .clone()
            .filter(|(w, key)| w.stats.active() == 0 && !announced.contains(key))
            .map(|(w, key)| (key, w.spec.name.clone()))
            .collect();
        let still: HashSet<WorkerKey> = draining.map(|(_, key)| key).collect();
        announced.retain(|key| still.contains(key));
        for (key, name) in idle {
            let Some(removed) = admin.finish_drain(&key) else {
                continue;
            };
            tracing::info!(worker = %name, removed, "worker drained: no request in flight");
            telemetry.drained(name.clone(), removed);
            if !removed {
                announced.insert(key);
            }
        }
    }
}
