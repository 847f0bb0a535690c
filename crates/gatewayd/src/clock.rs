//! The wall clock in the unit the wire, the worker records and the scraper share. A leaf module:
//! metrics, telemetry and the load scraper all read it, so it cannot live in any one of them
//! without tying them into a cycle.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 if the clock is set before it.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
