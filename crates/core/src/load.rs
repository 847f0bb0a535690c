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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::admission::EngineCell;
use crate::fleet_load::SampleCell;

/// Counters of one worker. All counts are requests unless named otherwise.
#[derive(Debug, Default)]
pub struct WorkerStats {
    active: AtomicU64,
    requests_total: AtomicU64,
    spilled_in_total: AtomicU64,
    spilled_out_total: AtomicU64,
    errors_total: AtomicU64,
    fleet: SampleCell,
    engine: EngineCell,
    health_changes_total: AtomicU64,
    responses: [AtomicU64; StatusClass::ALL.len()],
    durations: DurationHistogram,
    /// The worker's index in its router's table in force, plus one; 0 when it is in none (removed,
    /// or never in a router). Written and read only under the router's selection lock, so a
    /// release finds which worker of the current table it lowers.
    slot: AtomicUsize,
    /// Why the worker's probes fail, while they do (set by the gateway's prober).
    probe_failure: arc_swap::ArcSwapOption<String>,
    /// What the worker's own `/v1/models` listed at its last answer (set by the gateway's prober
    /// when it learns models).
    reported_models: arc_swap::ArcSwapOption<Vec<String>>,
}

/// What a guard calls instead of lowering the counter itself: the router lowers it inside its
/// selection step, so the fleet aggregates it keeps move with the load (see the router's module
/// documentation).
pub(crate) trait Release: Send + Sync + std::fmt::Debug {
    /// Lowers `stats`' load by one (saturating at zero) and reports the change.
    fn release(&self, stats: &WorkerStats);
}

/// The class of the HTTP status a client was answered with, the label of per-status counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// 1xx (or a status outside 100..=599).
    Informational,
    /// 2xx.
    Success,
    /// 3xx.
    Redirection,
    /// 4xx.
    ClientError,
    /// 5xx.
    ServerError,
    /// No status was sent: the client left before the response head.
    None,
}

impl StatusClass {
    /// Every class, in label order.
    pub const ALL: [StatusClass; 6] = [
        StatusClass::Informational,
        StatusClass::Success,
        StatusClass::Redirection,
        StatusClass::ClientError,
        StatusClass::ServerError,
        StatusClass::None,
    ];

    /// The class of HTTP status `status`; 0 means none was sent.
    pub fn of(status: u16) -> StatusClass {
        match status {
            0 => StatusClass::None,
            200..=299 => StatusClass::Success,
            300..=399 => StatusClass::Redirection,
            400..=499 => StatusClass::ClientError,
            500..=599 => StatusClass::ServerError,
            _ => StatusClass::Informational,
        }
    }

    /// The label value: `1xx` … `5xx`, or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusClass::Informational => "1xx",
            StatusClass::Success => "2xx",
            StatusClass::Redirection => "3xx",
            StatusClass::ClientError => "4xx",
            StatusClass::ServerError => "5xx",
            StatusClass::None => "none",
        }
    }

    /// Position in [`StatusClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Upper bounds of [`DurationHistogram`]'s buckets: 1 ms doubling to about 524 s, the range of LLM
/// requests from an instant cache hit to a long generation.
pub const DURATION_BUCKETS: usize = 20;

/// The upper bound of bucket `i` of a [`DurationHistogram`], seconds.
pub fn duration_bucket_bound(i: usize) -> f64 {
    0.001 * f64::from(1u32 << i.min(31))
}

/// A lock-free histogram of request durations: [`DURATION_BUCKETS`] buckets plus one above the
/// last bound, and a sum in microseconds. An observation is two relaxed atomic adds, so the data
/// path can keep one per worker.
#[derive(Debug, Default)]
pub struct DurationHistogram {
    buckets: [AtomicU64; DURATION_BUCKETS],
    /// Observations above the last bound.
    overflow: AtomicU64,
    sum_micros: AtomicU64,
}

