//! Load accounting: per-worker atomic counters and the RAII guard that owns one unit of in-flight
//! load.
//!
//! A worker's active load is raised when a request is routed to it (inside the router's selection
//! step) and lowered only by dropping the request's [`LoadGuard`]. Drop runs exactly once on every
//! path — normal completion, error, cancelled future, panic unwind — so load cannot leak (the rule of
//! tower's `load` and linkerd's `hyper-balance`). gatewayd keeps the guard inside the response body
//! so load ends with the last byte, not with the headers.
//!
//! Counters live in an `Arc` shared by every routing snapshot that names the worker and by every
//! guard, so they survive snapshot swaps and a remove + re-add of the same worker while old requests
//! are still in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fleet_load::SampleCell;

/// Counters of one worker. All counts are requests.
#[derive(Debug, Default)]
pub struct WorkerStats {
    active: AtomicU64,
    requests_total: AtomicU64,
    spilled_in_total: AtomicU64,
    spilled_out_total: AtomicU64,
    errors_total: AtomicU64,
    fleet: SampleCell,
}

impl WorkerStats {
    /// In-flight requests of this gateway process on the worker.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Requests routed to the worker.
    pub fn requests_total(&self) -> u64 {
        self.requests_total.load(Ordering::Relaxed)
    }

    /// Requests spilled onto the worker.
    pub fn spilled_in_total(&self) -> u64 {
        self.spilled_in_total.load(Ordering::Relaxed)
    }

    /// Requests that preferred the worker but spilled elsewhere.
    pub fn spilled_out_total(&self) -> u64 {
        self.spilled_out_total.load(Ordering::Relaxed)
    }

    /// Requests to the worker that ended in a gateway-side error.
    pub fn errors_total(&self) -> u64 {
        self.errors_total.load(Ordering::Relaxed)
    }

    /// The worker's last scrape (reported load), published by the gateway's scraper and read by
    /// the rule in `worker_metrics` mode. Lives with the counters so it survives table swaps.
    pub fn fleet_sample(&self) -> &SampleCell {
        &self.fleet
    }

    /// Counts one gateway-side error (connect failure, timeout, broken stream).
    pub fn record_error(&self) {
        self.errors_total.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_spill_out(&self) {
        self.spilled_out_total.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_spill_in(&self) {
        self.spilled_in_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one unit of load. Only the router calls this, inside its selection step, so that
    /// concurrent selections see each other's load.
    pub(crate) fn acquire(self: &Arc<Self>) -> LoadGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        LoadGuard {
            stats: Arc::clone(self),
        }
    }

    /// Lowers the load by one, saturating at zero: a counter never underflows even if a bug elsewhere
    /// released twice (a guard releases exactly once, so in practice this never saturates).
    fn release(&self) {
        let _ = self
            .active
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// One unit of in-flight load on one worker; dropping it lowers the worker's active counter
/// exactly once.
#[must_use = "dropping the guard immediately ends the request's load"]
#[derive(Debug)]
pub struct LoadGuard {
    stats: Arc<WorkerStats>,
}

impl LoadGuard {
    /// The counters this guard holds load on.
    pub fn stats(&self) -> &Arc<WorkerStats> {
        &self.stats
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.stats.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_releases_once_and_never_underflows() {
        let stats = Arc::new(WorkerStats::default());
        let a = stats.acquire();
        let b = stats.acquire();
        assert_eq!(stats.active(), 2);
        drop(a);
        assert_eq!(stats.active(), 1);
        stats.release();
        stats.release();
        assert_eq!(stats.active(), 0, "saturates at zero");
        drop(b);
        assert_eq!(stats.active(), 0);
        assert_eq!(stats.requests_total(), 2);
    }

    #[test]
    fn guard_released_on_panic_unwind() {
        let stats = Arc::new(WorkerStats::default());
        let s = Arc::clone(&stats);
        let result = std::panic::catch_unwind(move || {
            let _guard = s.acquire();
            panic!("request handler failed");
        });
        assert!(result.is_err());
        assert_eq!(stats.active(), 0);
    }
}
