//! What an A/B run reports: every run, a summary per cell with its paired throughput ratio against
//! the baseline, and the verdict in words ([`AbReport`], serialised as `--out` JSON), plus the
//! comparison table it prints.

use std::collections::BTreeMap;
use std::fmt;

use bch_core::policy::PolicyPatch;
use serde::Serialize;
use serde_json::Value;

use super::cells::Cell;
use crate::stats::{PairedRatio, Significance, mean, paired_ratio};
use crate::storm::StormReport;

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
    /// What the run's storm measured.
    pub report: StormReport,
}

/// A cell's results over all repetitions.
#[derive(Clone, Debug, Serialize)]
pub struct CellSummary {
    /// The cell as written, e.g. `gap=2:skew=1.25`.
    pub label: String,
    /// The `PUT /admin/policy` body sent for it.
    pub policy: PolicyPatch,
    /// Runs of this cell (one per repetition).
    pub runs: usize,
    /// Mean throughput over the runs, requests per second.
    pub throughput_rps: f64,
    /// Throughput relative to the baseline, paired by repetition (`None` for the baseline itself).
    pub ratio: Option<PairedRatio>,
    /// What the ratio's interval says (`None` for the baseline).
    pub significance: Option<Significance>,
    /// Mean over runs of the mean TTFT, ms.
    pub ttft_mean_ms: f64,
    /// Mean over runs of the p99 TTFT, ms.
    pub ttft_p99_ms: f64,
    /// Mean over runs of the hottest worker's share of responses, 0 to 1.
    pub hottest_worker_share: f64,
    /// Mean over runs of the spill fraction, 0 to 1.
    pub spill_fraction: f64,
    /// Mean over runs of the cached-token fraction, 0 to 1.
    pub cached_token_fraction: f64,
    /// Failed requests over all runs.
    pub errors: u64,
    /// True when every run ended with every worker's `active` back at 0.
    pub drained: bool,
}

/// The A/B result: per-cell summaries, the verdict and every run.
#[derive(Clone, Debug, Serialize)]
pub struct AbReport {
    /// Label of the baseline cell, the first one.
    pub baseline: String,
    /// Repetitions of every cell.
    pub reps: usize,
    /// Gateway replicas every storm spread its requests over (1 for a single gateway).
    pub replicas: usize,
    /// Per-cell summaries, in cell order.
    pub cells: Vec<CellSummary>,
    /// Conclusions in sentences: which cells differ from the baseline, one line per cell, then
    /// warnings about failed requests and load that did not drain.
    pub verdict: Vec<String>,
    /// Every run, in the order it ran.
    pub runs: Vec<AbRun>,
}

/// Builds the per-cell summaries and verdict from finished runs; `cells[0]` is the baseline.
pub(super) fn summarise(cells: &[Cell], reps: usize, runs: Vec<AbRun>) -> AbReport {
    let baseline = throughput_per_rep(&runs, &cells[0].label);
    let summaries: Vec<CellSummary> = cells
        .iter()
        .enumerate()
        .map(|(i, cell)| summarise_cell(cell, &runs, (i > 0).then_some(&baseline)))
        .collect();
    let verdict = verdict(&summaries);
    AbReport {
        baseline: cells[0].label.clone(),
        reps,
        replicas: runs.first().map_or(1, |r| r.report.shape.replicas),
        cells: summaries,
        verdict,
        runs,
    }
}

/// A cell's throughput per repetition, for pairing with the baseline's.
fn throughput_per_rep(runs: &[AbRun], label: &str) -> BTreeMap<usize, f64> {
    runs.iter()
        .filter(|r| r.cell == label)
        .map(|r| (r.rep, r.report.throughput_rps))
        .collect()
}

