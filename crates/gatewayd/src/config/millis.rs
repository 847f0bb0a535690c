//! Durations written as whole milliseconds: every `_ms` key of the configuration is a
//! [`Duration`] in the code and an integer in the file. Use it as
//! `#[serde(rename = "interval_ms", with = "crate::config::millis")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Writes `duration` as its whole milliseconds (a duration read from a file always is).
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(as_millis(*duration))
}

/// Reads a non-negative integer of milliseconds; a negative number or a fraction is refused with
/// the file's own "invalid value" message, as the integer field it replaces did.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    u64::deserialize(deserializer).map(Duration::from_millis)
}

/// `duration` in whole milliseconds, saturated at `u64::MAX` (about 584 million years).
pub fn as_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
