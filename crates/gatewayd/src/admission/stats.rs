//! The admission counters: requests waiting now, admissions and sheds. The queue is their only
//! writer; the telemetry aggregator and `/metrics` read them. Plain atomics, so a reader never
//! waits for the queue and the queue never waits for a reader.

use std::sync::atomic::{AtomicU64, Ordering};

use bch_core::admission::ShedReason;

/// See the module documentation. One per gateway, shared by both front ends (the data plane and
/// the picker queue into the same queue). All counts are requests.
#[derive(Debug, Default)]
pub struct AdmissionStats {
    waiting: AtomicU64,
    admitted_at_once: AtomicU64,
    admitted_after_waiting: AtomicU64,
    shed: [AtomicU64; ShedReason::ALL.len()],
}

impl AdmissionStats {
    /// Requests waiting in the queue now (they hold no load).
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Requests admitted since start, without waiting and after waiting.
    pub fn admitted_total(&self) -> (u64, u64) {
        (
            self.admitted_at_once.load(Ordering::Relaxed),
            self.admitted_after_waiting.load(Ordering::Relaxed),
        )
    }

    /// Requests shed for `reason` since start.
    pub fn shed_total(&self, reason: ShedReason) -> u64 {
        self.shed[reason as usize].load(Ordering::Relaxed)
    }

    /// A request started waiting.
    pub fn record_wait_started(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A request stopped waiting: admitted, shed, or its client left.
    pub fn record_wait_ended(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// A request was admitted (given a worker), `after_waiting` or at once.
    pub fn record_admitted(&self, after_waiting: bool) {
        let counter = if after_waiting {
            &self.admitted_after_waiting
        } else {
            &self.admitted_at_once
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was shed for `reason`.
    pub fn record_shed(&self, reason: ShedReason) {
        self.shed[reason as usize].fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_per_reason() {
        let stats = AdmissionStats::default();
        stats.record_wait_started();
        stats.record_wait_started();
        stats.record_wait_ended();
        stats.record_admitted(false);
        stats.record_admitted(true);
        stats.record_admitted(true);
        stats.record_shed(ShedReason::QueueFull);
        stats.record_shed(ShedReason::QueueTimeout);
        stats.record_shed(ShedReason::QueueTimeout);
        assert_eq!(stats.waiting(), 1);
        assert_eq!(stats.admitted_total(), (1, 2));
        assert_eq!(stats.shed_total(ShedReason::NoQueue), 0);
        assert_eq!(stats.shed_total(ShedReason::QueueTimeout), 2);
        let sheds: u64 = ShedReason::ALL.iter().map(|&r| stats.shed_total(r)).sum();
        assert_eq!(sheds, 3);
    }
}
