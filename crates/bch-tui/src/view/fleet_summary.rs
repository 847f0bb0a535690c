//! What the workers panel needs to know about the whole fleet, gathered in one pass per frame
//! ([`Census`]: counts for the title, widths and scale for the rows, the hottest worker), and the
//! fleet summary row drawn under the legend when not every worker has a row: a histogram of the
//! loads, the OVER and FULL counts and the hottest worker. At 10,000 workers a frame walks the
//! fleet a few times and builds only the rows on screen.

use bch_core::telemetry::{WorkerRecord, WorkerState};
use ratatui::text::{Line, Span};

use super::styles::{Styles, Tone};
use super::text::printable;
use crate::state::{FleetPicture, OverRule};

/// Histogram cells, from one worker (or none) to the fullest bucket.
const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Widest histogram, in cells (buckets).
const MAX_BUCKETS: usize = 24;
/// Narrowest histogram worth drawing.
const MIN_BUCKETS: usize = 8;

/// Counts and extremes over every worker of a fleet, from one pass.
#[derive(Debug, Clone, Default)]
pub(super) struct Census {
    /// Workers that pass their health checks.
    pub(super) healthy: usize,
    /// Workers being drained.
    pub(super) draining: usize,
    /// Workers found by DNS discovery.
    pub(super) discovered: usize,
    /// Workers at their cap (or whose engine reported saturation).
    pub(super) full: usize,
    /// Routable workers whose keys would spill on their next request.
    pub(super) over: usize,
    /// Whether some worker's load is read locally because its scrape is stale.
    pub(super) any_stale: bool,
    /// The highest load the rule reads.
    pub(super) max_load: u64,
    /// The highest per-worker capacity (0 without one).
    pub(super) max_cap: u64,
    /// Whether some worker has a capacity.
    pub(super) any_capacity: bool,
    /// The longest name in characters, counted only up to `name_cap`.
    pub(super) name_w: usize,
    /// The longest source label (`dns:…`) of a discovered worker, up to `name_cap`.
    pub(super) source_w: usize,
    /// Index of the hottest worker (the first among equals).
    pub(super) hottest: Option<usize>,
}

impl Census {
    /// One pass over `fleet`'s workers; `rule` decides OVER. Widths are counted up to
    /// `width_cap` only: a name longer than that is cut anyway, and a byte length at or below the
    /// widest so far cannot be wider (a character takes at least one byte).
    pub(super) fn of(fleet: &FleetPicture, rule: &OverRule, width_cap: usize) -> Self {
        let mut c = Census::default();
        for (i, w) in fleet.workers.iter().enumerate() {
            c.healthy += usize::from(w.healthy);
            c.draining += usize::from(w.state == WorkerState::Draining);
            c.full += usize::from(w.full);
            c.any_stale |= w.load_stale;
            let load = w.rule_load();
            if c.hottest.is_none() || load > c.max_load {
                c.max_load = load;
                c.hottest = Some(i);
            }
            if let Some(cap) = w.capacity {
                c.any_capacity = true;
                c.max_cap = c.max_cap.max(cap);
            }
            if rule.over(w) {
                c.over += 1;
            }
            c.name_w = widest(c.name_w, &w.name, width_cap);
            if w.source.is_discovered() {
                c.discovered += 1;
                c.source_w = widest(c.source_w, &w.source.to_string(), width_cap);
            }
        }
        c
    }
}

/// `so_far`, or the width of `text` when it is wider, counted no further than `cap` (the same
/// shortcut as `text::widest`, one text at a time).
fn widest(so_far: usize, text: &str, cap: usize) -> usize {
    if text.len() <= so_far || so_far >= cap {
        so_far
    } else {
        so_far.max(printable(text).chars().take(cap).count())
    }
}

/// The summary row, fitted to `width`: `loads ▁█▆▃▁  ▁ 0–64 · 126 OVER · 3 FULL · hottest
/// gpu-06666 64`. The histogram counts the workers in each of equal load buckets from 0 to the
/// highest load (a bucket with any worker shows at least `▁`, so a lone hot worker stands out); the
/// parts after it give way from the right when the row is narrow.
pub(super) fn summary_line(
    fleet: &FleetPicture,
    census: &Census,
    width: usize,
    styles: &Styles,
) -> Line<'static> {
    let label = "loads ";
    let range = format!(" 0–{}", census.max_load);
    let count_tone = |n: usize| styles.tone(if n > 0 { Tone::Alert } else { Tone::Good });
    let mut parts = vec![
        Span::styled(format!(" · {} OVER", census.over), count_tone(census.over)),
        Span::styled(format!(" · {} FULL", census.full), count_tone(census.full)),
    ];
    if let Some(w) = census.hottest.map(|i| &fleet.workers[i]) {
        parts.push(Span::styled(
            format!(" · hottest {} {}", printable(&w.name), w.rule_load()),
            styles.dim(),
        ));
    }
    // The counts matter more than a wide histogram: drop parts from the right only when the
    // histogram would be left fewer than its narrowest.
    let fixed = label.len() + range.chars().count();
    while !parts.is_empty() {
        let used: usize = fixed + parts.iter().map(Span::width).sum::<usize>();
        if used + MIN_BUCKETS <= width {
            break;
        }
        parts.pop();
    }
    let room = width
        .saturating_sub(fixed + parts.iter().map(Span::width).sum::<usize>())
        .min(MAX_BUCKETS);
    if room < MIN_BUCKETS {
        return Line::default();
    }
    // One load level per cell while the loads are low, so no cell stands for nothing.
    let buckets = room.min(usize::try_from(census.max_load).map_or(room, |m| m + 1));
    let mut spans = vec![
        Span::styled(label, styles.dim()),
        Span::styled(
            histogram(&fleet.workers, census.max_load, buckets),
            styles.value(),
        ),
        Span::styled(range, styles.dim()),
    ];
    spans.extend(parts);
    Line::from(spans)
}

/// `buckets` cells, one per equal slice of `0..=max_load`, each as tall as its share of the
/// fullest bucket; an empty bucket is a space.
fn histogram(workers: &[WorkerRecord], max_load: u64, buckets: usize) -> String {
    let mut counts = vec![0usize; buckets];
    let span = max_load + 1;
    for w in workers {
        // Loads are far below 2^58, so the product cannot saturate in practice.
        let bucket = (w.rule_load().saturating_mul(buckets as u64) / span) as usize;
        counts[bucket.min(buckets - 1)] += 1;
    }
    let fullest = counts.iter().copied().max().unwrap_or(0).max(1);
    counts
        .iter()
        .map(|&n| match n {
            0 => ' ',
            _ => LEVELS[((n * LEVELS.len()).div_ceil(fullest) - 1).min(LEVELS.len() - 1)],
        })
        .collect()
}
