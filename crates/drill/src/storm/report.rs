//! What a measured storm reports: totals, throughput, TTFT, placement, branches, cache reuse and the
//! drain check ([`StormReport`], serialised as `--out` JSON), how outcomes are folded into it, and
//! its human-readable form.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use bch_core::policy::Branch;
use serde::Serialize;

use super::arrivals::OpenLoop;
use super::outcomes::{OutcomeCounts, ReplicaOutcomes, per_replica};
use super::overload::{OpenLoopReport, ShedSummary};
use super::records::RequestRecord;
use super::shape::StormShape;
use super::shooter::Outcome;
use crate::control::{DrainCheck, ReplicaDrain};
use crate::stats::{mean, percentile};

/// Placement and branch name used when a response lacks the gateway's header (a storm aimed straight
/// at a worker, or an error from something in between).
const UNKNOWN: &str = "unknown";

/// Error messages kept in a report: enough to see the kinds of failure without flooding it.
const ERROR_SAMPLES: usize = 5;

/// What a TTFT measures, which depends on whether the storm streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TtftBasis {
    /// Streaming: from just before the request is sent until the first SSE `data:` line arrives
    /// (not the response headers, which servers send before queueing and prefill).
    FirstSseData,
    /// Non-streaming: the full response time, request sent to last body byte.
    FullResponse,
}

/// Time to first token over the successful requests, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TtftSummary {
    /// What the times measure: first SSE data line or whole response.
    pub basis: TtftBasis,
    /// Requests measured (the successful ones).
    pub samples: usize,
    /// Arithmetic mean, ms; 0 without samples.
    pub mean_ms: f64,
    /// Median (nearest rank, an observed value), ms.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank, an observed value), ms.
    pub p99_ms: f64,
}

/// Everything a measured storm observed. It serialises to the `--out` JSON, and `Display` prints the
/// summary `bch-drill storm` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormReport {
    /// The storm as configured.
    pub shape: StormShape,
    /// Requests started (all `groups × siblings` of the shape unless the storm was interrupted).
    pub requests: u64,
    /// True when the storm was stopped early (Ctrl-C): groups not started yet were never sent,
    /// and the requests in flight were abandoned (`outcomes.interrupted`).
    pub interrupted: bool,
    /// Requests answered 2xx and read to completion (streams up to `data: [DONE]`).
    pub ok: u64,
    /// How every request ended, each in exactly one class: these add up to `requests`.
    pub outcomes: OutcomeCounts,
    /// Per gateway replica, in the order given: how its requests ended, and whether it was
    /// ejected for refusing connections.
    pub per_replica: Vec<ReplicaOutcomes>,
    /// Requests whose connection a replica refused and that were sent to another replica (only
    /// with `eject_refused_replicas`); each counts once, in `outcomes`, by how it finally ended.
    pub refused_and_resent: u64,
    /// Responses per HTTP status, a 2xx whose answer then broke included.
    pub status_counts: BTreeMap<u16, u64>,
    /// Requests without a complete answer other than a non-2xx status: broken answers, refused
    /// connections, timeouts, other transport errors, and requests never sent.
    pub errors: u64,
    /// Up to five distinct error messages.
    pub error_samples: Vec<String>,
    /// Wall time of the whole storm, in seconds.
    pub duration_s: f64,
    /// `ok / duration_s`: completed requests per second.
    pub throughput_rps: f64,
    /// Time to first token of the successful requests, ms.
    pub ttft: TtftSummary,
    /// Per routing key: worker (from `x-bch-worker`) → responses it answered (a gateway's own
    /// error, without the header, is placed nowhere).
    pub placement: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per worker (from `x-bch-worker`; `unknown` for a 2xx without it): responses it answered.
    pub per_worker: BTreeMap<String, u64>,
    /// Largest share of the placed responses (`per_worker`) served by one worker, 0 to 1
    /// (1/workers is perfectly even).
    pub hottest_worker_share: f64,
    /// Second-largest share of the placed responses served by one worker, 0 to 1: under a hot
    /// key, how much of its overflow piled onto one other worker (the spill cascade).
    pub second_hottest_worker_share: f64,
    /// Per branch (from `x-bch-branch`, `unknown` when absent): responses.
    pub branches: BTreeMap<String, u64>,
    /// Share of the placed responses (those a worker answered), 0 to 1, whose branch moved them
    /// off their preferred worker: `explicit_routing_key_spillover` (the bound) or
    /// `explicit_routing_key_capacity_spill` (a full worker); a gateway's own error (no worker)
    /// routed nothing.
    pub spill_fraction: f64,
    /// Sum of `usage.prompt_tokens` over successful requests, in tokens.
    pub prompt_tokens: u64,
    /// Sum of `usage.prompt_tokens_details.cached_tokens` over successful requests, in tokens.
    pub cached_tokens: u64,
    /// Sum of `usage.completion_tokens` over successful requests, in tokens.
    pub completion_tokens: u64,
    /// `cached_tokens / prompt_tokens`, 0 to 1 (0 without prompt tokens).
    pub cached_token_fraction: f64,
    /// Successful responses that reported their cached tokens (`usage.prompt_tokens_details.
    /// cached_tokens`, or llama.cpp's `timings.cache_n`). 0 means the server reports none, and
    /// `cached_token_fraction` is unknown rather than 0.
    pub cached_reported: u64,
    /// Whether every worker's `active` returned to 0 (only with a control URL).
    pub drain: Option<DrainCheck>,
    /// Answers against clean sheds, goodput and the gateway's queue wait.
    pub overload: ShedSummary,
    /// Open loop: how the sending kept to its schedule.
    pub open_loop: Option<OpenLoopReport>,
    /// Every request as it went, in send order (`bch-drill storm --records`); not in the JSON
    /// report.
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
}