/// One cell's summary; `baseline` (throughput per repetition) is `None` for the baseline itself.
fn summarise_cell(
    cell: &Cell,
    runs: &[AbRun],
    baseline: Option<&BTreeMap<usize, f64>>,
) -> CellSummary {
    let mine: Vec<&AbRun> = runs.iter().filter(|r| r.cell == cell.label).collect();
    let avg = |f: &dyn Fn(&StormReport) -> f64| {
        mean(&mine.iter().map(|r| f(&r.report)).collect::<Vec<_>>())
    };
    let ratio = baseline.and_then(|baseline| {
        let (b, o): (Vec<f64>, Vec<f64>) = throughput_per_rep(runs, &cell.label)
            .iter()
            .filter_map(|(rep, v)| baseline.get(rep).map(|b| (*b, *v)))
            .unzip();
        paired_ratio(&b, &o)
    });
    CellSummary {
        label: cell.label.clone(),
        policy: cell.policy,
        runs: mine.len(),
        throughput_rps: avg(&|r| r.throughput_rps),
        significance: ratio.map(|r| r.significance()),
        ratio,
        ttft_mean_ms: avg(&|r| r.ttft.mean_ms),
        ttft_p99_ms: avg(&|r| r.ttft.p99_ms),
        hottest_worker_share: avg(&|r| r.hottest_worker_share),
        spill_fraction: avg(&|r| r.spill_fraction),
        cached_token_fraction: avg(&|r| r.cached_token_fraction),
        errors: mine.iter().map(|r| r.report.errors).sum(),
        drained: mine
            .iter()
            .all(|r| r.report.drain.as_ref().is_none_or(|d| d.all_zero)),
    }
}

fn ci_text(r: &PairedRatio) -> String {
    match (r.ci_low, r.ci_high) {
        (Some(low), Some(high)) => format!("{:.3}x (95% CI {low:.3}-{high:.3})", r.ratio),
        _ => format!("{:.3}x (no CI)", r.ratio),
    }
}

/// The verdict: one summary line naming the cells that differ from the baseline, then one line per
/// cell, then warnings (errors, undrained load).
fn verdict(cells: &[CellSummary]) -> Vec<String> {
    let Some(base) = cells.first() else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    if cells.len() > 1 {
        lines.push(headline(base, &cells[1..]));
    }
    lines.extend(cells[1..].iter().map(|c| cell_line(c, &base.label)));
    lines.extend(cells.iter().flat_map(warnings));
    lines
}

/// Which cells' throughput differs significantly from the baseline's, in one sentence.
fn headline(base: &CellSummary, others: &[CellSummary]) -> String {
    let differing: Vec<String> = others
        .iter()
        .filter_map(|c| match c.significance {
            Some(Significance::Higher) => Some(format!("{} (higher)", c.label)),
            Some(Significance::Lower) => Some(format!("{} (lower)", c.label)),
            _ => None,
        })
        .collect();
    if differing.is_empty() {
        format!(
            "No cell's throughput differs significantly from {} at 95%.",
            base.label
        )
    } else {
        format!(
            "Throughput differs significantly from {} for: {}.",
            base.label,
            differing.join(", ")
        )
    }
}

/// A cell's ratio to the baseline and what its interval says.
fn cell_line(c: &CellSummary, base: &str) -> String {
    let Some(r) = &c.ratio else {
        return format!("{}: no throughput to compare with {base}", c.label);
    };
    let (label, ci) = (&c.label, ci_text(r));
    match c.significance {
        Some(Significance::Higher) => {
            format!("{label}: {ci} vs {base}: significantly higher throughput")
        }
        Some(Significance::Lower) => {
            format!("{label}: {ci} vs {base}: significantly lower throughput")
        }
        Some(Significance::NoSignificantDifference) => {
            format!("{label}: {ci} vs {base}: interval overlaps 1.0, no significant difference")
        }
        _ => format!(
            "{label}: {ci} vs {base} from {} paired repetition(s): too few for a confidence interval (use --reps 2 or more)",
            r.n
        ),
    }
}

/// Warnings about a cell's failed requests and undrained load.
fn warnings(c: &CellSummary) -> Vec<String> {
    let mut lines = Vec::new();
    if c.errors > 0 {
        lines.push(format!(
            "WARNING: {} had {} failed request(s)",
            c.label, c.errors
        ));
    }
    if !c.drained {
        lines.push(format!(
            "WARNING: after a run of {}, some worker's active load did not return to 0",
            c.label
        ));
    }
    lines
}

