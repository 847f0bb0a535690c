//! What a storm says about overload: how requests split between answers and clean sheds
//! ([`ShedSummary`]: every request in exactly one of answered, shed with `Retry-After`, 503
//! without it, or anything else), goodput against a TTFT objective, the gateway's queue wait, and
//! for an open-loop storm how the sending kept to its schedule ([`OpenLoopReport`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::arrivals::{Arrival, OpenLoop};
use super::shooter::Outcome;
use crate::stats::percentile;

/// Branch name for a shed answer that lacks `x-bch-branch`.
const UNKNOWN: &str = "unknown";

/// Answers against sheds. `answered + shed + shed_without_retry_after + other` is every request:
/// a clean shed leaves the last two at 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShedSummary {
    /// Answered 2xx and read to completion.
    pub answered: u64,
    /// Answered 503 with a `Retry-After` header: shed cleanly.
    pub shed: u64,
    /// Answered 503 without `Retry-After`: a shed the client cannot pace itself by (must be 0).
    pub shed_without_retry_after: u64,
    /// Anything else: another status (a 429 included), a broken answer, no answer (must be 0).
    pub other: u64,
    /// Clean sheds per `x-bch-branch` (`unknown` when absent).
    pub shed_by_branch: BTreeMap<String, u64>,
    /// Clean sheds per `X-SMG-Error-Code` (`unknown` when absent).
    pub shed_by_error_code: BTreeMap<String, u64>,
    /// The TTFT objective goodput is measured against, ms; `None` without `--slo-ttft-ms`.
    pub slo_ttft_ms: Option<f64>,
    /// Answers whose TTFT was within the objective (with an objective).
    pub within_slo: Option<u64>,
    /// `within_slo` per second of the storm's window (open loop: the sending window; closed loop:
    /// the whole storm).
    pub goodput_rps: Option<f64>,
    /// Queue wait the gateway reported in `x-bch-queue-wait-ms`, over the answers and sheds that
    /// carried it; `None` when none did.
    pub queue_wait: Option<WaitSummary>,
}

/// A distribution of waits, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaitSummary {
    /// Requests measured.
    pub samples: usize,
    /// Median (nearest rank), ms.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank), ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
}

impl WaitSummary {
    /// The summary of `values` (ms), `None` when empty.
    fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        Some(Self {
            samples: values.len(),
            p50_ms: percentile(&values, 50.0),
            p99_ms: percentile(&values, 99.0),
            max_ms: *values.last().expect("not empty"),
        })
    }
}

impl ShedSummary {
    /// Splits `outcomes` into answers and sheds; goodput against `slo` per second of `window`.
    pub(super) fn of<'a>(
        outcomes: impl IntoIterator<Item = &'a Outcome>,
        slo: Option<Duration>,
        window: Duration,
    ) -> Self {
        let mut summary = Self::default();
        let mut within = 0;
        let mut waits = Vec::new();
        for o in outcomes {
            waits.extend(o.queue_wait_ms);
            match o.status {
                _ if o.interrupted => summary.other += 1,
                Some(_) if o.ok() => {
                    summary.answered += 1;
                    if let (Some(slo), Some(ttft)) = (slo, o.ttft) {
                        within += u64::from(ttft <= slo);
                    }
                }
                Some(503) if o.retry_after => {
                    summary.shed += 1;
                    let name = |v: &Option<String>| v.clone().unwrap_or_else(|| UNKNOWN.to_owned());
                    *summary.shed_by_branch.entry(name(&o.branch)).or_insert(0) += 1;
                    *summary
                        .shed_by_error_code
                        .entry(name(&o.error_code))
                        .or_insert(0) += 1;
                }
                Some(503) => summary.shed_without_retry_after += 1,
                _ => summary.other += 1,
            }
        }
        if let Some(slo) = slo {
            summary.slo_ttft_ms = Some(slo.as_secs_f64() * 1000.0);
            summary.within_slo = Some(within);
            let seconds = window.as_secs_f64();
            summary.goodput_rps = Some(if seconds > 0.0 {
                within as f64 / seconds
            } else {
                0.0
            });
        }
        summary.queue_wait = WaitSummary::of(waits);
        summary
    }

    /// Requests that did not end as an answer or a clean shed.
    pub fn unclean(&self) -> u64 {
        self.shed_without_retry_after + self.other
    }
}

