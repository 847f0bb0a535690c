//! The A/B harness: the same storm under several routing policies ("cells"), repeated and
//! interleaved, with paired throughput ratios against the first cell.
//!
//! Cells are written `strict,gap=1,gap=2,gap=4`: cells are separated by `,`, and options within a cell
//! by `:`, e.g. `gap=2:skew=1.25`. See [`parse_cells`].
//!
//! Repetitions are interleaved: repetition 1 runs every cell in the given order, repetition 2 in
//! reverse, repetition 3 forward again, and so on. Over each pair of repetitions every cell sits at
//! the same mean position, so a linear drift of the machine (warming, throttling) cancels instead of
//! favouring the cells that happen to run first. Each run uses its own prompt seed, so every run starts
//! with prompts that no worker has cached: a cell never inherits a warm cache from the run before it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use reqwest::Url;
use serde::Serialize;
use serde_json::Value;

use bch_core::policy::{PolicyKind, PolicyPatch};

use crate::control::ControlClient;
use crate::stats::{PairedRatio, Significance, mean, paired_ratio};
use crate::storm::{StormConfig, StormReport, run_storm};

/// One policy setting under test.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// The cell as written, e.g. `gap=2:skew=1.25`.
    pub label: String,
    /// The `PUT /admin/policy` body that selects it.
    pub policy: PolicyPatch,
}

/// `max_load_skew` of a bounded cell that names none.
pub const DEFAULT_SKEW: f64 = 1.5;
/// `min_load_gap` of a bounded cell that names none (gatewayd's default).
pub const DEFAULT_GAP: u64 = 2;

/// Parses a cell list.
///
/// Cells are separated by `,`; options within a cell by `:`. Options:
///
/// - `strict` (or `consistent_hashing`): `{"kind":"consistent_hashing"}`;
/// - `bounded` (or `bounded_consistent_hashing`): the bounded policy with default thresholds;
/// - `gap=N`: bounded with `min_load_gap` N; `skew=X`: bounded with `max_load_skew` X. A bounded cell
///   always sends both thresholds (defaults gap 2, skew 1.5), so a cell never inherits the previous
///   cell's value;
/// - `round_robin` (or `rr`), `random`: the baselines;
/// - `vnodes=N`: `virtual_nodes` N, combinable with any of the above.
pub fn parse_cells(spec: &str) -> anyhow::Result<Vec<Cell>> {
    let mut cells: Vec<Cell> = Vec::new();
    for label in spec.split(',').map(str::trim) {
        anyhow::ensure!(!label.is_empty(), "empty cell in {spec:?}");
        let cell = parse_cell(label).with_context(|| format!("in cell {label:?}"))?;
        anyhow::ensure!(
            cells.iter().all(|c| c.label != cell.label),
            "cell {label:?} appears twice"
        );
        cells.push(cell);
    }
    Ok(cells)
}

