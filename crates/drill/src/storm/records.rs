//! Per-request records of a storm ([`RequestRecord`]), written as JSON lines by `bch-drill storm
//! --records FILE` so a run can be analysed later.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::Instant;

use super::outcomes::Class;
use super::shooter::Outcome;

/// One request of a storm, as it went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestRecord {
    /// When it was sent, ms from the start of the storm; `None` when it never was.
    pub sent_ms: Option<f64>,
    /// Open loop: how long after its scheduled time it was sent, ms.
    pub late_ms: Option<f64>,
    /// The routing key.
    pub key: String,
    /// HTTP status, when an answer came.
    pub status: Option<u16>,
    /// The `x-bch-worker` header.
    pub worker: Option<String>,
    /// The `x-bch-branch` header.
    pub branch: Option<String>,
    /// Time to first token of a 2xx answer, ms.
    pub ttft_ms: Option<f64>,
    /// Time from sending to the end of the answer or the failure, ms.
    pub total_ms: Option<f64>,
    /// The answer carried `Retry-After`.
    pub retry_after: bool,
    /// The `X-SMG-Error-Code` header.
    pub error_code: Option<String>,
    /// The `x-bch-queue-wait-ms` header, ms.
    pub queue_wait_ms: Option<f64>,
    /// Why it has no complete answer (transport error, timeout, broken stream), when it has none.
    pub error: Option<String>,
    /// How it ended: the field of the report's `outcomes` it counts in (`ok`, `http_503`,
    /// `broken`, `refused`, `timed_out`, `transport_error`, `not_sent`, `interrupted`).
    pub class: String,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl RequestRecord {
    /// The record of `outcome`, on key `key`, in a storm that started at `start`.
    pub(super) fn of(key: &str, outcome: &Outcome, start: Instant) -> Self {
        Self {
            sent_ms: outcome
                .sent
                .map(|sent| ms(sent.saturating_duration_since(start))),
            late_ms: outcome.late.map(ms),
            key: key.to_owned(),
            status: outcome.status,
            worker: outcome.worker.clone(),
            branch: outcome.branch.clone(),
            ttft_ms: outcome.ttft.filter(|_| outcome.ok()).map(ms),
            total_ms: outcome.total.map(ms),
            retry_after: outcome.retry_after,
            error_code: outcome.error_code.clone(),
            queue_wait_ms: outcome.queue_wait_ms,
            error: outcome.error.clone(),
            class: Class::of(outcome).name(),
        }
    }
}

/// Writes `records` to `path` as JSON lines, one record a line.
///
/// # Errors
///
/// When the file cannot be created or written.
pub fn write_records(path: &Path, records: &[RequestRecord]) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for record in records {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}