/// Running totals over outcomes, folded into a [`StormReport`] at the end.
#[derive(Default)]
struct Tally {
    status_counts: BTreeMap<u16, u64>,
    placement: BTreeMap<String, BTreeMap<String, u64>>,
    per_worker: BTreeMap<String, u64>,
    branches: BTreeMap<String, u64>,
    error_samples: Vec<String>,
    outcomes: OutcomeCounts,
    /// Responses a worker answered (counted in `per_worker`): the denominator of the worker
    /// shares and of the spill share.
    placed: u64,
    spilled: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
    cached_reported: u64,
    ttfts_ms: Vec<f64>,
}

impl Tally {
    fn add(&mut self, key: &str, o: &Outcome) {
        self.outcomes.add(o);
        if let Some(status) = o.status {
            self.add_response(key, status, o);
        }
        if let Some(e) = &o.error
            && self.error_samples.len() < ERROR_SAMPLES
            && !self.error_samples.contains(e)
        {
            self.error_samples.push(e.clone());
        }
        if o.ok() {
            self.ttfts_ms
                .extend(o.ttft.map(|t| t.as_secs_f64() * 1000.0));
            self.prompt_tokens += o.prompt_tokens;
            self.cached_tokens += o.cached_tokens;
            self.completion_tokens += o.completion_tokens;
            self.cached_reported += u64::from(o.cached_reported);
        }
    }

