//! The verdict of an A/B run in sentences: each cell against the baseline on throughput, TTFT mean
//! and p99 and the cached-token fraction (paired 95% intervals), the candidate cells against each
//! other, then warnings about what the numbers cannot carry.

use super::report::{AbMeta, CellSummary, Comparison};
use crate::stats::{PairedDifference, PairedRatio, Significance, t_975_for};

/// Repetitions below which a "no significant difference" is reported with a warning: the original
/// bounded-policy A/B used five, and with fewer the t quantile alone (4.30 at three) makes the
/// intervals too wide to call cells alike.
pub const MIN_REPS_FOR_CLAIMS: usize = 5;

/// A ratio with its interval: `0.870x (95% CI 0.840-0.900, lower)`.
pub(super) fn ratio_text(r: &PairedRatio) -> String {
    match (r.ci_low, r.ci_high) {
        (Some(low), Some(high)) => format!(
            "{:.3}x (95% CI {low:.3}-{high:.3}, {})",
            r.ratio,
            word(r.significance())
        ),
        _ => format!("{:.3}x (no interval from {} pair)", r.ratio, r.n),
    }
}

/// A difference of fractions in percentage points: `-12.1 pp (95% CI -12.5 to -11.7, lower)`.
pub(super) fn difference_text(d: &PairedDifference) -> String {
    match (d.ci_low, d.ci_high) {
        (Some(low), Some(high)) => format!(
            "{:+.1} pp (95% CI {:+.1} to {:+.1}, {})",
            d.mean * 100.0,
            low * 100.0,
            high * 100.0,
            word(d.significance())
        ),
        _ => format!("{:+.1} pp (no interval from {} pair)", d.mean * 100.0, d.n),
    }
}

fn word(s: Significance) -> &'static str {
    match s {
        Significance::Higher => "higher",
        Significance::Lower => "lower",
        Significance::NoSignificantDifference => "no significant difference",
        Significance::Undetermined => "undetermined",
    }
}

fn opt<T>(value: Option<&T>, text: fn(&T) -> String) -> String {
    value.map_or_else(|| "n/a".to_owned(), text)
}

