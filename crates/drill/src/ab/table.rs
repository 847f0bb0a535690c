//! The tables `bch-drill ab` prints: what ran, the means per cell, the paired intervals of every cell
//! against the baseline and of the candidates against each other, then the verdict.

use std::fmt;

use super::report::{AbReport, CellSummary, Comparison};
use crate::stats::{PairedDifference, PairedRatio, Significance};

/// `1.075 (1.021-1.132)*`: a ratio and its interval, starred when the interval excludes 1.
fn ratio_cell(r: Option<&PairedRatio>) -> String {
    let Some(r) = r else {
        return "n/a".to_owned();
    };
    let mark = star(r.significance());
    match (r.ci_low, r.ci_high) {
        (Some(l), Some(h)) => format!("{:.3} ({l:.3}-{h:.3}){mark}", r.ratio),
        _ => format!("{:.3} (n={})", r.ratio, r.n),
    }
}

/// `-12.1 (-12.5..-11.7)*`: a difference in percentage points and its interval.
fn difference_cell(d: Option<&PairedDifference>, reported: bool) -> String {
    let Some(d) = d.filter(|_| reported) else {
        return "n/a".to_owned();
    };
    let mark = star(d.significance());
    match (d.ci_low, d.ci_high) {
        (Some(l), Some(h)) => format!(
            "{:+.1} ({:+.1}..{:+.1}){mark}",
            d.mean * 100.0,
            l * 100.0,
            h * 100.0
        ),
        _ => format!("{:+.1} (n={})", d.mean * 100.0, d.n),
    }
}

fn star(s: Significance) -> &'static str {
    match s {
        Significance::Higher | Significance::Lower => "*",
        _ => "",
    }
}

fn percent_or_na(value: f64, known: bool) -> String {
    if known {
        format!("{:.1}%", value * 100.0)
    } else {
        "n/a".to_owned()
    }
}

impl AbReport {
    fn fmt_header(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.meta;
        writeln!(f, "{}: {}", m.tool, m.storm)?;
        if self.replicas > 1 {
            writeln!(
                f,
                "through {} gateway replicas (requests round-robin)",
                self.replicas
            )?;
        }
        writeln!(
            f,
            "{} repetitions per cell, interleaved; prompt seed {} ({}); {} to {}",
            self.reps,
            m.seed,
            if m.seed_given { "given" } else { "random" },
            m.started_at,
            m.finished_at
        )
    }

    fn fmt_means(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<22} {:>8} {:>11} {:>11} {:>8} {:>8} {:>7} {:>7}",
            "cell", "req/s", "TTFT mean", "TTFT p99", "hottest", "2nd", "spill", "cached"
        )?;
        for c in &self.cells {
            writeln!(
                f,
                "{:<22} {:>8.1} {:>8.1} ms {:>8.1} ms {:>7.1}% {:>7.1}% {:>6.1}% {:>7}",
                c.label,
                c.throughput_rps,
                c.ttft_mean_ms,
                c.ttft_p99_ms,
                c.hottest_worker_share * 100.0,
                c.second_hottest_worker_share * 100.0,
                c.spill_fraction * 100.0,
                percent_or_na(c.cached_token_fraction, c.cached_reported),
            )?;
        }
        self.fmt_overload(f)
    }

    /// Under overload (any shed, unclean answer or TTFT objective): goodput and sheds per cell,
    /// summed over the runs; nothing otherwise.
    fn fmt_overload(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let overloaded = |c: &CellSummary| c.shed + c.unclean > 0 || c.goodput_rps.is_some();
        if !self.cells.iter().any(overloaded) {
            return Ok(());
        }
        writeln!(
            f,
            "\n{:<22} {:>10} {:>8} {:>8}",
            "cell", "goodput/s", "shed", "unclean"
        )?;
        for c in &self.cells {
            let goodput = c
                .goodput_rps
                .map_or_else(|| "n/a".to_owned(), |g| format!("{g:.1}"));
            let mark = if c.unclean > 0 { "  NOT CLEAN" } else { "" };
            writeln!(
                f,
                "{:<22} {goodput:>10} {:>8} {:>8}{mark}",
                c.label, c.shed, c.unclean
            )?;
        }
        Ok(())
    }

    fn fmt_paired(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cells.len() < 2 {
            return Ok(());
        }
        writeln!(
            f,
            "\npaired vs {} (ratio or difference, 95% CI; * = the interval excludes no change)",
            self.baseline
        )?;
        writeln!(
            f,
            "{:<22} {:>22} {:>22} {:>22} {:>22}",
            "cell", "throughput", "TTFT mean", "TTFT p99", "cached (pp)"
        )?;
        for c in &self.cells[1..] {
            self.fmt_paired_row(f, c)?;
        }
        if !self.comparisons.is_empty() {
            writeln!(f, "\ncandidates against each other (second / first)")?;
            for c in &self.comparisons {
                fmt_comparison_row(f, c)?;
            }
        }
        Ok(())
    }

    fn fmt_paired_row(&self, f: &mut fmt::Formatter<'_>, c: &CellSummary) -> fmt::Result {
        writeln!(
            f,
            "{:<22} {:>22} {:>22} {:>22} {:>22}",
            c.label,
            ratio_cell(c.ratio.as_ref()),
            ratio_cell(c.ttft_mean_ratio.as_ref()),
            ratio_cell(c.ttft_p99_ratio.as_ref()),
            difference_cell(c.cached_difference.as_ref(), c.cached_reported),
        )
    }
}

fn fmt_comparison_row(f: &mut fmt::Formatter<'_>, c: &Comparison) -> fmt::Result {
    writeln!(
        f,
        "{:<22} {:>22} {:>22} {:>22} {:>22}",
        format!("{} / {}", c.b, c.a),
        ratio_cell(c.throughput.as_ref()),
        ratio_cell(c.ttft_mean.as_ref()),
        ratio_cell(c.ttft_p99.as_ref()),
        difference_cell(c.cached.as_ref(), true),
    )
}

impl fmt::Display for AbReport {
    /// What ran, the means, the paired intervals, then the verdict.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_header(f)?;
        self.fmt_means(f)?;
        self.fmt_paired(f)?;
        writeln!(f)?;
        for line in &self.verdict {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}