fn parse_cell(label: &str) -> anyhow::Result<Cell> {
    let mut kind: Option<PolicyKind> = None;
    let (mut gap, mut skew, mut vnodes) = (None, None, None);
    let mut set_kind = |k: PolicyKind| -> anyhow::Result<()> {
        anyhow::ensure!(
            kind.is_none_or(|old| old == k),
            "two policy kinds in one cell"
        );
        kind = Some(k);
        Ok(())
    };
    for option in label.split(':').map(str::trim) {
        match option.split_once('=') {
            None => match option {
                "strict" | "consistent_hashing" => set_kind(PolicyKind::ConsistentHashing)?,
                "bounded" | "bounded_consistent_hashing" => {
                    set_kind(PolicyKind::BoundedConsistentHashing)?
                }
                "rr" | "round_robin" => set_kind(PolicyKind::RoundRobin)?,
                "random" => set_kind(PolicyKind::Random)?,
                other => anyhow::bail!(
                    "unknown option {other:?}; expected strict, bounded, gap=N, skew=X, vnodes=N, \
                     round_robin or random"
                ),
            },
            Some(("gap", n)) => {
                set_kind(PolicyKind::BoundedConsistentHashing)?;
                gap = Some(
                    n.parse::<u64>()
                        .with_context(|| format!("gap must be an integer >= 0, got {n:?}"))?,
                );
            }
            Some(("skew", x)) => {
                set_kind(PolicyKind::BoundedConsistentHashing)?;
                let x: f64 = x
                    .parse()
                    .with_context(|| format!("skew must be a number, got {x:?}"))?;
                anyhow::ensure!(
                    x.is_finite() && x >= 1.0,
                    "skew must be a finite number >= 1.0, got {x}"
                );
                skew = Some(x);
            }
            Some(("vnodes", n)) => {
                let n: u32 = n
                    .parse()
                    .with_context(|| format!("vnodes must be a positive integer, got {n:?}"))?;
                anyhow::ensure!(n > 0, "vnodes must be at least 1");
                vnodes = Some(n);
            }
            Some((other, _)) => {
                anyhow::bail!("unknown option {other:?}; expected gap, skew or vnodes")
            }
        }
    }
    let kind =
        kind.context("no policy: name strict, bounded, gap=N, skew=X, round_robin or random")?;
    let bounded = kind == PolicyKind::BoundedConsistentHashing;
    Ok(Cell {
        label: label.to_owned(),
        policy: PolicyPatch {
            kind: Some(kind),
            min_load_gap: bounded.then(|| gap.unwrap_or(DEFAULT_GAP)),
            max_load_skew: bounded.then(|| skew.unwrap_or(DEFAULT_SKEW)),
            virtual_nodes: vnodes,
        },
    })
}

/// The interleaved run order: `(repetition, cell index)` pairs, forward on even repetitions (counting
/// from 0) and reversed on odd ones.
pub fn run_order(cells: usize, reps: usize) -> Vec<(usize, usize)> {
    (0..reps)
        .flat_map(|rep| {
            (0..cells).map(move |i| (rep, if rep % 2 == 0 { i } else { cells - 1 - i }))
        })
        .collect()
}

/// What an A/B run compares and where.
#[derive(Clone, Debug)]
pub struct AbConfig {
    /// The storm of every run; its `seed` is the base of the per-run seeds, and its `control` is
    /// replaced by [`AbConfig::control`].
    pub storm: StormConfig,
    /// Control-plane URL of the gateway under test.
    pub control: Url,
    /// Bearer token for the control plane.
    pub control_token: Option<String>,
    /// Cells; the first is the baseline.
    pub cells: Vec<Cell>,
    /// Repetitions of every cell.
    pub reps: usize,
}

/// One storm of one cell in one repetition.
#[derive(Clone, Debug, Serialize)]
pub struct AbRun {
    /// Repetition, from 1.
    pub rep: usize,
    /// Cell label.
    pub cell: String,
    /// Position in the overall run order, from 1.
    pub order: usize,
    /// The policy as the gateway answered the `PUT`.
    pub policy: Value,
    /// The storm's report.
    pub report: StormReport,
}

/// A cell's results over all repetitions.
#[derive(Clone, Debug, Serialize)]
pub struct CellSummary {
    /// Cell label.
    pub label: String,
    /// The policy body sent.
    pub policy: PolicyPatch,
    /// Runs of this cell.
    pub runs: usize,
    /// Mean throughput, requests per second.
    pub throughput_rps: f64,
    /// Throughput relative to the baseline, paired by repetition (`None` for the baseline itself).
    pub ratio: Option<PairedRatio>,
    /// What the ratio's interval says (`None` for the baseline).
    pub significance: Option<Significance>,
    /// Mean over runs of the mean TTFT, ms.
    pub ttft_mean_ms: f64,
    /// Mean over runs of the p99 TTFT, ms.
    pub ttft_p99_ms: f64,
    /// Mean over runs of the hottest worker's share of responses.
    pub hottest_worker_share: f64,
    /// Mean over runs of the spill fraction.
    pub spill_fraction: f64,
    /// Mean over runs of the cached-token fraction.
    pub cached_token_fraction: f64,
    /// Failed requests over all runs.
    pub errors: u64,
    /// True when every run ended with every worker's `active` back at 0.
    pub drained: bool,
}

