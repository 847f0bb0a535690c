//! Fleet-wide load: what the bounded rule reads when several gateway replicas share one fleet.
//!
//! Each replica counts only its own in-flight requests, so with N replicas each sees about 1/N of a
//! worker's load. The workers know their true load (every serving engine exports running and
//! waiting requests), so in [`LoadSource::WorkerMetrics`] mode the gateway scrapes it and the rule
//! reads, per worker,
//!
//! ```text
//! load = max(local, reported + local − local_at_scrape)
//! ```
//!
//! where `reported` is the worker's running + waiting requests at its last good scrape and
//! `local_at_scrape` this replica's own in-flight count when that scrape was sent. `local −
//! local_at_scrape` is what this replica changed since the scrape: the requests it sent the worker
//! since then (which the report cannot contain yet), net of its requests that ended since (which
//! the report still contains). So one replica alone reads its own count, exactly as in `local`
//! mode (a burst inside one scrape interval splits as it always did), and N replicas see each
//! other's requests within one scrape interval. The floor at `local` keeps a report that lags
//! behind this replica's own requests from hiding them. `docs/replicas.md` has the derivation and
//! what stays approximate.
//!
//! This module is pure: the gateway scrapes and publishes [`FleetSample`]s into each worker's
//! [`SampleCell`] (one atomic word, so the routing decision reads it without a lock and never
//! waits for a scrape); [`fleet_load`] is the formula.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Which per-worker load the bounded rule (and the keyless pick) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadSource {
    /// This process's own in-flight requests (one gateway, or replicas that do not share state).
    #[default]
    Local,
    /// The worker's reported running + waiting requests, corrected by this replica's requests since
    /// the scrape ([`fleet_load`]); a worker without a fresh sample falls back to local load.
    WorkerMetrics,
}

impl LoadSource {
    /// Every source, in documentation order.
    pub const ALL: [LoadSource; 2] = [LoadSource::Local, LoadSource::WorkerMetrics];

    /// The snake-case name used in configuration, JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadSource::Local => "local",
            LoadSource::WorkerMetrics => "worker_metrics",
        }
    }
}

impl fmt::Display for LoadSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name given is not a load source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load_source must be local or worker_metrics; got {0:?}")]
pub struct UnknownLoadSource(pub String);

impl std::str::FromStr for LoadSource {
    type Err = UnknownLoadSource;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LoadSource::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownLoadSource(s.to_owned()))
    }
}

/// Which signal the loads of one decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadSignal {
    /// Every healthy worker's load was this replica's own count: `local` mode, or `worker_metrics`
    /// mode with no fresh sample for any of them.
    #[default]
    Local,
    /// Every healthy worker's load came from a fresh scrape ([`fleet_load`]).
    WorkerMetrics,
    /// Some workers had a fresh sample and some fell back to local load.
    Mixed,
}

impl std::fmt::Display for LoadSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl LoadSignal {
    /// The snake-case name used in JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadSignal::Local => "local",
            LoadSignal::WorkerMetrics => "worker_metrics",
            LoadSignal::Mixed => "mixed",
        }
    }

    /// The signal of a decision that already read `self` and now reads a worker whose load came
    /// from `next`.
    pub fn and(self, next: LoadSignal) -> LoadSignal {
        if self == next {
            self
        } else {
            LoadSignal::Mixed
        }
    }
}

/// One good scrape of a worker: its reported load and this replica's in-flight count on it when the
/// scrape was sent. Counts are requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetSample {
    /// The worker's running + waiting requests, from every gateway replica (and any other client).
    pub reported: u64,
    /// This replica's in-flight requests on the worker when the scrape was sent.
    pub local_at_scrape: u64,
}

impl FleetSample {
    /// The load the rule reads for a worker on which this replica now has `local` requests in
    /// flight: [`fleet_load`] with this sample.
    pub fn load(&self, local: u64) -> u64 {
        self.reported
            .saturating_add(local)
            .saturating_sub(self.local_at_scrape)
            .max(local)
    }

    /// What this replica changed on the worker since the scrape, in requests: positive when it sent
    /// more than ended, negative when more of its requests ended (saturating at the `i64` range).
    pub fn since_scrape(&self, local: u64) -> i64 {
        let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        signed(local).saturating_sub(signed(self.local_at_scrape))
    }
}