/// Every verdict line, in order: headline, one line per cell, candidate comparisons, warnings.
pub(super) fn verdict(
    cells: &[CellSummary],
    comparisons: &[Comparison],
    reps: usize,
    meta: &AbMeta,
) -> Vec<String> {
    let Some(base) = cells.first() else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    if cells.len() > 1 {
        lines.push(headline(base, &cells[1..]));
    }
    lines.extend(cells[1..].iter().map(|c| cell_line(c, &base.label)));
    lines.extend(comparisons.iter().map(comparison_line));
    if let Some(line) = candidates_line(&cells[1..], comparisons) {
        lines.push(line);
    }
    lines.extend(warnings(cells, comparisons, reps, meta));
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

/// A cell against the baseline on every measure.
fn cell_line(c: &CellSummary, base: &str) -> String {
    let cached = if c.cached_reported {
        opt(c.cached_difference.as_ref(), difference_text)
    } else {
        "n/a (not reported by the server)".to_owned()
    };
    format!(
        "{} vs {base}: throughput {}; TTFT mean {}; TTFT p99 {}; cached {cached}",
        c.label,
        opt(c.ratio.as_ref(), ratio_text),
        opt(c.ttft_mean_ratio.as_ref(), ratio_text),
        opt(c.ttft_p99_ratio.as_ref(), ratio_text),
    )
}

/// Candidate `b` against candidate `a`.
fn comparison_line(c: &Comparison) -> String {
    let head = if c.indistinguishable() {
        "indistinguishable at 95%"
    } else {
        "differ"
    };
    format!(
        "{} vs {}: {head}: throughput {}; TTFT mean {}; TTFT p99 {}; cached {}",
        c.b,
        c.a,
        opt(c.throughput.as_ref(), ratio_text),
        opt(c.ttft_mean.as_ref(), ratio_text),
        opt(c.ttft_p99.as_ref(), ratio_text),
        opt(c.cached.as_ref(), difference_text),
    )
}

/// With two or more candidates: whether they can be told apart at all.
fn candidates_line(candidates: &[CellSummary], comparisons: &[Comparison]) -> Option<String> {
    if candidates.len() < 2 || comparisons.is_empty() {
        return None;
    }
    let names: Vec<&str> = candidates.iter().map(|c| c.label.as_str()).collect();
    Some(if comparisons.iter().all(Comparison::indistinguishable) {
        format!(
            "The candidate cells ({}) cannot be told apart on any measure at 95%.",
            names.join(", ")
        )
    } else {
        let apart: Vec<String> = comparisons
            .iter()
            .filter(|c| !c.indistinguishable())
            .map(|c| format!("{} vs {}", c.b, c.a))
            .collect();
        format!(
            "Candidate cells that differ on at least one measure at 95% (or lack an interval): {}.",
            apart.join(", ")
        )
    })
}

/// What the numbers cannot carry: too few repetitions, failed requests, undrained load, cache
/// fractions the server never reported, a gateway left on another policy.
fn warnings(
    cells: &[CellSummary],
    comparisons: &[Comparison],
    reps: usize,
    meta: &AbMeta,
) -> Vec<String> {
    let mut lines = Vec::new();
    if cells.len() > 1 && reps < 2 {
        lines.push(format!(
            "WARNING: 1 repetition per cell gives no confidence interval at all; use --reps {MIN_REPS_FOR_CLAIMS} or more."
        ));
    } else if cells.len() > 1 && reps < MIN_REPS_FOR_CLAIMS {
        let claims = cells[1..]
            .iter()
            .filter(|c| c.significance == Some(Significance::NoSignificantDifference))
            .count()
            + comparisons.iter().filter(|c| c.indistinguishable()).count();
        lines.push(format!(
            "WARNING: only {reps} repetitions per cell (t = {:.2}): intervals are wide, and \"no significant difference\" ({claims} such claim(s) above) only means that differences inside the interval cannot be ruled out; use --reps {MIN_REPS_FOR_CLAIMS} or more before calling cells alike.",
            t_975_for(reps - 1)
        ));
    }
    for c in cells {
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
    }
    let unreported: Vec<&str> = cells
        .iter()
        .filter(|c| !c.cached_reported)
        .map(|c| c.label.as_str())
        .collect();
    if !unreported.is_empty() {
        lines.push(format!(
            "NOTE: the server reported no cached tokens in {} run(s) of {}: the cached-token fraction there is unknown (n/a), not 0.",
            if unreported.len() == cells.len() { "every" } else { "some" },
            unreported.join(", ")
        ));
    }
    if !meta.policy_restored {
        lines.push(format!(
            "WARNING: the gateway's policy could not be restored ({}); it may still run the last cell's policy",
            meta.restore_error.as_deref().unwrap_or("unknown error")
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{paired_difference, paired_ratio};
    use bch_core::policy::PolicyPatch;

    fn summary(label: &str, ratio: Option<PairedRatio>) -> CellSummary {
        CellSummary {
            label: label.to_owned(),
            policy: PolicyPatch::default(),
            admission: None,
            shed: 0,
            unclean: 0,
            goodput_rps: None,
            runs: 3,
            throughput_rps: 100.0,
            significance: ratio.map(|r| r.significance()),
            ratio,
            ttft_mean_ms: 10.0,
            ttft_mean_ratio: ratio,
            ttft_p99_ms: 20.0,
            ttft_p99_ratio: ratio,
            hottest_worker_share: 0.5,
            second_hottest_worker_share: 0.3,
            spill_fraction: 0.0,
            cached_token_fraction: 0.9,
            cached_difference: paired_difference(&[0.9, 0.9, 0.9], &[0.8, 0.81, 0.79]),
            cached_reported: true,
            errors: 0,
            drained: true,
        }
    }

    fn meta() -> AbMeta {
        AbMeta {
            tool: "bch-drill test".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: "2026-01-01T00:01:00Z".into(),
            seed: 1,
            seed_given: true,
            gateway: "http://g".into(),
            control: "http://c".into(),
            storm: crate::storm::StormShape::of(&crate::storm::StormConfig::default()),
            policy_before: serde_json::json!({}),
            policy_restored: true,
            restore_error: None,
            workers: Vec::new(),
        }
    }

    #[test]
    fn the_verdict_names_differing_cells_and_every_measure() {
        let base = [100.0, 100.0, 100.0];
        let cells = vec![
            summary("strict", None),
            summary("gap=1", paired_ratio(&base, &[120.0, 85.0, 101.0])),
            summary("gap=2", paired_ratio(&base, &[110.0, 111.0, 109.0])),
            summary("gap=4", paired_ratio(&base, &[90.0, 91.0, 89.0])),
        ];
        let lines = verdict(&cells, &[], 5, &meta());
        assert_eq!(
            lines[0],
            "Throughput differs significantly from strict for: gap=2 (higher), gap=4 (lower)."
        );
        assert!(lines[1].starts_with("gap=1 vs strict: throughput "));
        assert!(lines[1].contains("no significant difference"));
        assert!(lines[2].contains("1.100x (95% CI") && lines[2].contains("higher"));
        assert!(
            lines[2].contains("; cached -10.0 pp (95% CI"),
            "{}",
            lines[2]
        );
        assert!(lines[3].contains("lower"));
        assert_eq!(lines.len(), 4, "five repetitions: no warning");
    }

    #[test]
    fn few_repetitions_errors_restore_failures_and_unreported_caches_are_warned_about() {
        let mut cells = vec![
            summary("strict", None),
            summary("gap=2", paired_ratio(&[100.0, 100.0], &[120.0, 85.0])),
        ];
        cells[1].errors = 3;
        cells[1].drained = false;
        cells[1].cached_reported = false;
        let mut meta = meta();
        meta.policy_restored = false;
        meta.restore_error = Some("connection refused".into());
        let lines = verdict(&cells, &[], 2, &meta);
        let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
        assert!(
            has("WARNING: only 2 repetitions per cell (t = 12.71)"),
            "{lines:?}"
        );
        assert!(has("WARNING: gap=2 had 3 failed request(s)"));
        assert!(has("gap=2, some worker's active load did not return to 0"));
        assert!(has("cached n/a (not reported by the server)"));
        assert!(has(
            "NOTE: the server reported no cached tokens in some run(s) of gap=2"
        ));
        assert!(has("could not be restored (connection refused)"));
        let lines = verdict(&cells[..2], &[], 1, &self::meta());
        assert!(
            lines
                .iter()
                .any(|l| l.contains("no confidence interval at all"))
        );
    }

    #[test]
    fn candidates_are_compared_with_each_other() {
        let same = paired_ratio(&[100.0, 100.0, 100.0], &[100.0, 101.0, 99.0]);
        let alike = Comparison {
            a: "gap=1".into(),
            b: "gap=2".into(),
            throughput: same,
            ttft_mean: same,
            ttft_p99: same,
            cached: paired_difference(&[0.5, 0.5, 0.5], &[0.5, 0.51, 0.49]),
        };
        let apart = Comparison {
            b: "gap=4".into(),
            ttft_mean: paired_ratio(&[10.0, 10.0, 10.0], &[12.0, 12.1, 11.9]),
            ..alike.clone()
        };
        let cells = vec![
            summary("strict", None),
            summary("gap=1", same),
            summary("gap=2", same),
        ];
        let lines = verdict(&cells, std::slice::from_ref(&alike), 5, &meta());
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("gap=2 vs gap=1: indistinguishable at 95%"))
        );
        assert!(lines.iter().any(|l| l
            == "The candidate cells (gap=1, gap=2) cannot be told apart on any measure at 95%."));
        let lines = verdict(&cells, &[alike, apart], 5, &meta());
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("gap=4 vs gap=1: differ"))
        );
        assert!(lines.iter().any(|l| l.ends_with(": gap=4 vs gap=1.")));
    }
}