impl fmt::Display for AbReport {
    /// The comparison table followed by the verdict.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vs = format!("vs {} (95% CI)", self.baseline);
        if self.replicas > 1 {
            writeln!(
                f,
                "through {} gateway replicas (requests round-robin)",
                self.replicas
            )?;
        }
        writeln!(
            f,
            "{:<16} {:>10} {:>26} {:>11} {:>11} {:>8} {:>7} {:>7}",
            "cell", "req/s", vs, "TTFT mean", "TTFT p99", "hottest", "spill", "cached"
        )?;
        for c in &self.cells {
            let ratio = ratio_column(c);
            writeln!(
                f,
                "{:<16} {:>10.1} {:>26} {:>8.1} ms {:>8.1} ms {:>7.1}% {:>6.1}% {:>6.1}%",
                c.label,
                c.throughput_rps,
                ratio,
                c.ttft_mean_ms,
                c.ttft_p99_ms,
                c.hottest_worker_share * 100.0,
                c.spill_fraction * 100.0,
                c.cached_token_fraction * 100.0,
            )?;
        }
        writeln!(
            f,
            "({} repetitions per cell, interleaved; * = 95% CI excludes 1.0)",
            self.reps
        )?;
        for line in &self.verdict {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// The table's ratio column: the ratio with its interval, starred when the interval excludes 1.0.
fn ratio_column(c: &CellSummary) -> String {
    let Some(r) = &c.ratio else {
        return "1 (baseline)".to_owned();
    };
    let mark = match r.significance() {
        Significance::Higher | Significance::Lower => " *",
        _ => "",
    };
    match (r.ci_low, r.ci_high) {
        (Some(l), Some(h)) => format!("{:.3} ({l:.3}-{h:.3}){mark}", r.ratio),
        _ => format!("{:.3} (n={})", r.ratio, r.n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(label: &str, ratio: Option<PairedRatio>) -> CellSummary {
        CellSummary {
            label: label.to_owned(),
            policy: PolicyPatch::default(),
            runs: 3,
            throughput_rps: 100.0,
            significance: ratio.map(|r| r.significance()),
            ratio,
            ttft_mean_ms: 10.0,
            ttft_p99_ms: 20.0,
            hottest_worker_share: 0.5,
            spill_fraction: 0.0,
            cached_token_fraction: 0.9,
            errors: 0,
            drained: true,
        }
    }

    #[test]
    fn the_verdict_names_differing_cells_and_overlapping_intervals() {
        let base = [100.0, 100.0, 100.0];
        let cells = vec![
            summary("strict", None),
            summary("gap=1", paired_ratio(&base, &[120.0, 85.0, 101.0])),
            summary("gap=2", paired_ratio(&base, &[110.0, 111.0, 109.0])),
            summary("gap=4", paired_ratio(&base, &[90.0, 91.0, 89.0])),
        ];
        let lines = verdict(&cells);
        assert_eq!(
            lines[0],
            "Throughput differs significantly from strict for: gap=2 (higher), gap=4 (lower)."
        );
        assert!(
            lines[1].starts_with("gap=1: ")
                && lines[1].ends_with("interval overlaps 1.0, no significant difference")
        );
        assert!(
            lines[2].contains("1.100x (95% CI")
                && lines[2].ends_with("significantly higher throughput")
        );
        assert!(lines[3].ends_with("significantly lower throughput"));
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn the_verdict_says_when_nothing_differs_or_intervals_are_missing() {
        let cells = vec![
            summary("strict", None),
            summary("gap=2", paired_ratio(&[100.0, 100.0], &[120.0, 85.0])),
            summary("gap=4", paired_ratio(&[100.0], &[150.0])),
        ];
        let lines = verdict(&cells);
        assert_eq!(
            lines[0],
            "No cell's throughput differs significantly from strict at 95%."
        );
        assert!(lines[2].contains("too few for a confidence interval"));
        let mut bad = cells;
        bad[1].drained = false;
        bad[1].errors = 3;
        let lines = verdict(&bad);
        assert!(
            lines
                .iter()
                .any(|l| l == "WARNING: gap=2 had 3 failed request(s)")
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("gap=2, some worker's active load did not return to 0"))
        );
    }
}