/// The load the rule reads for one worker, given this replica's own in-flight requests on it
/// (`local`) and the worker's fresh sample, if any: `max(local, reported + local −
/// local_at_scrape)`, saturating; without a sample, `local`. Never below `local`.
pub fn fleet_load(local: u64, sample: Option<FleetSample>) -> u64 {
    sample.map_or(local, |s| s.load(local))
}

/// Largest reported load a [`SampleCell`] holds (30 bits, about a billion requests); larger reports
/// saturate.
pub const MAX_REPORTED: u64 = (1 << 30) - 1;
/// Largest `local_at_scrape` a [`SampleCell`] holds (32 bits); larger counts saturate.
pub const MAX_LOCAL_AT_SCRAPE: u64 = u32::MAX as u64;

const FRESH: u64 = 1 << 63;
const SEEN: u64 = 1 << 62;
const REPORTED_SHIFT: u32 = 32;

/// A worker's latest sample, published by one writer (the gateway's scraper) and read by routing
/// without a lock: the sample, whether it is fresh, and whether one was ever taken live in one
/// atomic word, so a reader never sees a reported load paired with another scrape's
/// `local_at_scrape`. The wall-clock time of the scrape sits beside it for display only.
#[derive(Debug, Default)]
pub struct SampleCell {
    packed: AtomicU64,
    scraped_at_ms: AtomicU64,
}

/// What a [`SampleCell`] holds, for display: the last good sample, when it was taken and whether
/// the rule still uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastSample {
    /// The sample.
    pub sample: FleetSample,
    /// Wall-clock time the scrape was sent, milliseconds since the Unix epoch, as the gateway
    /// stamped it.
    pub scraped_at_ms: u64,
    /// `false` once the sample grew older than the staleness bound: the rule reads local load.
    pub fresh: bool,
}

impl SampleCell {
    /// Publishes a good scrape taken at `scraped_at_ms` (wall clock, ms); it is fresh until
    /// [`SampleCell::mark_stale`]. Values beyond the cell's fields saturate. A worker of a live
    /// router is published through [`crate::router::Router::publish_sample`] instead, which keeps
    /// the router's fleet aggregates in step (this cell alone does not tell it).
    pub fn publish(&self, sample: FleetSample, scraped_at_ms: u64) {
        let reported = sample.reported.min(MAX_REPORTED);
        let local = sample.local_at_scrape.min(MAX_LOCAL_AT_SCRAPE);
        self.scraped_at_ms.store(scraped_at_ms, Ordering::Relaxed);
        self.packed.store(
            FRESH | SEEN | (reported << REPORTED_SHIFT) | local,
            Ordering::Relaxed,
        );
    }

    /// The sample is too old to route on: the rule falls back to local load. The numbers stay for
    /// display.
    pub fn mark_stale(&self) {
        self.packed.fetch_and(!FRESH, Ordering::Relaxed);
    }

    /// Forgets everything, as if the worker had never been scraped.
    pub fn clear(&self) {
        self.packed.store(0, Ordering::Relaxed);
        self.scraped_at_ms.store(0, Ordering::Relaxed);
    }

    /// The sample the rule reads: `Some` only while fresh. One atomic load.
    pub fn fresh(&self) -> Option<FleetSample> {
        let packed = self.packed.load(Ordering::Relaxed);
        (packed & FRESH != 0).then(|| unpack(packed))
    }

    /// The last good sample, fresh or stale, with its time; `None` if none was ever published
    /// (or it was cleared).
    pub fn last(&self) -> Option<LastSample> {
        let packed = self.packed.load(Ordering::Relaxed);
        (packed & SEEN != 0).then(|| LastSample {
            sample: unpack(packed),
            scraped_at_ms: self.scraped_at_ms.load(Ordering::Relaxed),
            fresh: packed & FRESH != 0,
        })
    }
}