/// The A/B result: per-cell summaries, the verdict and every run.
#[derive(Clone, Debug, Serialize)]
pub struct AbReport {
    /// Label of the baseline cell.
    pub baseline: String,
    /// Repetitions.
    pub reps: usize,
    /// Per-cell summaries, in cell order.
    pub cells: Vec<CellSummary>,
    /// Human-readable conclusions.
    pub verdict: Vec<String>,
    /// Every run, in the order it ran.
    pub runs: Vec<AbRun>,
}

/// Runs every cell `reps` times in interleaved order, calling `on_run` after each run (for progress
/// output), and summarises.
pub async fn run_ab(config: &AbConfig, mut on_run: impl FnMut(&AbRun)) -> anyhow::Result<AbReport> {
    anyhow::ensure!(!config.cells.is_empty(), "no cells to compare");
    anyhow::ensure!(config.reps > 0, "reps must be at least 1");
    let control = ControlClient::new(&config.control, config.control_token.clone());
    // Fail on an unreachable control plane before the first storm, not after it.
    control.workers().await?;
    let mut runs = Vec::new();
    for (order, (rep, cell_index)) in run_order(config.cells.len(), config.reps)
        .into_iter()
        .enumerate()
    {
        let cell = &config.cells[cell_index];
        let policy = control
            .set_policy(&cell.policy)
            .await
            .with_context(|| format!("switching the policy to cell {}", cell.label))?;
        // Start from an idle fleet, whatever the previous run left in flight.
        let idle = control.wait_drained(Duration::from_secs(5)).await?;
        if !idle.all_zero {
            tracing::warn!(cell = %cell.label, active = ?idle.active, "starting a run on a fleet that is not idle");
        }
        let storm = StormConfig {
            control: Some(config.control.clone()),
            control_token: config.control_token.clone(),
            seed: config
                .storm
                .seed
                .wrapping_add(1_000_003 * (order as u64 + 1)),
            ..config.storm.clone()
        };
        let report = run_storm(&storm)
            .await
            .with_context(|| format!("storm of cell {} in repetition {}", cell.label, rep + 1))?;
        let run = AbRun {
            rep: rep + 1,
            cell: cell.label.clone(),
            order: order + 1,
            policy,
            report,
        };
        on_run(&run);
        runs.push(run);
    }
    Ok(summarise(&config.cells, config.reps, runs))
}

