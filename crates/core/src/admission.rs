//! Admission: how many requests a worker may hold, when an engine says it is saturated, and what a
//! request that finds no room does (docs/policy.md, "Capacity").
//!
//! A worker is *full* when the load the policy reads (this replica's in-flight requests, or the
//! fleet-wide load under `worker_metrics`) is at or above its capacity, or when its engine reports
//! more waiting requests than `max_waiting` or a KV-cache usage at or above `max_kv_usage`. A full
//! worker is not eligible for a new request; [`crate::decide::decide`] applies the rule, this
//! module holds the settings, the engine report a scraper publishes, and the names of a shed.
//!
//! Pure: the gateway's scraper publishes [`EngineReport`]s into each worker's [`EngineCell`] (one
//! atomic word, read by routing without a lock); the queue and the shedding live in the gateway.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Default `max_queued`: requests that may wait at the gateway at once.
pub const DEFAULT_MAX_QUEUED: u64 = 1024;
/// Default `retry_after_ms`, sent as `Retry-After` in whole seconds.
pub const DEFAULT_RETRY_AFTER_MS: u64 = 1000;
/// Upper bound on `queue_timeout_ms` (ten minutes): a waiting request holds a client connection,
/// and no client waits longer for a first byte.
pub const MAX_QUEUE_TIMEOUT_MS: u64 = 600_000;

/// The largest cap a setting may name, in requests: `max_in_flight_per_worker`, a worker's own
/// `max_in_flight` and `max_waiting`. No engine runs a million requests at once (the gateway's
/// scraper refuses gauges above the same figure as implausible), so a larger cap is a typo, and
/// refusing it keeps every count the gateway derives from a cap (gauges, the console's bars)
/// within range.
pub const MAX_CAP: u64 = 1_000_000;

/// The `[admission]` settings, with the TOML's names and units. Published in the routing table
/// with the policy ([`crate::policy::PolicySettings::admission`]), so one decision reads one
/// consistent set. The defaults change nothing: no cap, no engine limits, no queue.
///
/// Read leniently like the policy (missing fields take their defaults, unknown ones are ignored),
/// since consoles read it inside `GET /admin/policy`; changes come in as the strict
/// [`AdmissionPatch`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdmissionSettings {
    /// Requests in flight a worker may hold (the load the policy reads); 0 = no cap. A worker's own
    /// `max_in_flight` overrides it.
    pub max_in_flight_per_worker: u64,
    /// Milliseconds a request may wait at the gateway for a slot; 0 = shed at once. At most
    /// [`MAX_QUEUE_TIMEOUT_MS`].
    pub queue_timeout_ms: u64,
    /// Requests waiting at once; more are shed at once.
    pub max_queued: u64,
    /// Sent as `Retry-After` in whole seconds, rounded up ([`AdmissionSettings::retry_after_secs`]).
    pub retry_after_ms: u64,
    /// Engine-reported: a worker reporting more waiting requests than this is full; 0 = off.
    pub max_waiting: u64,
    /// Engine-reported: KV-cache usage (0..1) at or above which a worker is full; 0.0 = off.
    /// Finite, within `0.0..=1.0`.
    pub max_kv_usage: f64,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings {
            max_in_flight_per_worker: 0,
            queue_timeout_ms: 0,
            max_queued: DEFAULT_MAX_QUEUED,
            retry_after_ms: DEFAULT_RETRY_AFTER_MS,
            max_waiting: 0,
            max_kv_usage: 0.0,
        }
    }
}

/// A partial admission change: any subset of [`AdmissionSettings`]' fields, same names. Carried as
/// `admission` in the policy patch (`PUT /admin/policy`, the websocket `set_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionPatch {
    /// New `max_in_flight_per_worker` (requests; 0 = no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight_per_worker: Option<u64>,
    /// New `queue_timeout_ms` (milliseconds; 0 = shed at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_ms: Option<u64>,
    /// New `max_queued` (requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u64>,
    /// New `retry_after_ms` (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// New `max_waiting` (requests; 0 = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<u64>,
    /// New `max_kv_usage` (0..1; 0 = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_usage: Option<f64>,
}

impl From<AdmissionSettings> for AdmissionPatch {
    /// The patch that sets every field to `settings`' value.
    fn from(settings: AdmissionSettings) -> Self {
        AdmissionPatch {
            max_in_flight_per_worker: Some(settings.max_in_flight_per_worker),
            queue_timeout_ms: Some(settings.queue_timeout_ms),
            max_queued: Some(settings.max_queued),
            retry_after_ms: Some(settings.retry_after_ms),
            max_waiting: Some(settings.max_waiting),
            max_kv_usage: Some(settings.max_kv_usage),
        }
    }
}