fn unpack(packed: u64) -> FleetSample {
    FleetSample {
        reported: (packed >> REPORTED_SHIFT) & MAX_REPORTED,
        local_at_scrape: packed & MAX_LOCAL_AT_SCRAPE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula_examples() {
        // No sample: local.
        assert_eq!(fleet_load(3, None), 3);
        // One replica, exact report: its own count.
        let alone = FleetSample {
            reported: 4,
            local_at_scrape: 4,
        };
        assert_eq!(alone.load(4), 4);
        assert_eq!(alone.load(6), 6, "two sent since the scrape");
        assert_eq!(alone.load(1), 1, "three of its requests ended since");
        // Three replicas: 5 reported, 2 of them ours at the scrape, one more sent since.
        let shared = FleetSample {
            reported: 5,
            local_at_scrape: 2,
        };
        assert_eq!(shared.load(3), 6);
        assert_eq!(shared.since_scrape(3), 1);
        assert_eq!(shared.since_scrape(0), -2);
        // A report that lags behind our own requests never hides them.
        let lagging = FleetSample {
            reported: 0,
            local_at_scrape: 3,
        };
        assert_eq!(lagging.load(3), 3);
        // Saturation instead of overflow.
        let huge = FleetSample {
            reported: u64::MAX,
            local_at_scrape: 0,
        };
        assert_eq!(huge.load(u64::MAX), u64::MAX);
    }

    /// For every sample a cell holds, the formula is `local + max(0, reported − local_at_scrape)`:
    /// a request taken or released moves the load exactly one step, which the router's kept
    /// aggregates rely on.
    #[test]
    fn a_cell_sample_offsets_local_load_by_a_constant() {
        let edges = [
            0,
            1,
            2,
            7,
            MAX_REPORTED - 1,
            MAX_REPORTED,
            MAX_LOCAL_AT_SCRAPE,
        ];
        let locals = [0, 1, 5, MAX_REPORTED, MAX_LOCAL_AT_SCRAPE, u64::MAX / 2];
        for reported in edges.into_iter().filter(|&r| r <= MAX_REPORTED) {
            for local_at_scrape in edges {
                let sample = FleetSample {
                    reported,
                    local_at_scrape,
                };
                let offset = reported.saturating_sub(local_at_scrape);
                for local in locals {
                    assert_eq!(sample.load(local), local + offset);
                    assert_eq!(sample.load(local + 1), sample.load(local) + 1);
                }
            }
        }
    }

    #[test]
    fn cell_keeps_fresh_stale_and_cleared_apart() {
        let cell = SampleCell::default();
        assert_eq!(cell.fresh(), None);
        assert_eq!(cell.last(), None);
        let sample = FleetSample {
            reported: 7,
            local_at_scrape: 2,
        };
        cell.publish(sample, 1_000);
        assert_eq!(cell.fresh(), Some(sample));
        cell.mark_stale();
        assert_eq!(cell.fresh(), None);
        assert_eq!(
            cell.last(),
            Some(LastSample {
                sample,
                scraped_at_ms: 1_000,
                fresh: false
            })
        );
        cell.publish(
            FleetSample {
                reported: u64::MAX,
                local_at_scrape: u64::MAX,
            },
            2_000,
        );
        let saturated = cell.fresh().unwrap();
        assert_eq!(
            (saturated.reported, saturated.local_at_scrape),
            (MAX_REPORTED, MAX_LOCAL_AT_SCRAPE)
        );
        cell.clear();
        assert_eq!(cell.last(), None);
    }

    #[test]
    fn names_round_trip_and_signals_combine() {
        for source in LoadSource::ALL {
            assert_eq!(source.as_str().parse::<LoadSource>().unwrap(), source);
            assert_eq!(serde_json::to_value(source).unwrap(), source.as_str());
        }
        assert!("prometheus".parse::<LoadSource>().is_err());
        use LoadSignal::*;
        assert_eq!(Local.and(Local), Local);
        assert_eq!(WorkerMetrics.and(WorkerMetrics), WorkerMetrics);
        assert_eq!(Local.and(WorkerMetrics), Mixed);
        assert_eq!(Mixed.and(Local), Mixed);
        for signal in [Local, WorkerMetrics, Mixed] {
            assert_eq!(serde_json::to_value(signal).unwrap(), signal.as_str());
        }
    }
}