    /// Status, placement and branch of an outcome that got a response, successful or not. A
    /// response is placed on a worker when it names one (`x-bch-worker`), or under `unknown`
    /// when it is a 2xx without the header (a storm straight at a worker); an error without it
    /// is the gateway's own answer (no healthy worker, a refused request), placed nowhere.
    fn add_response(&mut self, key: &str, status: u16, o: &Outcome) {
        *self.status_counts.entry(status).or_insert(0) += 1;
        let worker = match &o.worker {
            Some(worker) => Some(worker.clone()),
            None if (200..300).contains(&status) => Some(UNKNOWN.to_owned()),
            None => None,
        };
        if let Some(worker) = worker {
            self.placed += 1;
            *self
                .placement
                .entry(key.to_owned())
                .or_default()
                .entry(worker.clone())
                .or_insert(0) += 1;
            *self.per_worker.entry(worker).or_insert(0) += 1;
        }
        let branch = o.branch.as_deref().unwrap_or(UNKNOWN);
        // Spills by the bound and capacity spills both moved the request off its preferred
        // worker (bch-core's `Branch::moved`); an unknown name from a newer gateway moved nothing
        // we can tell.
        if Branch::ALL
            .iter()
            .any(|b| b.moved() && b.as_str() == branch)
        {
            self.spilled += 1;
        }
        *self.branches.entry(branch.to_owned()).or_insert(0) += 1;
    }

    fn into_report(
        self,
        shape: StormShape,
        requests: usize,
        duration: Duration,
        drain: Option<DrainCheck>,
        per_replica: Vec<ReplicaOutcomes>,
        interrupted: bool,
    ) -> StormReport {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let seconds = duration.as_secs_f64();
        let mut served: Vec<u64> = self.per_worker.values().copied().collect();
        served.sort_unstable_by(|a, b| b.cmp(a));
        let hottest = served.first().copied().unwrap_or(0);
        let second = served.get(1).copied().unwrap_or(0);
        StormReport {
            requests: requests as u64,
            interrupted,
            ok: self.outcomes.ok,
            errors: self.outcomes.errors(),
            refused_and_resent: per_replica.iter().map(|r| r.refused_and_resent).sum(),
            per_replica,
            status_counts: self.status_counts,
            error_samples: self.error_samples,
            duration_s: seconds,
            throughput_rps: if seconds > 0.0 {
                self.outcomes.ok as f64 / seconds
            } else {
                0.0
            },
            ttft: ttft_summary(shape.stream, self.ttfts_ms),
            placement: self.placement,
            hottest_worker_share: ratio(hottest, self.placed),
            second_hottest_worker_share: ratio(second, self.placed),
            per_worker: self.per_worker,
            branches: self.branches,
            spill_fraction: ratio(self.spilled, self.placed),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.completion_tokens,
            cached_token_fraction: ratio(self.cached_tokens, self.prompt_tokens),
            cached_reported: self.cached_reported,
            outcomes: self.outcomes,
            drain,
            shape,
            overload: ShedSummary::default(),
            open_loop: None,
            records: Vec::new(),
        }
    }
}

fn ttft_summary(stream: bool, mut ttfts_ms: Vec<f64>) -> TtftSummary {
    ttfts_ms.sort_by(f64::total_cmp);
    TtftSummary {
        basis: if stream {
            TtftBasis::FirstSseData
        } else {
            TtftBasis::FullResponse
        },
        samples: ttfts_ms.len(),
        mean_ms: mean(&ttfts_ms),
        p50_ms: percentile(&ttfts_ms, 50.0),
        p99_ms: percentile(&ttfts_ms, 99.0),
    }
}

/// What a storm observed besides its outcomes, for [`summarise`].
pub(super) struct Observed {
    /// Data-plane URL of each replica, in the order given.
    pub(super) gateways: Vec<String>,
    /// Per replica: when it was ejected, in seconds from the start; `None` if never.
    pub(super) ejections: Vec<Option<f64>>,
    /// The storm was stopped before its last group.
    pub(super) interrupted: bool,
    /// Wall time of the storm.
    pub(super) duration: Duration,
    /// The drain check, when a control plane was given.
    pub(super) drain: Option<DrainCheck>,
    /// When the storm started, for the records' send times.
    pub(super) start: Instant,
    /// The TTFT objective of goodput.
    pub(super) slo_ttft: Option<Duration>,
    /// Open loop: its settings, sending window and peak in flight.
    pub(super) open_loop: Option<(OpenLoop, Duration, usize)>,
}