/// Why an admission setting was refused. Messages name the field so an operator can fix it.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// `max_kv_usage` was NaN or outside `0.0..=1.0`.
    #[error("max_kv_usage must be a number between 0.0 and 1.0, got {0}")]
    InvalidKvUsage(f64),
    /// `queue_timeout_ms` was above [`MAX_QUEUE_TIMEOUT_MS`].
    #[error("queue_timeout_ms must be at most {MAX_QUEUE_TIMEOUT_MS}, got {0}")]
    InvalidQueueTimeout(u64),
    /// A cap (`max_in_flight_per_worker`, `max_waiting`) was above [`MAX_CAP`].
    #[error("{field} must be at most {MAX_CAP} requests (0 = no cap), got {value}")]
    CapTooLarge {
        /// The field, as `[admission]` spells it.
        field: &'static str,
        /// The value refused.
        value: u64,
    },
}

impl AdmissionError {
    /// The field at fault, as `[admission]` spells it.
    pub fn field(&self) -> &'static str {
        match self {
            AdmissionError::InvalidKvUsage(_) => "max_kv_usage",
            AdmissionError::InvalidQueueTimeout(_) => "queue_timeout_ms",
            AdmissionError::CapTooLarge { field, .. } => field,
        }
    }
}

/// Refuses a cap above [`MAX_CAP`], naming `field`; also for a worker's own `max_in_flight`.
pub fn check_cap(field: &'static str, value: u64) -> Result<(), AdmissionError> {
    if value > MAX_CAP {
        return Err(AdmissionError::CapTooLarge { field, value });
    }
    Ok(())
}

impl AdmissionSettings {
    /// Checks every field; `Ok` means the settings can be put in force.
    pub fn validate(&self) -> Result<(), AdmissionError> {
        if !(0.0..=1.0).contains(&self.max_kv_usage) {
            return Err(AdmissionError::InvalidKvUsage(self.max_kv_usage));
        }
        if self.queue_timeout_ms > MAX_QUEUE_TIMEOUT_MS {
            return Err(AdmissionError::InvalidQueueTimeout(self.queue_timeout_ms));
        }
        for (field, value) in [
            ("max_in_flight_per_worker", self.max_in_flight_per_worker),
            ("max_waiting", self.max_waiting),
        ] {
            check_cap(field, value)?;
        }
        Ok(())
    }

    /// These settings with `patch` applied, validated; `self` is never changed.
    pub fn patched(&self, patch: &AdmissionPatch) -> Result<AdmissionSettings, AdmissionError> {
        let next = AdmissionSettings {
            max_in_flight_per_worker: patch
                .max_in_flight_per_worker
                .unwrap_or(self.max_in_flight_per_worker),
            queue_timeout_ms: patch.queue_timeout_ms.unwrap_or(self.queue_timeout_ms),
            max_queued: patch.max_queued.unwrap_or(self.max_queued),
            retry_after_ms: patch.retry_after_ms.unwrap_or(self.retry_after_ms),
            max_waiting: patch.max_waiting.unwrap_or(self.max_waiting),
            max_kv_usage: patch.max_kv_usage.unwrap_or(self.max_kv_usage),
        };
        next.validate()?;
        Ok(next)
    }

    /// A worker's capacity in requests in flight: its own `max_in_flight` when set, else
    /// `max_in_flight_per_worker`; `None` (no cap) when that is 0.
    pub fn capacity(&self, worker_max_in_flight: Option<u64>) -> Option<u64> {
        let cap = worker_max_in_flight.unwrap_or(self.max_in_flight_per_worker);
        (cap > 0).then_some(cap)
    }

    /// Whether either engine-reported limit is on (`max_waiting` or `max_kv_usage` non-zero).
    pub fn engine_limits(&self) -> bool {
        self.max_waiting > 0 || self.max_kv_usage > 0.0
    }

    /// Whether a worker whose engine reported `report` is full under these limits: more waiting
    /// requests than `max_waiting`, or KV usage at or above `max_kv_usage` (each only when on).
    pub fn engine_full(&self, report: EngineReport) -> bool {
        // Compared at the precision an [`EngineCell`] keeps (f32): the report read back from the
        // cell is the engine's value rounded to the nearest f32, which for 0.9 is just below 0.9
        // as an f64, and "at the limit" must stay full. Rounding is monotone, so nothing at or
        // above the limit reads as below it.
        (self.max_waiting > 0 && report.waiting > self.max_waiting)
            || (self.max_kv_usage > 0.0 && report.kv_usage as f32 >= self.max_kv_usage as f32)
    }

