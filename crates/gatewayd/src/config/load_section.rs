//! `[load]`: which per-worker load the bounded rule reads, and how the workers' own gauges are
//! scraped for the fleet-wide load (docs/replicas.md).

use std::time::Duration;

use bch_core::fleet_load::LoadSource;
use serde::{Deserialize, Serialize};

use super::field_error::FieldError;
use super::millis;

/// `[load]`. `source` is switchable at run time (`PUT /admin/policy`, the websocket `set_policy`,
/// a reload); the scrape settings take effect at the next scrape round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadConfig {
    /// `local`: this process's in-flight requests (the default, one gateway). `worker_metrics`:
    /// the workers' reported load, so several replicas decide as one.
    pub source: LoadSource,
    /// `scrape_interval_ms`: time between two scrapes of every worker. Each scrape times out
    /// after 80 % of it, so a hung worker never delays the next round. Scraping runs only while
    /// `source` is `worker_metrics`.
    #[serde(rename = "scrape_interval_ms", with = "millis")]
    pub scrape_interval: Duration,
    /// `stale_after_ms`: a worker whose last good scrape is older than this falls back to local
    /// load. Must exceed `scrape_interval_ms`.
    #[serde(rename = "stale_after_ms", with = "millis")]
    pub stale_after: Duration,
    /// Path of the Prometheus text on every worker without its own `metrics_path`.
    pub metrics_path: String,
    /// Largest metrics body read, bytes; a larger answer counts as a failed scrape.
    pub max_scrape_bytes: usize,
    /// Scrapes started per second at most, over the whole fleet: a round of `workers` scrapes
    /// takes `max(scrape_interval_ms, workers / max_scrapes_per_second)`, its scrapes spread
    /// evenly over it (see [`LoadConfig::round_period`]).
    pub max_scrapes_per_second: u32,
    /// Scrapes in flight at once at most; a scrape whose start comes while this many are running
    /// waits for one to finish (its timeout runs from when it is sent).
    pub max_concurrent_scrapes: usize,
    /// With `waiting_gauge`: the running-requests gauge of an engine not recognised by name (summed
    /// over all its series). When set, the pair is tried before the built-in engines.
    pub running_gauge: Option<String>,
    /// With `running_gauge`: that engine's queued-requests gauge.
    pub waiting_gauge: Option<String>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            source: LoadSource::Local,
            scrape_interval: Duration::from_millis(100),
            stale_after: Duration::from_millis(500),
            metrics_path: "/metrics".to_owned(),
            max_scrape_bytes: 1024 * 1024,
            max_scrapes_per_second: 2_000,
            max_concurrent_scrapes: 256,
            running_gauge: None,
            waiting_gauge: None,
        }
    }
}

/// One hour in ms: the longest `scrape_interval_ms`.
const MAX_MS: u64 = 3_600_000;

/// The shortest `scrape_interval_ms`: scraping every worker faster costs more than it tells.
const MIN_SCRAPE_INTERVAL: Duration = Duration::from_millis(10);

impl LoadConfig {
    /// Checks every value; the first problem is the error, naming the field within `[load]`.
    pub fn validate(&self) -> Result<(), FieldError> {
        let invalid = |field: &str, message: String| Err(FieldError::new(field, message));
        let scrape_interval_ms = millis::as_millis(self.scrape_interval);
        if self.scrape_interval < MIN_SCRAPE_INTERVAL {
            return invalid(
                "scrape_interval_ms",
                "must be at least 10 (ms); scraping every worker faster costs more than it tells"
                    .into(),
            );
        }
        // A load signal older than an hour is no load signal; the bound also keeps the timeout
        // arithmetic far from overflow.
        if scrape_interval_ms > MAX_MS {
            return invalid(
                "scrape_interval_ms",
                format!("must be at most {MAX_MS} (one hour)"),
            );
        }
        if millis::as_millis(self.stale_after) > 24 * MAX_MS {
            return invalid(
                "stale_after_ms",
                format!("must be at most {} (one day)", 24 * MAX_MS),
            );
        }
        if self.stale_after <= self.scrape_interval {
            return invalid(
                "stale_after_ms",
                format!(
                    "must exceed scrape_interval_ms ({scrape_interval_ms}), or every sample would go stale between two scrapes",
                ),
            );
        }
        if !self.metrics_path.starts_with('/') {
            return invalid("metrics_path", "must start with '/'".into());
        }
        if self.max_scrape_bytes == 0 {
            return invalid("max_scrape_bytes", "must be at least 1".into());
        }
        if self.max_scrapes_per_second == 0 {
            return invalid("max_scrapes_per_second", "must be at least 1".into());
        }
        if self.max_concurrent_scrapes == 0 {
            return invalid("max_concurrent_scrapes", "must be at least 1".into());
        }
        match (&self.running_gauge, &self.waiting_gauge) {
            (None, None) => Ok(()),
            (Some(_), None) => invalid(
                "waiting_gauge",
                "must be set together with running_gauge".into(),
            ),
            (None, Some(_)) => invalid(
                "running_gauge",
                "must be set together with waiting_gauge".into(),
            ),
            (Some(running), Some(waiting)) => {
                for (field, name) in [("running_gauge", running), ("waiting_gauge", waiting)] {
                    if !is_metric_name(name) {
                        return invalid(
                            field,
                            format!(
                                "{name:?} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"
                            ),
                        );
                    }
                }
                Ok(())
            }
        }
    }

    /// The custom gauge pair, when both names are set.
    pub fn custom_gauges(&self) -> Option<(&str, &str)> {
        Some((
            self.running_gauge.as_deref()?,
            self.waiting_gauge.as_deref()?,
        ))
    }

    /// How long one round of `workers` scrapes takes: `scrape_interval_ms`, or longer when the
    /// fleet is too large to start every scrape within the interval's first 20 % (the rest is the
    /// last scrape's timeout) under `max_scrapes_per_second`: then `workers /
    /// max_scrapes_per_second` to start them all plus one timeout (10,000 workers at 2,000
    /// scrapes/s and 100 ms: 5.08 s). Each worker is scraped once per round.
    pub fn round_period(&self, workers: usize) -> Duration {
        let rate = u64::from(self.max_scrapes_per_second.max(1));
        let paced = Duration::from_millis((workers as u64).saturating_mul(1_000).div_ceil(rate));
        self.scrape_interval.max(paced + self.scrape_timeout())
    }

    /// The part of a round of `workers` over which its scrapes start, evenly spaced: the round
    /// less one scrape timeout, so the last scrape ends within the round.
    pub fn spread_window(&self, workers: usize) -> Duration {
        self.round_period(workers)
            .saturating_sub(self.scrape_timeout())
    }

    /// The age past which a worker's last good sample is stale, for a round of `workers`:
    /// `stale_after_ms` plus however much longer than `scrape_interval_ms` the round takes, so a
    /// fleet scraped more slowly because of its size is not read as stale between two scrapes.
    pub fn stale_after_for(&self, workers: usize) -> Duration {
        self.stale_after + (self.round_period(workers) - self.scrape_interval)
    }

    /// How long one scrape may take: 80 % of the interval, so a hung worker's timeout never runs
    /// into the next round.
    pub fn scrape_timeout(&self) -> Duration {
        Duration::from_millis(
            (millis::as_millis(self.scrape_interval) / 5)
                .saturating_mul(4)
                .max(1),
        )
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the Prometheus metric name grammar.
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}
