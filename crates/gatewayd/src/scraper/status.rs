//! What the scraper knows about each worker beyond its sample: when it last scraped well, how its
//! scrapes have been going (so a change is logged once, not every round), and the counters and
//! engine reports `/metrics` shows.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::gauges::Reading;
use super::scrape::{Failure, ScrapeReason};
use crate::metrics::LabelValue;
use crate::per_worker::WorkerKey;

/// Scrape counters of one worker, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrapeCounts {
    /// Scrapes that gave a load.
    pub ok: u64,
    /// Failed scrapes, indexed by [`ScrapeReason::index`].
    pub failures: [u64; ScrapeReason::ALL.len()],
}

/// A worker's engine report as `/metrics` shows it: what the capacity rule reads, except that a
/// KV-cache usage the engine does not export is absent rather than 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineReading {
    /// Requests waiting in the engine's own queue, every series summed.
    pub waiting: u64,
    /// KV-cache usage, 0..1; `None` when the engine exports no recognised KV gauge.
    pub kv_usage: Option<f64>,
}

impl EngineReading {
    /// The engine report of a good scrape.
    pub fn of(reading: &Reading) -> EngineReading {
        EngineReading {
            waiting: reading.waiting,
            kv_usage: reading.kv_usage,
        }
    }
}

/// Scrape counters of every worker, written by the scraper once per round and read by `/metrics`,
/// and the engine report each worker's rule reads. A plain mutex: neither side is the data path
/// (routing reads the report from the worker's own atomic cell), and each holds it for a copy or a
/// few additions.
#[derive(Debug, Default)]
pub struct ScrapeStats {
    by_worker: Mutex<HashMap<WorkerKey, ScrapeCounts>>,
    engine_reports: Mutex<HashMap<WorkerKey, EngineReading>>,
}

impl ScrapeStats {
    /// The engine report the capacity rule reads for the worker whose key is `key` (a
    /// [`WorkerKey`] or its URL); `None` when it holds none (never scraped well, gone stale, or
    /// not scraping).
    pub fn engine_report(&self, key: &str) -> Option<EngineReading> {
        lock(&self.engine_reports).get(key).copied()
    }

    /// Notes the report the worker's engine cell now holds (`None`: cleared).
    pub(super) fn set_engine_report(&self, key: &WorkerKey, report: Option<EngineReading>) {
        let mut reports = lock(&self.engine_reports);
        match report {
            Some(report) => {
                reports.insert(key.clone(), report);
            }
            None => {
                reports.remove(key);
            }
        }
    }

    /// Forgets every engine report (scraping stopped, every cell cleared).
    pub(super) fn clear_engine_reports(&self) {
        lock(&self.engine_reports).clear();
    }

    /// The counters of the worker whose key is `key` (a [`WorkerKey`] or its URL; zero for one
    /// never scraped).
    pub fn counts(&self, key: &str) -> ScrapeCounts {
        self.lock().get(key).copied().unwrap_or_default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<WorkerKey, ScrapeCounts>> {
        lock(&self.by_worker)
    }

    /// Adds one round's outcomes and forgets workers no longer registered.
    pub(super) fn record_round<'a>(
        &self,
        outcomes: impl IntoIterator<Item = (&'a WorkerKey, Result<(), Failure>)>,
        keep: impl Fn(&WorkerKey) -> bool,
    ) {
        let mut by_worker = self.lock();
        for (key, outcome) in outcomes {
            let counts = by_worker.entry(key.clone()).or_default();
            match outcome {
                Ok(()) => counts.ok += 1,
                Err(failure) => counts.failures[failure.reason().index()] += 1,
            }
        }
        by_worker.retain(|key, _| keep(key));
        drop(by_worker);
        lock(&self.engine_reports).retain(|key, _| keep(key));
    }
}

/// Locks `mutex`, poisoned or not: the maps hold plain numbers, valid after any panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How one worker's scrapes are going, as far as logging is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Never scraped yet.
    Unknown,
    /// The last scrape gave a load.
    Good,
    /// The last scrape failed this way (a 404 and a 503 are different ways).
    Failing(Failure),
}

/// One worker's scrape history: what to log, and whether its sample is still fresh.
#[derive(Debug, Clone, Copy)]
pub(super) struct Track {
    outcome: Outcome,
    last_good: Option<Instant>,
    /// Whether the rule reads this worker's sample (it is fresh); `false` means local load.
    using_sample: bool,
}

