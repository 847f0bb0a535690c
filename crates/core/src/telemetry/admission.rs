//! The gateway's admission queue and shedding as the console sees them: one summary in every
//! `tick` and `snapshot` (absent from gateways that predate admission). The settings themselves
//! (capacity per worker, queue timeout) travel in the policy's `admission` object.

use serde::{Deserialize, Serialize};

use crate::admission::ShedReason;

/// Queue length, admissions and sheds of one gateway process. Rates are requests per second
/// averaged over the last second, like [`super::Totals`]; totals count since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct AdmissionSummary {
    /// Requests waiting in the gateway's queue now (they hold no load on any worker).
    pub waiting: u64,
    /// Requests admitted (given a worker, at once or after waiting) per second.
    pub admitted_per_s: f64,
    /// Requests shed (answered `503` with `Retry-After`) per second, every reason.
    pub shed_per_s: f64,
    /// The same shed rate split by reason.
    pub shed_per_s_by_reason: ShedRates,
    /// Requests admitted since start.
    pub admitted_total: u64,
    /// Requests shed since start, every reason.
    pub shed_total: u64,
}

/// One number per [`ShedReason`], named like the reasons on the wire and in `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ShedRates {
    /// `no_queue`: `queue_timeout_ms = 0`, shed at once.
    pub no_queue: f64,
    /// `queue_full`: `max_queued` requests were already waiting.
    pub queue_full: f64,
    /// `queue_timeout`: waited `queue_timeout_ms` without a slot freeing.
    pub queue_timeout: f64,
    /// `shutdown`: waiting (or about to wait) when the gateway began shutting down. Absent from
    /// gateways that predate it (read as 0).
    #[serde(default)]
    pub shutdown: f64,
}

impl ShedRates {
    /// The rate for `reason`.
    pub fn get(&self, reason: ShedReason) -> f64 {
        match reason {
            ShedReason::NoQueue => self.no_queue,
            ShedReason::QueueFull => self.queue_full,
            ShedReason::QueueTimeout => self.queue_timeout,
            ShedReason::Shutdown => self.shutdown,
        }
    }

    /// A mutable reference to the rate for `reason`.
    pub fn get_mut(&mut self, reason: ShedReason) -> &mut f64 {
        match reason {
            ShedReason::NoQueue => &mut self.no_queue,
            ShedReason::QueueFull => &mut self.queue_full,
            ShedReason::QueueTimeout => &mut self.queue_timeout,
            ShedReason::Shutdown => &mut self.shutdown,
        }
    }
}

impl AdmissionSummary {
    /// The summary of several gateway replicas: queue lengths, rates and totals add up (each
    /// replica queues and sheds its own requests).
    pub fn sum<'a>(summaries: impl IntoIterator<Item = &'a AdmissionSummary>) -> AdmissionSummary {
        let mut sum = AdmissionSummary::default();
        for one in summaries {
            sum.waiting += one.waiting;
            sum.admitted_per_s += one.admitted_per_s;
            sum.shed_per_s += one.shed_per_s;
            for reason in ShedReason::ALL {
                *sum.shed_per_s_by_reason.get_mut(reason) += one.shed_per_s_by_reason.get(reason);
            }
            sum.admitted_total += one.admitted_total;
            sum.shed_total += one.shed_total;
        }
        sum
    }
}
