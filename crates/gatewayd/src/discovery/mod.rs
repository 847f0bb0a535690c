//! DNS discovery: workers from SRV or A/AAAA records, as Kubernetes headless Services, Consul and
//! Nomad publish them (docs/discovery.md).
//!
//! [`run`] keeps one task per `[[discovery]]` entry in force, starting and stopping them as
//! reloads change the entries. Each task (`source`) resolves its name (`resolve`), turns the
//! answer into workers (`records`), applies the safety rules (`safety`) and hands the set to the
//! admin owner, which merges it with the static workers and every other source's. A discovered
//! worker's URL is `scheme://IP:PORT`, and that URL is its ring identity.
//!
//! Discovery never touches the data path: requests read the router's table as before, and only
//! a set that differs from the one in force changes anything.

mod counters;
mod records;
mod resolve;
mod safety;
mod source;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::admin::Admin;
use crate::config::DiscoveryConfig;
use crate::log_limit::SuppressedLines;
pub use counters::DiscoveryMetrics;

/// Runs the discovery sources in force until `shutdown`; each source's state-change lines beyond
/// its `[log]` budget are counted in `suppressed`.
pub async fn run(
    admin: Arc<Admin>,
    metrics: Arc<DiscoveryMetrics>,
    suppressed: Arc<SuppressedLines>,
    shutdown: CancellationToken,
) {
    let mut sources = admin.discovery_sources();
    let mut running: Vec<(DiscoveryConfig, CancellationToken)> = Vec::new();
    loop {
        let wanted = sources.borrow_and_update().clone();
        metrics.set_in_force(
            wanted
                .iter()
                .map(|e| e.source().label().into_owned())
                .collect(),
        );
        // A changed entry is a new task: the old one stops, and the admin owner drops an answer
        // it resolved under the old entry.
        running.retain(|(entry, stop)| {
            let keep = wanted.contains(entry);
            if !keep {
                stop.cancel();
            }
            keep
        });
        for entry in wanted {
            if running.iter().any(|(e, _)| *e == entry) {
                continue;
            }
            let stop = shutdown.child_token();
            let counters = metrics.source(&entry.source().label());
            tokio::spawn(source::run(
                Arc::clone(&admin),
                entry.clone(),
                counters,
                Arc::clone(&suppressed),
                stop.clone(),
            ));
            running.push((entry, stop));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = sources.changed() => if changed.is_err() { return },
        }
    }
}