    /// `retry_after_ms` in whole seconds, rounded up: the `Retry-After` header's value.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000)
    }
}

/// What a worker's engine said about its saturation at the last good scrape: waiting requests and
/// KV-cache usage (0..1). The zero report means "nothing reported" and is never full.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct EngineReport {
    /// Requests waiting in the engine's own queue.
    pub waiting: u64,
    /// KV-cache usage, 0..1 (vLLM `kv_cache_usage_perc`, SGLang `token_usage`, llama.cpp
    /// `kv_cache_usage_ratio`).
    pub kv_usage: f64,
}

/// Largest waiting count an [`EngineCell`] holds; larger reports saturate.
pub const MAX_REPORTED_WAITING: u64 = u32::MAX as u64;

/// A worker's latest [`EngineReport`], published by one writer (the scraper) and read by routing
/// without a lock: waiting requests (32 bits, saturating) and KV usage (an `f32`) in one atomic
/// word, so a reader never pairs one scrape's waiting count with another's KV usage.
#[derive(Debug, Default)]
pub struct EngineCell {
    packed: AtomicU64,
}

impl EngineCell {
    /// Publishes a good scrape's report. KV usage is clamped to `0.0..=1.0` (NaN reads as 0).
    pub fn publish(&self, report: EngineReport) {
        let waiting = report.waiting.min(MAX_REPORTED_WAITING);
        let kv = if report.kv_usage.is_nan() {
            0.0
        } else {
            report.kv_usage.clamp(0.0, 1.0)
        };
        let packed = (waiting << 32) | u64::from((kv as f32).to_bits());
        self.packed.store(packed, Ordering::Relaxed);
    }

    /// Forgets the report (the worker went unscraped too long): a stale report must not keep a
    /// worker full.
    pub fn clear(&self) {
        self.packed.store(0, Ordering::Relaxed);
    }

    /// The latest report; the zero report when none is held.
    pub fn get(&self) -> EngineReport {
        let packed = self.packed.load(Ordering::Relaxed);
        EngineReport {
            waiting: packed >> 32,
            kv_usage: f64::from(f32::from_bits(packed as u32)),
        }
    }
}

/// Where a decision that chose no worker for want of room says the request may go once a slot
/// frees ([`crate::decide::Decision::wait`]). The gateway queues it (or sheds it) and runs the
/// decision again at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// Only this worker (index into the table) may take it: an implicit key or a target worker
    /// header, which never move.
    ForWorker(usize),
    /// Any worker with room may take it: an explicit key (which moves) or a keyless request.
    ForAnyWorker,
}

/// Why a request was shed (answered `503` with `Retry-After` instead of being served): the
/// `reason` label of the shed counters and the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShedReason {
    /// `queue_timeout_ms = 0`: no waiting, shed at once.
    NoQueue,
    /// `max_queued` requests were already waiting.
    QueueFull,
    /// The request waited `queue_timeout_ms` without a slot freeing.
    QueueTimeout,
    /// The gateway is shutting down: a waiting request is answered at once rather than cut off
    /// without an answer when the shutdown grace ends, and no request starts waiting.
    Shutdown,
}

impl ShedReason {
    /// Every reason, in documentation order (for metrics pre-registration).
    pub const ALL: [ShedReason; 4] = [
        ShedReason::NoQueue,
        ShedReason::QueueFull,
        ShedReason::QueueTimeout,
        ShedReason::Shutdown,
    ];

