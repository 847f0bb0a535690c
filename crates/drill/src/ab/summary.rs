//! From finished runs to an [`AbReport`]: per-cell means, paired intervals against the baseline
//! (same repetition), the candidate cells against each other, and the verdict.

use std::collections::BTreeMap;

use super::cells::Cell;
use super::report::{AbMeta, AbReport, AbRun, CellSummary, Comparison};
use super::verdict::verdict;
use crate::stats::{PairedDifference, PairedRatio, mean, paired_difference, paired_ratio};
use crate::storm::StormReport;

/// A measure of a storm that cells are compared on.
type Metric = fn(&StormReport) -> f64;

const THROUGHPUT: Metric = throughput;
const TTFT_MEAN: Metric = ttft_mean;
const TTFT_P99: Metric = ttft_p99;
const CACHED: Metric = cached;

fn throughput(r: &StormReport) -> f64 {
    r.throughput_rps
}

fn ttft_mean(r: &StormReport) -> f64 {
    r.ttft.mean_ms
}

fn ttft_p99(r: &StormReport) -> f64 {
    r.ttft.p99_ms
}

fn cached(r: &StormReport) -> f64 {
    r.cached_token_fraction
}

/// A cell's value of `metric` per repetition.
fn per_rep(runs: &[AbRun], label: &str, metric: Metric) -> BTreeMap<usize, f64> {
    runs.iter()
        .filter(|r| r.cell == label)
        .map(|r| (r.rep, metric(&r.report)))
        .collect()
}

/// `a`'s and `b`'s values of `metric` in the repetitions both ran.
fn paired(runs: &[AbRun], a: &str, b: &str, metric: Metric) -> (Vec<f64>, Vec<f64>) {
    let a = per_rep(runs, a, metric);
    per_rep(runs, b, metric)
        .into_iter()
        .filter_map(|(rep, vb)| a.get(&rep).map(|va| (*va, vb)))
        .unzip()
}

fn ratio_of(runs: &[AbRun], a: &str, b: &str, metric: Metric) -> Option<PairedRatio> {
    let (va, vb) = paired(runs, a, b, metric);
    paired_ratio(&va, &vb)
}

fn difference_of(runs: &[AbRun], a: &str, b: &str, metric: Metric) -> Option<PairedDifference> {
    let (va, vb) = paired(runs, a, b, metric);
    paired_difference(&va, &vb)
}

/// Builds the summaries, comparisons and verdict from finished runs; `cells[0]` is the baseline.
pub(super) fn summarise(cells: &[Cell], reps: usize, runs: Vec<AbRun>, meta: AbMeta) -> AbReport {
    let base = &cells[0].label;
    let summaries: Vec<CellSummary> = cells
        .iter()
        .enumerate()
        .map(|(i, cell)| summarise_cell(cell, &runs, (i > 0).then_some(base.as_str())))
        .collect();
    let mut comparisons = Vec::new();
    for (i, a) in cells.iter().enumerate().skip(1) {
        for b in &cells[i + 1..] {
            comparisons.push(compare(&runs, &a.label, &b.label));
        }
    }
    let verdict = verdict(&summaries, &comparisons, reps, &meta);
    AbReport {
        meta,
        baseline: base.clone(),
        reps,
        replicas: runs.first().map_or(1, |r| r.report.shape.replicas),
        cells: summaries,
        comparisons,
        verdict,
        runs,
    }
}

fn compare(runs: &[AbRun], a: &str, b: &str) -> Comparison {
    Comparison {
        a: a.to_owned(),
        b: b.to_owned(),
        throughput: ratio_of(runs, a, b, THROUGHPUT),
        ttft_mean: ratio_of(runs, a, b, TTFT_MEAN),
        ttft_p99: ratio_of(runs, a, b, TTFT_P99),
        cached: difference_of(runs, a, b, CACHED),
    }
}

/// One cell's summary; `baseline` is `None` for the baseline itself.
fn summarise_cell(cell: &Cell, runs: &[AbRun], baseline: Option<&str>) -> CellSummary {
    let mine: Vec<&AbRun> = runs.iter().filter(|r| r.cell == cell.label).collect();
    let avg = |f: Metric| mean(&mine.iter().map(|r| f(&r.report)).collect::<Vec<_>>());
    let vs = |metric: Metric| baseline.and_then(|b| ratio_of(runs, b, &cell.label, metric));
    let ratio = vs(THROUGHPUT);
    CellSummary {
        label: cell.label.clone(),
        policy: cell.policy,
        admission: cell.admission,
        runs: mine.len(),
        throughput_rps: avg(THROUGHPUT),
        significance: ratio.map(|r| r.significance()),
        ratio,
        ttft_mean_ms: avg(TTFT_MEAN),
        ttft_mean_ratio: vs(TTFT_MEAN),
        ttft_p99_ms: avg(TTFT_P99),
        ttft_p99_ratio: vs(TTFT_P99),
        hottest_worker_share: avg(|r| r.hottest_worker_share),
        second_hottest_worker_share: avg(|r| r.second_hottest_worker_share),
        spill_fraction: avg(|r| r.spill_fraction),
        cached_token_fraction: avg(CACHED),
        cached_difference: baseline.and_then(|b| difference_of(runs, b, &cell.label, CACHED)),
        cached_reported: !mine.is_empty() && mine.iter().all(|r| r.report.cached_reported > 0),
        errors: mine.iter().map(|r| r.report.errors).sum(),
        shed: mine.iter().map(|r| r.report.overload.shed).sum(),
        unclean: mine.iter().map(|r| r.report.overload.unclean()).sum(),
        goodput_rps: mine
            .iter()
            .map(|r| r.report.overload.goodput_rps)
            .collect::<Option<Vec<f64>>>()
            .filter(|g| !g.is_empty())
            .map(|g| mean(&g)),
        drained: mine
            .iter()
            .all(|r| r.report.drain.as_ref().is_none_or(|d| d.all_zero)),
    }
}
