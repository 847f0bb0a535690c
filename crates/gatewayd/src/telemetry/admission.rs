//! The admission summary of each tick: the queue's counters ([`AdmissionStats`]) read at the
//! tick, with rates averaged over the same window as the request and spill rates.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bch_core::admission::ShedReason;
use bch_core::telemetry::{AdmissionSummary, ShedRates};
use tokio::time::Instant;

use crate::admission::AdmissionStats;

/// The counters at one tick: admissions (at once plus after waiting) and sheds by reason.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    admitted: u64,
    shed: [u64; ShedReason::ALL.len()],
}

impl Counts {
    fn read(stats: &AdmissionStats) -> Counts {
        let (at_once, after_waiting) = stats.admitted_total();
        Counts {
            admitted: at_once + after_waiting,
            shed: ShedReason::ALL.map(|reason| stats.shed_total(reason)),
        }
    }
}

/// Reads the shared counters at each tick and turns them into an [`AdmissionSummary`].
pub(super) struct AdmissionRates {
    stats: Arc<AdmissionStats>,
    window: Duration,
    /// Counts at recent ticks, oldest first, spanning about `window`; the first is the base.
    samples: VecDeque<(Instant, Counts)>,
}

impl AdmissionRates {
    /// Rates over `window` of `stats`, from now.
    pub(super) fn new(stats: Arc<AdmissionStats>, window: Duration) -> Self {
        let now = Counts::read(&stats);
        Self {
            stats,
            window,
            samples: VecDeque::from([(Instant::now(), now)]),
        }
    }

    /// The summary at `now`, which is remembered as a sample.
    pub(super) fn sample(&mut self, now: Instant) -> AdmissionSummary {
        let counts = Counts::read(&self.stats);
        while self.samples.len() > 1 && now.duration_since(self.samples[1].0) >= self.window {
            self.samples.pop_front();
        }
        let (since, then) = self.samples[0];
        let elapsed = now.duration_since(since).as_secs_f64().max(1e-3);
        self.samples.push_back((now, counts));
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / elapsed;
        let mut by_reason = ShedRates::default();
        for (i, reason) in ShedReason::ALL.into_iter().enumerate() {
            *by_reason.get_mut(reason) = rate(counts.shed[i], then.shed[i]);
        }
        AdmissionSummary {
            waiting: self.stats.waiting(),
            admitted_per_s: rate(counts.admitted, then.admitted),
            shed_per_s: rate(counts.shed.iter().sum(), then.shed.iter().sum()),
            shed_per_s_by_reason: by_reason,
            admitted_total: counts.admitted,
            shed_total: counts.shed.iter().sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_summary_reads_the_queue_counters_as_rates_over_the_window() {
        let stats = Arc::new(AdmissionStats::default());
        let mut rates = AdmissionRates::new(Arc::clone(&stats), Duration::from_secs(1));
        for _ in 0..3 {
            stats.record_wait_started();
        }
        stats.record_admitted(false);
        stats.record_admitted(true);
        for _ in 0..4 {
            stats.record_shed(ShedReason::QueueTimeout);
        }
        stats.record_shed(ShedReason::QueueFull);
        tokio::time::advance(Duration::from_millis(500)).await;
        let summary = rates.sample(Instant::now());
        assert_eq!(summary.waiting, 3);
        assert_eq!(summary.admitted_per_s, 4.0);
        assert_eq!(summary.shed_per_s, 10.0);
        assert_eq!(summary.shed_per_s_by_reason.queue_timeout, 8.0);
        assert_eq!(summary.shed_per_s_by_reason.queue_full, 2.0);
        assert_eq!(summary.shed_per_s_by_reason.no_queue, 0.0);
        assert_eq!((summary.admitted_total, summary.shed_total), (2, 5));
        // Once the burst is older than the window, the rates are back to zero; the totals stay.
        for _ in 0..12 {
            tokio::time::advance(Duration::from_millis(100)).await;
            rates.sample(Instant::now());
        }
        let quiet = rates.sample(Instant::now());
        assert_eq!((quiet.admitted_per_s, quiet.shed_per_s), (0.0, 0.0));
        assert_eq!(quiet.shed_total, 5);
    }
}
