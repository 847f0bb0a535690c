//! Small statistics for drill reports: percentiles, and paired confidence intervals of a ratio (for
//! throughput and latency) and of a difference (for fractions, which may be 0).

use serde::Serialize;

/// Arithmetic mean; 0 for no values.
pub(crate) fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of `sorted` ascending values; 0 for no values.
///
/// Nearest rank always returns an observed value, which is what an operator expects of "p99 TTFT".
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Two-sided 95% quantile of Student's t distribution (`t_{0.975}`), public for reports that say
/// how wide their intervals are.
pub(crate) fn t_975_for(df: usize) -> f64 {
    t_975(df)
}

/// Two-sided 95% quantile of Student's t distribution (`t_{0.975}`) for `df` degrees of freedom.
///
/// A table rather than an inverse CDF: A/B runs have a handful of repetitions, and the standard
/// table values are exact to the precision any report shows. Between listed values the next smaller
/// `df` is used, which makes the interval slightly conservative. `df = 0` has no interval: infinity.
fn t_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        31..=40 => 2.042,
        41..=60 => 2.021,
        61..=120 => 2.000,
        121..=1000 => 1.980,
        _ => 1.960,
    }
}

/// A ratio `cell / baseline` (of throughput or a latency) estimated from paired repetitions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PairedRatio {
    /// Pairs used (repetitions where both values are positive).
    pub n: usize,
    /// Geometric mean of the per-repetition ratios.
    pub ratio: f64,
    /// Lower end of the 95% confidence interval; `None` with fewer than two pairs.
    pub ci_low: Option<f64>,
    /// Upper end of the 95% confidence interval; `None` with fewer than two pairs.
    pub ci_high: Option<f64>,
}

/// Estimates `other / baseline` from values paired by repetition (`baseline[i]` and `other[i]` ran
/// in the same repetition).
///
/// Works on log ratios: a t interval over `ln(other_i / baseline_i)`, mapped back with `exp`. Pairing
/// removes drift shared by a repetition (a warming machine, a noisy neighbour), and logs make the
/// interval symmetric for "1.2× faster" and "1.2× slower". Pairs with a non-positive value are
/// skipped (a ratio with zero throughput has no log). `None` when no pair is usable.
pub(crate) fn paired_ratio(baseline: &[f64], other: &[f64]) -> Option<PairedRatio> {
    let logs: Vec<f64> = baseline
        .iter()
        .zip(other)
        .filter(|(b, o)| **b > 0.0 && **o > 0.0)
        .map(|(b, o)| (o / b).ln())
        .collect();
    let n = logs.len();
    if n == 0 {
        return None;
    }
    let m = mean(&logs);
    let (ci_low, ci_high) = if n >= 2 {
        let var = logs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t_975(n - 1) * (var / n as f64).sqrt();
        (Some((m - half).exp()), Some((m + half).exp()))
    } else {
        (None, None)
    };
    Some(PairedRatio {
        n,
        ratio: m.exp(),
        ci_low,
        ci_high,
    })
}

/// A difference `cell − baseline` (of a fraction, 0 to 1) estimated from paired repetitions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PairedDifference {
    /// Pairs used.
    pub n: usize,
    /// Mean of the per-repetition differences.
    pub mean: f64,
    /// Lower end of the 95% confidence interval; `None` with fewer than two pairs.
    pub ci_low: Option<f64>,
    /// Upper end of the 95% confidence interval; `None` with fewer than two pairs.
    pub ci_high: Option<f64>,
}

/// Estimates `other − baseline` from values paired by repetition: a t interval over the
/// per-repetition differences. For fractions (the cached-token fraction), where a log ratio would
/// fail at 0 and a difference in percentage points is what an operator reads. `None` without pairs.
pub(crate) fn paired_difference(baseline: &[f64], other: &[f64]) -> Option<PairedDifference> {
    let diffs: Vec<f64> = baseline.iter().zip(other).map(|(b, o)| o - b).collect();
    let n = diffs.len();
    if n == 0 {
        return None;
    }
    let m = mean(&diffs);
    let (ci_low, ci_high) = if n >= 2 {
        let var = diffs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64;
        let half = t_975(n - 1) * (var / n as f64).sqrt();
        (Some(m - half), Some(m + half))
    } else {
        (None, None)
    };
    Some(PairedDifference {
        n,
        mean: m,
        ci_low,
        ci_high,
    })
}

impl PairedDifference {
    /// Whether the 95% interval excludes 0, and on which side.
    pub fn significance(&self) -> Significance {
        match (self.ci_low, self.ci_high) {
            (Some(low), _) if low > 0.0 => Significance::Higher,
            (_, Some(high)) if high < 0.0 => Significance::Lower,
            (Some(_), Some(_)) => Significance::NoSignificantDifference,
            _ => Significance::Undetermined,
        }
    }
}