/// Folds a storm's outcomes, each with the index of its routing key in `keys`, into its report.
pub(super) fn summarise(
    shape: StormShape,
    keys: &[String],
    outcomes: &[(usize, Outcome)],
    observed: Observed,
) -> StormReport {
    let mut tally = Tally::default();
    for (key, o) in outcomes {
        tally.add(&keys[*key], o);
    }
    let replicas = per_replica(
        &observed.gateways,
        outcomes.iter().map(|(_, o)| o),
        &observed.ejections,
    );
    let window = observed.open_loop.map_or(observed.duration, |(_, w, _)| w);
    let all = || outcomes.iter().map(|(_, o)| o);
    let mut report = tally.into_report(
        shape,
        outcomes.len(),
        observed.duration,
        observed.drain,
        replicas,
        observed.interrupted,
    );
    report.overload = ShedSummary::of(all(), observed.slo_ttft, window);
    report.open_loop = observed
        .open_loop
        .map(|(o, window, peak)| OpenLoopReport::of(&o, all(), window, peak));
    report.records = outcomes
        .iter()
        .map(|(key, o)| RequestRecord::of(&keys[*key], o, observed.start))
        .collect();
    report
}

impl fmt::Display for StormReport {
    /// A readable summary: totals, TTFT, cache, spill, placement and drain.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_shape(f)?;
        self.fmt_totals(f)?;
        self.fmt_replicas(f)?;
        self.fmt_placement(f)?;
        self.fmt_drain(f)
    }
}

impl StormReport {
    fn fmt_shape(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shape;
        let replicas = if s.replicas > 1 {
            format!(" (round-robin over {} replicas)", s.replicas)
        } else {
            String::new()
        };
        writeln!(
            f,
            "storm: {} requests to {}{replicas} ({s})",
            self.requests, s.gateway
        )?;
        if self.interrupted && s.open_loop.is_some() {
            writeln!(
                f,
                "  INTERRUPTED   after {:.2} s: sending stopped; those in flight were abandoned",
                self.duration_s
            )?;
        } else if self.interrupted {
            writeln!(
                f,
                "  INTERRUPTED   after {:.2} s: {} of {} requests started; those in flight were abandoned",
                self.duration_s,
                self.requests,
                s.groups * s.siblings
            )?;
        }
        Ok(())
    }

    /// Outcome, duration, TTFT, cache and spill lines. The outcome line names every class of
    /// [`OutcomeCounts`] that has requests, so its counts add up to the requests sent.
    fn fmt_totals(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  outcomes      {}", self.outcomes)?;
        write!(f, "{}", self.overload)?;
        if let Some(open_loop) = &self.open_loop {
            write!(f, "{open_loop}")?;
        }
        if self.refused_and_resent > 0 {
            writeln!(
                f,
                "    ({} refused connections resent to another replica, counted where they ended)",
                self.refused_and_resent
            )?;
        }
        for e in &self.error_samples {
            writeln!(f, "    error: {e}")?;
        }
        writeln!(
            f,
            "  duration      {:.2} s   throughput {:.1} req/s",
            self.duration_s, self.throughput_rps
        )?;
        if self.ttft.samples == 0 {
            // No completed request, no time to measure: 0.0 ms would read as an instant answer.
            writeln!(f, "  TTFT          n/a: no request completed")?;
        } else {
            self.fmt_ttft(f)?;
        }
        if self.cached_reported == 0 && self.ok > 0 {
            writeln!(
                f,
                "  cached tokens n/a: the server reported no cached tokens ({} prompt tokens)",
                self.prompt_tokens
            )?;
        } else {
            writeln!(
                f,
                "  cached tokens {:.1}% of {} prompt tokens",
                self.cached_token_fraction * 100.0,
                self.prompt_tokens
            )?;
        }
        let branches: Vec<String> = self
            .branches
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(
            f,
            "  spill         {:.1}% of routed responses   branches: {}",
            self.spill_fraction * 100.0,
            branches.join(", ")
        )
    }