impl fmt::Display for ShedSummary {
    /// The `answers` line, a loud line when anything was not clean, then goodput and queue wait.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  answers       200 {}   503+Retry-After {}   503 without Retry-After {}   other {}",
            self.answered, self.shed, self.shed_without_retry_after, self.other
        )?;
        if !self.shed_by_branch.is_empty() {
            let branches: Vec<String> = self
                .shed_by_branch
                .iter()
                .map(|(b, n)| format!("{b} {n}"))
                .collect();
            write!(f, "   (sheds: {})", branches.join(", "))?;
        }
        writeln!(f)?;
        if self.unclean() > 0 {
            writeln!(
                f,
                "  NOT CLEAN     {} requests were neither answered nor shed with Retry-After",
                self.unclean()
            )?;
        }
        if let (Some(slo), Some(within), Some(goodput)) =
            (self.slo_ttft_ms, self.within_slo, self.goodput_rps)
        {
            writeln!(
                f,
                "  goodput       {goodput:.1} req/s within TTFT {slo:.0} ms ({within} of {} answers)",
                self.answered
            )?;
        }
        if let Some(w) = &self.queue_wait {
            writeln!(
                f,
                "  queue wait    p50 {:.1} ms   p99 {:.1} ms   max {:.1} ms   ({} requests)",
                w.p50_ms, w.p99_ms, w.max_ms, w.samples
            )?;
        }
        Ok(())
    }
}

/// How an open-loop storm kept to its schedule.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpenLoopReport {
    /// The rate asked, requests per second.
    pub rate_asked: f64,
    /// Requests sent per second of the sending window.
    pub rate_achieved: f64,
    /// The arrival process.
    pub arrival: Arrival,
    /// The sending window: the asked duration, longer when the last send was late, shorter when
    /// the storm was stopped, in seconds.
    pub window_s: f64,
    /// Requests sent.
    pub sent: u64,
    /// How late sends were against their schedule, ms.
    pub late: Option<WaitSummary>,
    /// Most requests in flight at once.
    pub peak_in_flight: usize,
}

impl OpenLoopReport {
    /// The report of `sent` requests of `open_loop` over `window`, each with its lateness.
    pub(super) fn of<'a>(
        open_loop: &OpenLoop,
        outcomes: impl IntoIterator<Item = &'a Outcome>,
        window: Duration,
        peak_in_flight: usize,
    ) -> Self {
        let late: Vec<f64> = outcomes
            .into_iter()
            .filter_map(|o| o.late)
            .map(|l| l.as_secs_f64() * 1000.0)
            .collect();
        let sent = late.len() as u64;
        let seconds = window.as_secs_f64();
        Self {
            rate_asked: open_loop.rate,
            rate_achieved: if seconds > 0.0 {
                sent as f64 / seconds
            } else {
                0.0
            },
            arrival: open_loop.arrival,
            window_s: seconds,
            sent,
            late: WaitSummary::of(late),
            peak_in_flight,
        }
    }
}

impl fmt::Display for OpenLoopReport {
    /// `open loop     rate 40.0 asked, 39.6 achieved ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  open loop     rate {:.1}/s asked, {:.1}/s achieved over {:.1} s   peak in flight {}",
            self.rate_asked, self.rate_achieved, self.window_s, self.peak_in_flight
        )?;
        if let Some(late) = &self.late {
            write!(
                f,
                "   sends late p50 {:.1} ms p99 {:.1} ms max {:.1} ms",
                late.p50_ms, late.p99_ms, late.max_ms
            )?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storm::shooter::NoResponse;

    fn answered(status: u16, retry_after: bool, ttft_ms: u64) -> Outcome {
        Outcome {
            status: Some(status),
            retry_after,
            ttft: (status == 200).then(|| Duration::from_millis(ttft_ms)),
            branch: (status == 503).then(|| "shed_queue_full".to_owned()),
            ..Outcome::default()
        }
    }

    #[test]
    fn every_request_is_an_answer_a_clean_shed_or_unclean_and_goodput_counts_the_slo() {
        let outcomes = [
            answered(200, false, 50),
            answered(200, false, 150),
            answered(503, true, 0),
            answered(503, false, 0),
            answered(429, true, 0),
            Outcome {
                no_response: Some(NoResponse::Refused),
                error: Some("refused".to_owned()),
                ..Outcome::default()
            },
        ];
        let s = ShedSummary::of(
            &outcomes,
            Some(Duration::from_millis(100)),
            Duration::from_secs(2),
        );
        assert_eq!(
            (s.answered, s.shed, s.shed_without_retry_after, s.other),
            (2, 1, 1, 2)
        );
        assert_eq!(s.unclean(), 3);
        assert_eq!((s.within_slo, s.goodput_rps), (Some(1), Some(0.5)));
        assert_eq!(s.shed_by_branch["shed_queue_full"], 1);
        assert!(s.to_string().contains("NOT CLEAN     3 requests"), "{s}");
        let clean = ShedSummary::of(&outcomes[..3], None, Duration::from_secs(1));
        assert!(!clean.to_string().contains("NOT CLEAN"));
        assert_eq!(clean.goodput_rps, None);
    }
}