/// What a paired ratio says about a cell against the baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Significance {
    /// The whole interval is above 1.0 (a difference: above 0).
    Higher,
    /// The whole interval is below 1.0 (a difference: below 0).
    Lower,
    /// The interval contains 1.0 (a difference: 0).
    NoSignificantDifference,
    /// Fewer than two usable pairs: no interval.
    Undetermined,
}

impl PairedRatio {
    /// Whether the 95% interval excludes 1.0, and on which side.
    pub fn significance(&self) -> Significance {
        match (self.ci_low, self.ci_high) {
            (Some(low), _) if low > 1.0 => Significance::Higher,
            (_, Some(high)) if high < 1.0 => Significance::Lower,
            (Some(_), Some(_)) => Significance::NoSignificantDifference,
            _ => Significance::Undetermined,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
    }

    #[test]
    fn t_table_matches_known_quantiles() {
        assert_eq!(t_975(1), 12.706);
        assert_eq!(t_975(4), 2.776);
        assert_eq!(t_975(30), 2.042);
        assert_eq!(t_975(10_000), 1.96);
        assert!(t_975(0).is_infinite());
        // Monotone: fewer samples, wider intervals.
        for df in 1..200 {
            assert!(t_975(df) >= t_975(df + 1));
        }
    }

    #[test]
    fn identical_runs_give_ratio_one_with_a_zero_width_interval() {
        let base = [100.0, 110.0, 90.0];
        let r = paired_ratio(&base, &base).unwrap();
        assert_eq!(
            (r.n, r.ratio, r.ci_low, r.ci_high),
            (3, 1.0, Some(1.0), Some(1.0))
        );
    }

    #[test]
    fn a_consistent_speedup_is_significant_despite_drift() {
        // Throughput drifts down by 30% across repetitions, yet the cell is 10% faster in each pair.
        let base = [100.0, 90.0, 80.0, 70.0, 60.0];
        let cell: Vec<f64> = base
            .iter()
            .zip([1.09, 1.11, 1.10, 1.12, 1.08])
            .map(|(b, f)| b * f)
            .collect();
        let r = paired_ratio(&base, &cell).unwrap();
        assert!((r.ratio - 1.10).abs() < 0.005, "{r:?}");
        assert!(
            r.ci_low.unwrap() > 1.07 && r.ci_high.unwrap() < 1.13,
            "{r:?}"
        );
        assert_eq!(r.significance(), Significance::Higher);
        let r = paired_ratio(&cell, &base).unwrap();
        assert_eq!(r.significance(), Significance::Lower);
    }

    #[test]
    fn the_interval_matches_a_hand_computation() {
        // ln ratios: ln 2, 0 -> mean ln√2, sd ln2/√2, half-width 12.706 · sd/√2 = 12.706 · ln2 / 2.
        let r = paired_ratio(&[1.0, 1.0], &[2.0, 1.0]).unwrap();
        let m = 2f64.ln() / 2.0;
        let half = 12.706 * 2f64.ln() / 2.0;
        assert!((r.ratio - 2f64.sqrt()).abs() < 1e-12);
        assert!((r.ci_low.unwrap() - (m - half).exp()).abs() < 1e-9);
        assert!((r.ci_high.unwrap() - (m + half).exp()).abs() < 1e-9);
        assert_eq!(r.significance(), Significance::NoSignificantDifference);
    }

    #[test]
    fn paired_differences_match_a_hand_computation_and_handle_zero() {
        // Differences -0.10, -0.12, -0.11: mean -0.11, sd 0.01, half 4.303 · 0.01/√3.
        let d = paired_difference(&[0.8, 0.0, 0.5], &[0.7, -0.12, 0.39]).unwrap();
        assert!((d.mean + 0.11).abs() < 1e-12);
        let half = 4.303 * 0.01 / 3f64.sqrt();
        assert!((d.ci_low.unwrap() - (-0.11 - half)).abs() < 1e-9);
        assert!((d.ci_high.unwrap() - (-0.11 + half)).abs() < 1e-9);
        assert_eq!(d.significance(), Significance::Lower);
        let same = paired_difference(&[0.0, 0.0], &[0.0, 0.0]).unwrap();
        assert_eq!(same.significance(), Significance::NoSignificantDifference);
        let one = paired_difference(&[0.5], &[0.6]).unwrap();
        assert_eq!(one.significance(), Significance::Undetermined);
        assert_eq!(paired_difference(&[], &[]), None);
    }

    #[test]
    fn noisy_runs_overlap_one_and_single_pairs_have_no_interval() {
        let r = paired_ratio(&[100.0, 100.0, 100.0], &[120.0, 85.0, 101.0]).unwrap();
        assert_eq!(r.significance(), Significance::NoSignificantDifference);
        let r = paired_ratio(&[100.0], &[150.0]).unwrap();
        assert_eq!(
            (r.ci_low, r.significance()),
            (None, Significance::Undetermined)
        );
        assert_eq!(paired_ratio(&[0.0], &[1.0]), None);
        assert_eq!(paired_ratio(&[], &[]), None);
    }
}