/// Builds the per-cell summaries and verdict from finished runs.
pub fn summarise(cells: &[Cell], reps: usize, runs: Vec<AbRun>) -> AbReport {
    // Throughput per cell, indexed by repetition, for pairing.
    let per_rep = |label: &str| -> BTreeMap<usize, f64> {
        runs.iter()
            .filter(|r| r.cell == label)
            .map(|r| (r.rep, r.report.throughput_rps))
            .collect()
    };
    let baseline = per_rep(&cells[0].label);
    let summaries: Vec<CellSummary> = cells
        .iter()
        .enumerate()
        .map(|(i, cell)| {
            let mine: Vec<&AbRun> = runs.iter().filter(|r| r.cell == cell.label).collect();
            let avg = |f: &dyn Fn(&StormReport) -> f64| {
                mean(&mine.iter().map(|r| f(&r.report)).collect::<Vec<_>>())
            };
            let ratio = (i > 0)
                .then(|| {
                    let other = per_rep(&cell.label);
                    let (b, o): (Vec<f64>, Vec<f64>) = other
                        .iter()
                        .filter_map(|(rep, v)| baseline.get(rep).map(|b| (*b, *v)))
                        .unzip();
                    paired_ratio(&b, &o)
                })
                .flatten();
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
        })
        .collect();
    let verdict = verdict(&summaries);
    AbReport {
        baseline: cells[0].label.clone(),
        reps,
        cells: summaries,
        verdict,
        runs,
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
pub fn verdict(cells: &[CellSummary]) -> Vec<String> {
    let Some(base) = cells.first() else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    let differing: Vec<String> = cells[1..]
        .iter()
        .filter_map(|c| match c.significance {
            Some(Significance::Higher) => Some(format!("{} (higher)", c.label)),
            Some(Significance::Lower) => Some(format!("{} (lower)", c.label)),
            _ => None,
        })
        .collect();
    if cells.len() > 1 {
        lines.push(if differing.is_empty() {
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
        });
    }
    for c in &cells[1..] {
        let line = match (&c.ratio, c.significance) {
            (None, _) => format!("{}: no throughput to compare with {}", c.label, base.label),
            (Some(r), Some(Significance::Higher)) => {
                format!(
                    "{}: {} vs {}: significantly higher throughput",
                    c.label,
                    ci_text(r),
                    base.label
                )
            }
            (Some(r), Some(Significance::Lower)) => {
                format!(
                    "{}: {} vs {}: significantly lower throughput",
                    c.label,
                    ci_text(r),
                    base.label
                )
            }
            (Some(r), Some(Significance::NoSignificantDifference)) => format!(
                "{}: {} vs {}: interval overlaps 1.0, no significant difference",
                c.label,
                ci_text(r),
                base.label
            ),
            (Some(r), _) => format!(
                "{}: {} vs {} from {} paired repetition(s): too few for a confidence interval (use --reps 2 or more)",
                c.label,
                ci_text(r),
                base.label,
                r.n
            ),
        };
        lines.push(line);
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
    lines
}

impl fmt::Display for AbReport {
    /// The comparison table followed by the verdict.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vs = format!("vs {} (95% CI)", self.baseline);
        writeln!(
            f,
            "{:<16} {:>10} {:>26} {:>11} {:>11} {:>8} {:>7} {:>7}",
            "cell", "req/s", vs, "TTFT mean", "TTFT p99", "hottest", "spill", "cached"
        )?;
        for c in &self.cells {
            let ratio = match &c.ratio {
                None => "1 (baseline)".to_owned(),
                Some(r) => {
                    let mark = match r.significance() {
                        Significance::Higher | Significance::Lower => " *",
                        _ => "",
                    };
                    match (r.ci_low, r.ci_high) {
                        (Some(l), Some(h)) => format!("{:.3} ({l:.3}-{h:.3}){mark}", r.ratio),
                        _ => format!("{:.3} (n={})", r.ratio, r.n),
                    }
                }
            };
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

/// Writes a two-panel chart: throughput per cell (mean bar, one dot per repetition) and TTFT per cell
/// (p99 as a light bar, mean as a dark bar inside it). SVG for a `.svg` path, PNG otherwise.
pub fn write_plot(report: &AbReport, path: &Path) -> anyhow::Result<()> {
    let size = (1100, 480);
    let is_svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let result = if is_svg {
        draw(report, SVGBackend::new(path, size).into_drawing_area())
    } else {
        draw(report, BitMapBackend::new(path, size).into_drawing_area())
    };
    result.with_context(|| format!("writing the plot {}", path.display()))
}

/// One x segment per cell. A segmented `0..n` range has a segment for `n` too, so the range ends at
/// `n - 1`.
fn segments(
    n: i32,
) -> plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordi32> {
    (0..(n - 1).max(1)).into_segmented()
}

fn draw<DB: DrawingBackend>(report: &AbReport, root: DrawingArea<DB, Shift>) -> anyhow::Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(550);
    let labels: Vec<String> = report.cells.iter().map(|c| c.label.clone()).collect();
    let n = labels.len() as i32;
    let label_of = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    };

    let rep_values: Vec<(i32, f64)> = report
        .runs
        .iter()
        .filter_map(|r| {
            labels
                .iter()
                .position(|l| *l == r.cell)
                .map(|i| (i as i32, r.report.throughput_rps))
        })
        .collect();
    let top = rep_values.iter().map(|(_, v)| *v).fold(1.0_f64, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            format!("throughput (ratio vs {})", report.baseline),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(segments(n), 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(labels.len())
        .x_label_formatter(&label_of)
        .y_desc("requests/s")
        .draw()
        .map_err(err)?;
    let bar = RGBColor(70, 110, 180);
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(bar.mix(0.75).filled())
                .margin(14)
                .data(
                    report
                        .cells
                        .iter()
                        .enumerate()
                        .map(|(i, c)| (i as i32, c.throughput_rps)),
                ),
        )
        .map_err(err)?
        .label("mean")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], bar.filled()));
    let ratio_style =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(report.cells.iter().enumerate().map(|(i, c)| {
            let text = c
                .ratio
                .map_or_else(|| "1.000x".to_owned(), |r| format!("{:.3}x", r.ratio));
            // Above the bar and above every repetition's dot.
            let peak = rep_values
                .iter()
                .filter(|(cell, _)| *cell == i as i32)
                .fold(c.throughput_rps, |m, (_, v)| m.max(*v));
            let at = (SegmentValue::CenterOf(i as i32), peak * 1.03);
            Text::new(text, at, ratio_style.clone())
        }))
        .map_err(err)?;
    chart
        .draw_series(
            rep_values
                .iter()
                .map(|(i, v)| Circle::new((SegmentValue::CenterOf(*i), *v), 3, BLACK.filled())),
        )
        .map_err(err)?
        .label("one repetition")
        .legend(|(x, y)| Circle::new((x + 6, y), 3, BLACK.filled()));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;

    let top = report
        .cells
        .iter()
        .map(|c| c.ttft_p99_ms.max(c.ttft_mean_ms))
        .fold(1.0_f64, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&right)
        .caption("time to first token", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(segments(n), 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(labels.len())
        .x_label_formatter(&label_of)
        .y_desc("ms")
        .draw()
        .map_err(err)?;
    // p99 drawn first and wider, the mean inside it: one bar per cell shows both.
    type Series = (&'static str, RGBColor, u32, fn(&CellSummary) -> f64);
    let series: [Series; 2] = [
        ("p99", RGBColor(240, 170, 90), 10, |c| c.ttft_p99_ms),
        ("mean", RGBColor(190, 80, 40), 30, |c| c.ttft_mean_ms),
    ];
    for (label, color, margin, value) in series {
        chart
            .draw_series(
                Histogram::vertical(&chart)
                    .style(color.filled())
                    .margin(margin)
                    .data(
                        report
                            .cells
                            .iter()
                            .enumerate()
                            .map(|(i, c)| (i as i32, value(c))),
                    ),
            )
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::paired_ratio;

    #[test]
    fn cells_parse_into_policy_bodies() {
        let cells = parse_cells("strict, gap=1,gap=2:skew=1.25,bounded:vnodes=300,rr").unwrap();
        let bodies: Vec<Value> = cells
            .iter()
            .map(|c| serde_json::to_value(c.policy).unwrap())
            .collect();
        assert_eq!(bodies[0], serde_json::json!({"kind": "consistent_hashing"}));
        assert_eq!(
            bodies[1],
            serde_json::json!({"kind": "bounded_consistent_hashing", "min_load_gap": 1, "max_load_skew": 1.5})
        );
        assert_eq!(
            bodies[2],
            serde_json::json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.25})
        );
        assert_eq!(
            bodies[3],
            serde_json::json!({"kind": "bounded_consistent_hashing", "min_load_gap": 2, "max_load_skew": 1.5,
                "virtual_nodes": 300})
        );
        assert_eq!(bodies[4], serde_json::json!({"kind": "round_robin"}));
        assert_eq!(cells[2].label, "gap=2:skew=1.25");
    }

    #[test]
    fn bad_cells_are_rejected_with_the_reason() {
        let err = |s: &str| format!("{:#}", parse_cells(s).unwrap_err());
        assert!(err("strict,,gap=1").contains("empty cell"));
        assert!(err("gap=x").contains("gap must be an integer"));
        assert!(err("skew=0.5").contains("skew must be a finite number >= 1.0"));
        assert!(err("strict:gap=1").contains("two policy kinds"));
        assert!(err("fast").contains("unknown option \"fast\""));
        assert!(err("vnodes=10").contains("no policy"));
        assert!(err("gap=1,gap=1").contains("appears twice"));
    }

    #[test]
    fn repetitions_alternate_direction() {
        assert_eq!(
            run_order(3, 3),
            vec![
                (0, 0),
                (0, 1),
                (0, 2),
                (1, 2),
                (1, 1),
                (1, 0),
                (2, 0),
                (2, 1),
                (2, 2)
            ]
        );
        // Over a pair of repetitions every cell has the same mean position.
        let order = run_order(4, 2);
        for cell in 0..4 {
            let positions: usize = order
                .iter()
                .enumerate()
                .filter(|(_, (_, c))| *c == cell)
                .map(|(p, _)| p)
                .sum();
            assert_eq!(positions, 7);
        }
    }

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