    /// The TTFT line: mean, p50 and p99 of the completed requests, and what was timed.
    fn fmt_ttft(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let basis = match self.ttft.basis {
            TtftBasis::FirstSseData => "first SSE data chunk",
            TtftBasis::FullResponse => "full response, non-streaming",
        };
        writeln!(
            f,
            "  TTFT          mean {:.1} ms   p50 {:.1} ms   p99 {:.1} ms   ({basis})",
            self.ttft.mean_ms, self.ttft.p50_ms, self.ttft.p99_ms
        )
    }

    /// With several replicas: one line each, its outcomes and its ejection.
    fn fmt_replicas(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.per_replica.len() < 2 {
            return Ok(());
        }
        writeln!(f, "  per replica")?;
        for r in &self.per_replica {
            write!(f, "    {}  {}", r.gateway, r.outcomes)?;
            if let Some(at) = r.ejected_after_s {
                write!(
                    f,
                    "   EJECTED after {at:.2} s (refused a connection; {} requests resent elsewhere)",
                    r.refused_and_resent
                )?;
            }
            writeln!(f)?;
        }
        Ok(())
    }

    fn fmt_placement(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: u64 = self.per_worker.values().sum();
        let workers: Vec<String> = self
            .per_worker
            .iter()
            .map(|(w, n)| format!("{w} {n} ({:.1}%)", 100.0 * *n as f64 / total.max(1) as f64))
            .collect();
        writeln!(f, "  per worker    {}", workers.join("   "))?;
        writeln!(f, "  placement per key:")?;
        for (key, workers) in &self.placement {
            let cells: Vec<String> = workers.iter().map(|(w, n)| format!("{w}:{n}")).collect();
            writeln!(f, "    {key:<14} {}", cells.join("  "))?;
        }
        Ok(())
    }

    /// One line with one control plane; with several, a summary line and one line each, so a
    /// replica that could not be asked is named.
    fn fmt_drain(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(d) = &self.drain else {
            return writeln!(f, "  drain         not checked (no --control)");
        };
        if let [one] = d.replicas.as_slice() {
            write!(f, "  drain         ")?;
            return fmt_replica_drain(f, one);
        }
        let unanswered = d.unanswered().count();
        if unanswered > 0 {
            writeln!(
                f,
                "  drain         NOT VERIFIED: {unanswered} of {} control planes could not be asked",
                d.replicas.len()
            )?;
        } else if d.all_zero {
            writeln!(
                f,
                "  drain         every worker back to 0 active on all {} replicas (after {:.0} ms)",
                d.replicas.len(),
                d.waited_ms
            )?;
        } else {
            writeln!(f, "  drain         NOT DRAINED after {:.0} ms", d.waited_ms)?;
        }
        for replica in &d.replicas {
            write!(f, "    {}  ", replica.control)?;
            fmt_replica_drain(f, replica)?;
        }
        Ok(())
    }
}

/// What one control plane said in the drain check, as the rest of a line.
fn fmt_replica_drain(f: &mut fmt::Formatter<'_>, d: &ReplicaDrain) -> fmt::Result {
    if let Some(error) = &d.error {
        return writeln!(f, "NOT CHECKED: {error}");
    }
    if d.all_zero {
        return writeln!(
            f,
            "every worker back to 0 active (after {:.0} ms)",
            d.waited_ms
        );
    }
    let busy: Vec<String> = d
        .active
        .iter()
        .filter(|(_, a)| **a > 0)
        .map(|(w, a)| format!("{w}={a}"))
        .collect();
    writeln!(
        f,
        "NOT DRAINED after {:.0} ms: {}",
        d.waited_ms,
        busy.join(" ")
    )
}