impl DurationHistogram {
    /// Counts one observation of `seconds` (negative and NaN count as 0).
    pub fn observe(&self, seconds: f64) {
        let seconds = if seconds.is_finite() && seconds > 0.0 {
            seconds
        } else {
            0.0
        };
        let slot = (0..DURATION_BUCKETS).find(|&i| seconds <= duration_bucket_bound(i));
        match slot {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    /// `(sum in seconds, count, (upper bound, observations in this bucket only))`, the last
    /// bucket's bound being infinity: the shape prometheus-client's encoder takes (it sums them).
    pub fn read(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut buckets: Vec<(f64, u64)> = (0..DURATION_BUCKETS)
            .map(|i| {
                (
                    duration_bucket_bound(i),
                    self.buckets[i].load(Ordering::Relaxed),
                )
            })
            .collect();
        buckets.push((f64::INFINITY, self.overflow.load(Ordering::Relaxed)));
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        (sum, count, buckets)
    }
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

    /// How often the worker's health flipped (healthy to unhealthy or back): a flapping worker
    /// shows as a fast-growing count.
    pub fn health_changes_total(&self) -> u64 {
        self.health_changes_total.load(Ordering::Relaxed)
    }

    /// Responses to requests routed to the worker whose status was of class `class`.
    pub fn responses_total(&self, class: StatusClass) -> u64 {
        self.responses[class.index()].load(Ordering::Relaxed)
    }

    /// Durations of the requests routed to the worker, until their last byte.
    pub fn durations(&self) -> &DurationHistogram {
        &self.durations
    }

    /// Counts the end of one request routed to the worker: the status class the client got and
    /// how long the request took, seconds.
    pub fn record_response(&self, class: StatusClass, seconds: f64) {
        self.responses[class.index()].fetch_add(1, Ordering::Relaxed);
        self.durations.observe(seconds);
    }

    /// Why the worker's last health probe failed (`None` once one passes): the gateway's words,
    /// shown in the worker's record. Written by the prober only, off the request path.
    pub fn set_probe_failure(&self, reason: Option<&str>) {
        if self.probe_failure.load().as_deref().map(String::as_str) != reason {
            self.probe_failure
                .store(reason.map(|reason| std::sync::Arc::new(reason.to_owned())));
        }
    }

    /// The reason set by [`WorkerStats::set_probe_failure`].
    pub fn probe_failure(&self) -> Option<String> {
        self.probe_failure.load().as_deref().cloned()
    }

    /// Records what the worker's `GET /v1/models` listed (sorted, deduplicated by the caller).
    /// Written by the prober only, off the request path; a failed ask leaves the last list.
    pub fn set_reported_models(&self, models: Vec<String>) {
        if self.reported_models.load().as_deref() != Some(&models) {
            self.reported_models
                .store(Some(std::sync::Arc::new(models)));
        }
    }

    /// The list set by [`WorkerStats::set_reported_models`]; `None` until the worker answered.
    pub fn reported_models(&self) -> Option<Vec<String>> {
        self.reported_models.load().as_deref().cloned()
    }

    pub(crate) fn record_health_change(&self) {
        self.health_changes_total.fetch_add(1, Ordering::Relaxed);
    }

    /// The worker's last scrape (reported load), published by the gateway's scraper and read by
    /// the rule in `worker_metrics` mode. Lives with the counters so it survives table swaps.
    pub fn fleet_sample(&self) -> &SampleCell {
        &self.fleet
    }

    /// The worker's last engine report (waiting requests, KV usage), published by the gateway's
    /// scraper and compared by routing with `max_waiting` and `max_kv_usage`. Lives with the
    /// counters so it survives table swaps.
    pub fn engine_report(&self) -> &EngineCell {
        &self.engine
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

    /// Takes one unit of load and returns the guard with the load before it. Only the router
    /// calls this, inside its selection step, so that concurrent selections see each other's
    /// load; `release`, when given, lowers it again when the guard drops.
    pub(crate) fn acquire(self: &Arc<Self>, release: Option<Arc<dyn Release>>) -> (LoadGuard, u64) {
        let before = self.active.fetch_add(1, Ordering::Relaxed);
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        let guard = LoadGuard {
            stats: Arc::clone(self),
            release,
        };
        (guard, before)
    }

    /// Lowers the load by one, saturating at zero: a counter never underflows even if a bug elsewhere
    /// released twice (a guard releases exactly once, so in practice this never saturates). Returns
    /// the load before, `None` when it was already zero.
    pub(crate) fn release(&self) -> Option<u64> {
        self.active
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .ok()
    }

    /// The worker's index in its router's table in force; `None` when it is in none.
    pub(crate) fn slot(&self) -> Option<usize> {
        self.slot.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Records the worker's index in its router's table in force (`None`: in none).
    pub(crate) fn set_slot(&self, slot: Option<usize>) {
        self.slot
            .store(slot.map_or(0, |index| index + 1), Ordering::Relaxed);
    }
}

/// One unit of in-flight load on one worker; dropping it lowers the worker's active counter
/// exactly once.
#[must_use = "dropping the guard immediately ends the request's load"]
#[derive(Debug)]
pub struct LoadGuard {
    stats: Arc<WorkerStats>,
    /// Who lowers the counter on drop (the router that took the load); `None`: the guard does.
    release: Option<Arc<dyn Release>>,
}

impl LoadGuard {
    /// The counters this guard holds load on.
    pub fn stats(&self) -> &Arc<WorkerStats> {
        &self.stats
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        match &self.release {
            Some(release) => release.release(&self.stats),
            None => {
                self.stats.release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_releases_once_and_never_underflows() {
        let stats = Arc::new(WorkerStats::default());
        let (a, _) = stats.acquire(None);
        let (b, before) = stats.acquire(None);
        assert_eq!(before, 1);
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
    fn status_classes_and_duration_buckets() {
        assert_eq!(StatusClass::of(204), StatusClass::Success);
        assert_eq!(StatusClass::of(503), StatusClass::ServerError);
        assert_eq!(StatusClass::of(0), StatusClass::None);
        assert_eq!(StatusClass::of(101).as_str(), "1xx");
        for (i, class) in StatusClass::ALL.iter().enumerate() {
            assert_eq!(class.index(), i);
        }
        let stats = WorkerStats::default();
        stats.record_response(StatusClass::Success, 0.0015);
        stats.record_response(StatusClass::Success, 0.001);
        stats.record_response(StatusClass::ServerError, 10_000.0);
        assert_eq!(stats.responses_total(StatusClass::Success), 2);
        let (sum, count, buckets) = stats.durations().read();
        assert_eq!(count, 3);
        assert!((sum - 10_000.002_5).abs() < 1e-3, "{sum}");
        assert_eq!(buckets[0], (0.001, 1), "1 ms is inside the first bucket");
        assert_eq!(
            buckets[1],
            (0.002, 1),
            "counts per bucket; the encoder sums them"
        );
        assert_eq!(buckets.len(), DURATION_BUCKETS + 1);
        assert_eq!(
            buckets[DURATION_BUCKETS],
            (f64::INFINITY, 1),
            "the 10,000 s one is above every bound"
        );
    }

    #[test]
    fn guard_released_on_panic_unwind() {
        let stats = Arc::new(WorkerStats::default());
        let s = Arc::clone(&stats);
        let result = std::panic::catch_unwind(move || {
            let _guard = s.acquire(None);
            panic!("request handler failed");
        });
        assert!(result.is_err());
        assert_eq!(stats.active(), 0);
    }
}
