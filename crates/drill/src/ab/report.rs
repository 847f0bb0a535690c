//! What an A/B run reports ([`AbReport`], serialised as `--out` JSON): where and how it ran
//! ([`AbMeta`]), every run, a summary per cell with paired intervals against the baseline, the
//! paired comparisons of the candidate cells with each other, and the verdict in words.

use bch_core::policy::PolicyPatch;
use serde::Serialize;
use serde_json::Value;

use crate::sim::SimConfig;
use crate::stats::{PairedDifference, PairedRatio, Significance};
use crate::storm::{StormReport, StormShape};
use bch_core::admission::AdmissionSettings;

/// One storm of one cell in one repetition.
#[derive(Clone, Debug, Serialize)]
pub struct AbRun {
    /// Repetition, counting from 1.
    pub rep: usize,
    /// Label of the cell this run measured.
    pub cell: String,
    /// Position in the overall run order, counting from 1.
    pub order: usize,
    /// The policy as the gateway answered the `PUT /admin/policy`.
    pub policy: Value,
    /// What the run's storm measured (its `shape.seed` is the run's prompt seed).
    pub report: StormReport,
}

/// One worker behind the gateway, as the run found it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerInfo {
    /// The gateway's name for it.
    pub name: String,
    /// Its base URL.
    pub url: String,
    /// Its simulator parameters, from `GET {url}/bch-sim/config`; `None` for a real server (or one
    /// that did not answer).
    pub sim: Option<SimConfig>,
}

/// Where, when and with what an A/B run ran: enough to reproduce it or to tell two files apart.
#[derive(Clone, Debug, Serialize)]
pub struct AbMeta {
    /// `bch-drill` and its version.
    pub tool: String,
    /// Start and end, RFC 3339 UTC.
    pub started_at: String,
    /// End, RFC 3339 UTC.
    pub finished_at: String,
    /// Base of the per-run prompt seeds (run `k` uses `seed + 1,000,003 × k`).
    pub seed: u64,
    /// True when the seed was given (`--seed`); false when drawn at random for this invocation, so
    /// that a second invocation does not find the first one's prompts cached.
    pub seed_given: bool,
    /// Data-plane URL stormed (every replica's, comma-separated, when several).
    pub gateway: String,
    /// Control-plane URL whose policy was switched (every replica's, comma-separated, when
    /// several).
    pub control: String,
    /// The storm of every run (its seed is the base seed).
    pub storm: StormShape,
    /// `GET /admin/policy` before the first run: the policy restored at the end. With several
    /// replicas, the first one's; each replica gets back its own.
    pub policy_before: Value,
    /// True when the policy found was put back (after the last run, an error or an interruption).
    pub policy_restored: bool,
    /// Why the policy could not be restored, when it could not.
    pub restore_error: Option<String>,
    /// The workers behind the gateway, with their simulator settings where they have them.
    pub workers: Vec<WorkerInfo>,
}

/// A cell's results over all repetitions, with paired 95% intervals against the baseline.
#[derive(Clone, Debug, Serialize)]
pub struct CellSummary {
    /// The cell as written, e.g. `gap=2:skew=1.25`.
    pub label: String,
    /// The `PUT /admin/policy` body sent for it.
    pub policy: PolicyPatch,
    /// The admission settings sent with it under `admission`, when the cells name admission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionSettings>,
    /// Runs of this cell (one per repetition).
    pub runs: usize,
    /// Mean throughput over the runs, requests per second.
    pub throughput_rps: f64,
    /// Throughput relative to the baseline, paired by repetition (`None` for the baseline itself).
    pub ratio: Option<PairedRatio>,
    /// What the throughput ratio's interval says (`None` for the baseline).
    pub significance: Option<Significance>,
    /// Mean over runs of the mean TTFT, ms.
    pub ttft_mean_ms: f64,
    /// Mean TTFT relative to the baseline, paired by repetition.
    pub ttft_mean_ratio: Option<PairedRatio>,
    /// Mean over runs of the p99 TTFT, ms.
    pub ttft_p99_ms: f64,
    /// p99 TTFT relative to the baseline, paired by repetition.
    pub ttft_p99_ratio: Option<PairedRatio>,
    /// Mean over runs of the hottest worker's share of responses, 0 to 1.
    pub hottest_worker_share: f64,
    /// Mean over runs of the second-hottest worker's share of responses, 0 to 1.
    pub second_hottest_worker_share: f64,
    /// Mean over runs of the spill fraction, 0 to 1.
    pub spill_fraction: f64,
    /// Mean over runs of the cached-token fraction, 0 to 1 (unknown when `cached_reported` is
    /// false).
    pub cached_token_fraction: f64,
    /// Cached-token fraction minus the baseline's, paired by repetition (fraction, not points).
    pub cached_difference: Option<PairedDifference>,
    /// True when every run's server reported cached tokens.
    pub cached_reported: bool,
    /// Failed requests over all runs.
    pub errors: u64,
    /// Requests shed cleanly (503 with `Retry-After`) over all runs.
    pub shed: u64,
    /// Requests neither answered nor shed cleanly over all runs (a clean shed leaves it 0).
    pub unclean: u64,
    /// Mean over runs of the goodput, requests per second within the TTFT objective; `None`
    /// without one (`--slo-ttft-ms`).
    pub goodput_rps: Option<f64>,
    /// True when every run ended with every worker's `active` back at 0.
    pub drained: bool,
}

/// Candidate cell `b` against candidate cell `a` (`b / a`, `b − a`), paired by repetition.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The reference cell.
    pub a: String,
    /// The cell compared with it.
    pub b: String,
    /// Throughput ratio.
    pub throughput: Option<PairedRatio>,
    /// Mean TTFT ratio.
    pub ttft_mean: Option<PairedRatio>,
    /// p99 TTFT ratio.
    pub ttft_p99: Option<PairedRatio>,
    /// Cached-token fraction difference.
    pub cached: Option<PairedDifference>,
}

impl Comparison {
    /// True when every interval contains no difference (1.0 for ratios, 0 for the cached
    /// fraction): the two cells cannot be told apart at 95%. False when any interval is missing.
    pub fn indistinguishable(&self) -> bool {
        let ratios = [self.throughput, self.ttft_mean, self.ttft_p99];
        ratios
            .iter()
            .all(|r| r.is_some_and(|r| r.significance() == Significance::NoSignificantDifference))
            && self
                .cached
                .is_some_and(|d| d.significance() == Significance::NoSignificantDifference)
    }
}

/// The A/B result: how it ran, per-cell summaries, candidate comparisons, the verdict and every
/// run.
#[derive(Clone, Debug, Serialize)]
pub struct AbReport {
    /// Tool, time, seeds, gateway policy and worker settings.
    pub meta: AbMeta,
    /// Label of the baseline cell, the first one.
    pub baseline: String,
    /// Repetitions of every cell.
    pub reps: usize,
    /// Gateway replicas every storm spread its requests over (1 for a single gateway).
    pub replicas: usize,
    /// Per-cell summaries, in cell order.
    pub cells: Vec<CellSummary>,
    /// Every pair of candidate (non-baseline) cells, in cell order.
    pub comparisons: Vec<Comparison>,
    /// Conclusions in sentences: each cell against the baseline, the candidates against each
    /// other, then warnings (too few repetitions, failed requests, undrained load, unreported
    /// cache, a policy that could not be restored).
    pub verdict: Vec<String>,
    /// Every run, in the order it ran.
    pub runs: Vec<AbRun>,
}