impl Default for Track {
    fn default() -> Self {
        Self {
            outcome: Outcome::Unknown,
            last_good: None,
            using_sample: false,
        }
    }
}

/// What changed in one worker's track this round, to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// A good scrape after failures (or the first one).
    Recovered,
    /// The first failure of this kind.
    Failing(Failure),
    /// A fresh sample again (the first one, or after falling back to local load).
    UsingSample,
}

impl Track {
    /// Notes one scrape result (sent at `at`) and answers what to log about it.
    pub(super) fn observe(&mut self, at: Instant, result: Result<(), Failure>) -> Vec<Change> {
        let mut changes = Vec::new();
        match result {
            Ok(()) => {
                if self.outcome != Outcome::Good {
                    if matches!(self.outcome, Outcome::Failing(_)) {
                        changes.push(Change::Recovered);
                    }
                    self.outcome = Outcome::Good;
                }
                self.last_good = Some(at);
                if !self.using_sample {
                    self.using_sample = true;
                    changes.push(Change::UsingSample);
                }
            }
            Err(failure) => {
                let outcome = Outcome::Failing(failure);
                if self.outcome != outcome {
                    self.outcome = outcome;
                    changes.push(Change::Failing(failure));
                }
            }
        }
        changes
    }

    /// Whether the last good scrape is older than `stale_after` at `now`; flips the track to local
    /// load once and says so.
    pub(super) fn went_stale(&mut self, now: Instant, stale_after: std::time::Duration) -> bool {
        let stale = self
            .last_good
            .is_none_or(|at| now.saturating_duration_since(at) > stale_after);
        if stale && self.using_sample {
            self.using_sample = false;
            return true;
        }
        false
    }

    /// Whether the rule reads this worker's sample.
    #[cfg(test)]
    pub(super) fn using_sample(&self) -> bool {
        self.using_sample
    }

    /// The state in words, for the summary of suppressed lines.
    pub(super) fn describe(&self) -> String {
        match (self.outcome, self.using_sample) {
            (Outcome::Unknown, _) => "not scraped yet".to_owned(),
            (Outcome::Good, _) => "scraped well".to_owned(),
            (Outcome::Failing(failure), true) => format!(
                "failing ({}: {failure}), its last good sample still fresh",
                failure.reason().as_str()
            ),
            (Outcome::Failing(failure), false) => format!(
                "failing ({}: {failure}), routed on local load",
                failure.reason().as_str()
            ),
        }
    }

    /// Whether this worker never scraped well.
    pub(super) fn never_good(&self) -> bool {
        self.last_good.is_none()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scraper::gauges::GaugeError;

    #[test]
    fn each_change_is_reported_once() {
        let t0 = Instant::now();
        let stale_after = Duration::from_millis(500);
        let mut track = Track::default();
        let not_found = Err(Failure::Status(404));
        assert_eq!(
            track.observe(t0, not_found),
            vec![Change::Failing(Failure::Status(404))]
        );
        assert_eq!(track.observe(t0, not_found), vec![]);
        // Another status is another way of failing: an operator sees the 503 that followed.
        assert_eq!(
            track.observe(t0, Err(Failure::Status(503))),
            vec![Change::Failing(Failure::Status(503))]
        );
        assert!(
            !track.went_stale(t0, stale_after),
            "never used: nothing to fall back from"
        );
        let garbage = Err(Failure::Gauges(GaugeError::Unparsable));
        assert_eq!(
            track.observe(t0, garbage),
            vec![Change::Failing(Failure::Gauges(GaugeError::Unparsable))]
        );
        assert_eq!(
            track.observe(t0, Ok(())),
            vec![Change::Recovered, Change::UsingSample]
        );
        assert_eq!(track.observe(t0, Ok(())), vec![]);
        assert!(track.using_sample());
        let later = t0 + Duration::from_millis(400);
        assert_eq!(track.observe(later, Err(Failure::Timeout)).len(), 1);
        assert!(
            !track.went_stale(later, stale_after),
            "the last good one is 400 ms old"
        );
        let much_later = t0 + Duration::from_millis(600);
        assert!(track.went_stale(much_later, stale_after));
        assert!(!track.went_stale(much_later, stale_after), "once");
        assert!(!track.using_sample());
        assert_eq!(
            track.observe(much_later, Ok(())),
            vec![Change::Recovered, Change::UsingSample]
        );
    }
}
