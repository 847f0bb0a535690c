//! Admission settings as A/B cell options: bch-core's [`AdmissionSettings`] (the gateway's
//! `[admission]`), set field by field from `name=value` options and sent in the
//! `PUT /admin/policy` body under the key `admission`, with the TOML's field names. Every field is
//! sent so a cell never inherits the previous cell's value; the core type's `Default` is
//! admission off (no cap, no queue wait, no engine-reported saturation).

use bch_core::admission::AdmissionSettings;

/// Sets the field `name` (its TOML name) of `settings` from `value`; `Ok(false)` when `name` is
/// not an admission field. The result is checked by the core's own rules, the ones the gateway
/// applies, so a cell the gateway would refuse is refused before any run.
///
/// # Errors
///
/// When `value` does not parse as the field's type, or the field's new value is out of range.
pub(super) fn set_field(
    settings: &mut AdmissionSettings,
    name: &str,
    value: &str,
) -> anyhow::Result<bool> {
    let integer = |value: &str| {
        value
            .parse::<u64>()
            .map_err(|_| anyhow::anyhow!("{name} must be an integer >= 0, got {value:?}"))
    };
    match name {
        "max_in_flight_per_worker" => settings.max_in_flight_per_worker = integer(value)?,
        "queue_timeout_ms" => settings.queue_timeout_ms = integer(value)?,
        "max_queued" => settings.max_queued = integer(value)?,
        "retry_after_ms" => settings.retry_after_ms = integer(value)?,
        "max_waiting" => settings.max_waiting = integer(value)?,
        "max_kv_usage" => {
            settings.max_kv_usage = value
                .parse()
                .map_err(|_| anyhow::anyhow!("max_kv_usage must be a number, got {value:?}"))?;
        }
        _ => return Ok(false),
    }
    settings.validate()?;
    Ok(true)
}
