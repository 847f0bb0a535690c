//! Admission settings as A/B cell options: the gateway's `[admission]` fields, sent in the
//! `PUT /admin/policy` body under the key `admission` with the TOML's field names.

use serde::{Deserialize, Serialize};

/// The gateway's admission settings (`[admission]` in its configuration), every field sent so a
/// cell never inherits the previous cell's value. `Default` is admission off: no cap, no queue,
/// no engine-reported saturation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdmissionSettings {
    /// Requests in flight per worker; 0 is no cap.
    pub max_in_flight_per_worker: u64,
    /// How long a request may wait at the gateway for a slot, ms; 0 sheds at once.
    pub queue_timeout_ms: u64,
    /// Requests waiting at once; more are shed at once.
    pub max_queued: u64,
    /// Sent as `Retry-After` (whole seconds, rounded up), ms.
    pub retry_after_ms: u64,
    /// A worker reporting more waiting requests than this is full; 0 is off.
    pub max_waiting: u64,
    /// KV-cache usage, 0 to 1, at or above which a worker is full; 0 is off.
    pub max_kv_usage: f64,
}

impl Default for AdmissionSettings {
    /// Admission off, with the gateway's default queue bound and `Retry-After`.
    fn default() -> Self {
        Self {
            max_in_flight_per_worker: 0,
            queue_timeout_ms: 0,
            max_queued: 1024,
            retry_after_ms: 1000,
            max_waiting: 0,
            max_kv_usage: 0.0,
        }
    }
}

impl AdmissionSettings {
    /// Sets the field `name` (its TOML name) from `value`; `Ok(false)` when `name` is not an
    /// admission field.
    ///
    /// # Errors
    ///
    /// When `value` is not a valid value of the field.
    pub(super) fn set(&mut self, name: &str, value: &str) -> anyhow::Result<bool> {
        let integer = |value: &str| {
            value
                .parse::<u64>()
                .map_err(|_| anyhow::anyhow!("{name} must be an integer >= 0, got {value:?}"))
        };
        match name {
            "max_in_flight_per_worker" => self.max_in_flight_per_worker = integer(value)?,
            "queue_timeout_ms" => self.queue_timeout_ms = integer(value)?,
            "max_queued" => self.max_queued = integer(value)?,
            "retry_after_ms" => self.retry_after_ms = integer(value)?,
            "max_waiting" => self.max_waiting = integer(value)?,
            "max_kv_usage" => {
                let x: f64 = value
                    .parse()
                    .map_err(|_| anyhow::anyhow!("max_kv_usage must be a number, got {value:?}"))?;
                anyhow::ensure!(
                    (0.0..=1.0).contains(&x),
                    "max_kv_usage must be between 0 and 1, got {x}"
                );
                self.max_kv_usage = x;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}