    /// The snake-case name used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::NoQueue => "no_queue",
            ShedReason::QueueFull => "queue_full",
            ShedReason::QueueTimeout => "queue_timeout",
            ShedReason::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for ShedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `X-SMG-Error-Code` of a shed answer (SGLang Model Gateway's name for the same answer).
pub const SHED_ERROR_CODE: &str = "worker_overload_protection_shed";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_above_a_million_are_refused_naming_the_field() {
        let base = AdmissionSettings::default();
        for (field, patch) in [
            (
                "max_in_flight_per_worker",
                AdmissionPatch {
                    max_in_flight_per_worker: Some(MAX_CAP + 1),
                    ..Default::default()
                },
            ),
            (
                "max_waiting",
                AdmissionPatch {
                    max_waiting: Some(u64::MAX),
                    ..Default::default()
                },
            ),
        ] {
            let err = base.patched(&patch).unwrap_err();
            assert_eq!(err.field(), field);
            assert!(err.to_string().contains("at most 1000000"), "{err}");
        }
        let at_the_bound = AdmissionPatch {
            max_in_flight_per_worker: Some(MAX_CAP),
            max_waiting: Some(MAX_CAP),
            ..Default::default()
        };
        assert!(base.patched(&at_the_bound).is_ok());
        assert!(check_cap("max_in_flight", MAX_CAP + 1).is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let base = AdmissionSettings::default();
        for bad in [f64::NAN, -0.1, 1.01, f64::INFINITY] {
            let err = base
                .patched(&AdmissionPatch {
                    max_kv_usage: Some(bad),
                    ..Default::default()
                })
                .unwrap_err();
            assert_eq!(err.field(), "max_kv_usage");
            assert!(err.to_string().contains("max_kv_usage"), "{err}");
        }
        let err = base
            .patched(&AdmissionPatch {
                queue_timeout_ms: Some(MAX_QUEUE_TIMEOUT_MS + 1),
                ..Default::default()
            })
            .unwrap_err();
        assert!(err.to_string().contains("queue_timeout_ms"));
        let ok = base
            .patched(&AdmissionPatch {
                max_in_flight_per_worker: Some(4),
                max_kv_usage: Some(1.0),
                ..Default::default()
            })
            .unwrap();
        assert_eq!((ok.max_in_flight_per_worker, ok.max_queued), (4, 1024));
    }

    #[test]
    fn capacity_override_and_zero() {
        let fleet = AdmissionSettings {
            max_in_flight_per_worker: 4,
            ..Default::default()
        };
        assert_eq!(fleet.capacity(None), Some(4));
        assert_eq!(fleet.capacity(Some(2)), Some(2));
        assert_eq!(fleet.capacity(Some(0)), None);
        assert_eq!(AdmissionSettings::default().capacity(None), None);
        assert_eq!(AdmissionSettings::default().capacity(Some(3)), Some(3));
    }

    #[test]
    fn engine_limits_compare_strictly_and_at_or_above() {
        let limits = AdmissionSettings {
            max_waiting: 2,
            max_kv_usage: 0.9,
            ..Default::default()
        };
        let report = |waiting, kv_usage| EngineReport { waiting, kv_usage };
        assert!(!limits.engine_full(report(2, 0.5)));
        assert!(limits.engine_full(report(3, 0.0)));
        assert!(limits.engine_full(report(0, 0.9)));
        assert!(!AdmissionSettings::default().engine_full(report(1000, 1.0)));
        assert!(!AdmissionSettings::default().engine_limits());
    }

    #[test]
    fn a_kv_usage_at_the_limit_is_full_after_the_cell() {
        // The cell keeps KV usage as an f32: 0.9 reads back as 0.89999997…, which must still be
        // "at or above" a max_kv_usage of 0.9.
        let limits = AdmissionSettings {
            max_kv_usage: 0.9,
            ..Default::default()
        };
        let cell = EngineCell::default();
        for (kv_usage, full) in [
            (0.9, true),
            (0.9 + 1e-12, true),
            (0.95, true),
            (0.899, false),
        ] {
            cell.publish(EngineReport {
                waiting: 0,
                kv_usage,
            });
            assert_eq!(limits.engine_full(cell.get()), full, "{kv_usage}");
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        for (ms, secs) in [(0, 0), (1, 1), (1000, 1), (1001, 2), (2500, 3)] {
            let settings = AdmissionSettings {
                retry_after_ms: ms,
                ..Default::default()
            };
            assert_eq!(settings.retry_after_secs(), secs, "{ms} ms");
        }
    }

    #[test]
    fn engine_cell_round_trips_and_clears() {
        let cell = EngineCell::default();
        assert_eq!(cell.get(), EngineReport::default());
        cell.publish(EngineReport {
            waiting: 7,
            kv_usage: 0.75,
        });
        assert_eq!(
            cell.get(),
            EngineReport {
                waiting: 7,
                kv_usage: 0.75
            }
        );
        cell.publish(EngineReport {
            waiting: u64::MAX,
            kv_usage: f64::NAN,
        });
        assert_eq!(cell.get().waiting, MAX_REPORTED_WAITING);
        assert_eq!(cell.get().kv_usage, 0.0);
        cell.clear();
        assert_eq!(cell.get(), EngineReport::default());
    }

    #[test]
    fn settings_read_with_missing_fields_and_refuse_unknown_ones() {
        let read: AdmissionSettings =
            serde_json::from_str(r#"{"max_in_flight_per_worker":8}"#).unwrap();
        assert_eq!(read.max_in_flight_per_worker, 8);
        assert_eq!(read.max_queued, DEFAULT_MAX_QUEUED);
        assert!(serde_json::from_str::<AdmissionPatch>(r#"{"max_inflight":8}"#).is_err());
    }
}
