//! The key table: each tracked routing key with its preferred and current worker (`↷` when it was
//! served off its preferred one), its in-flight requests per worker, its requests and spills, and
//! the share of its requests served at home (on the preferred worker); counted since the last
//! policy change once one was seen, so the effect of a threshold change reads directly. Filtered
//! and sorted as the state says, with the filter prompt on the bottom border while it is typed.
//! The numbers get their full width first, then worker names (cut from the left, keeping the
//! port), then whole in-flight pairs; the key column takes what is left, cut in the middle.

use bch_core::telemetry::KeyRecord;
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Row, Table};

use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{clock, truncate_left, truncate_middle};
use crate::state::{Baseline, Panel, State};

/// Width of the `req` column: six digits.
const COUNT_W: u16 = 6;
/// Width of the `spills` column (its heading).
const SPILLS_W: u16 = 6;
/// Width of the `home` column: `100%`.
const HOME_W: u16 = 4;
/// The key column keeps this much (or the whole key, when shorter) before names give way.
const MIN_KEY_W: u16 = 8;
/// The key column never gets less than this.
const LEAST_KEY_W: u16 = 6;
/// Worker names are never cut below this: `…1.17:8000` keeps the end of the address and the port.
const MIN_NAME_W: u16 = 10;
/// Widest worker name shown; longer ones are cut from the left.
const MAX_NAME_W: u16 = 24;
/// The in-flight column never gets less than this: room for `11 on 3`.
const MIN_ACTIVE_W: u16 = 7;
/// Spaces between columns, five of them.
const SPACING: u16 = 5;

/// Draws the key table at `area`: a heading row, then the filtered rows from the scroll offset on.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let rows = state.key_rows();
    let block = block(state, rows.len(), styles);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height < 2 {
        return;
    }
    let visible = inner.height as usize - 1;
    let start = scroll_window(
        frame,
        area,
        state.scroll(Panel::Keys),
        rows.len(),
        visible,
        styles,
    );
    let shown: Vec<&KeyRecord> = rows.iter().skip(start).take(visible).copied().collect();
    let columns = Columns::new(state, &shown, inner.width);
    let baseline = state.visible().baseline.as_ref();
    let table_rows: Vec<Row> = shown
        .iter()
        .map(|k| key_row(k, &columns, baseline, styles))
        .collect();
    let header = Row::new([
        "key",
        "preferred → current",
        "active",
        "req",
        "spills",
        "home",
    ])
    .style(styles.table_header());
    let table = Table::new(table_rows, columns.widths())
        .header(header)
        .column_spacing(1);
    frame.render_widget(table, inner);
}

/// Column widths, the same for every row, worked out so that their sum fits the panel: the
/// table never has to squeeze a column and cut its text mid-item.
#[derive(Debug, Clone, Copy)]
struct Columns {
    /// Worker names, in the placement and in-flight columns, are cut from the left to this.
    name_w: u16,
    /// `preferred → current`.
    placement_w: u16,
    /// In-flight requests per worker: whole `worker:n` pairs, then `+N` for the rest.
    active_w: u16,
    /// `req`.
    requests_w: u16,
    /// Keys are cut in the middle to this.
    key_w: u16,
}

impl Columns {
    /// The numbers first, at full width; then worker names, kept whole when there is room and
    /// never cut below [`MIN_NAME_W`] (the port stays); the in-flight column gets room for at
    /// least its first whole pair while names can still give way, and what it needs when there
    /// is more; the key takes the rest.
    fn new(state: &State, shown: &[&KeyRecord], width: u16) -> Self {
        let longest_name = state
            .visible()
            .workers
            .iter()
            .map(|w| w.name.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(2, usize::from(MAX_NAME_W)) as u16;
        let longest = |f: &dyn Fn(&KeyRecord) -> usize| -> u16 {
            shown.iter().map(|k| f(k)).max().unwrap_or(0) as u16
        };
        let requests_w = COUNT_W;
        let count_digits = longest(&|k| {
            k.active
                .values()
                .map(|n| n.to_string().len())
                .max()
                .unwrap_or(0)
        });
        let wanted_key = longest(&|k| k.key.chars().count()).max(3);
        let key_min = wanted_key.min(MIN_KEY_W);
        let avail = width.saturating_sub(requests_w + SPILLS_W + HOME_W + SPACING);
        let placement = |name_w: u16| (name_w * 2 + 3).max(19);
        // One whole pair and a `+N` after it.
        let first_pair = |name_w: u16| (name_w + 1 + count_digits + 3).max(MIN_ACTIVE_W);
        let mut name_w = longest_name;
        while name_w > MIN_NAME_W.min(longest_name)
            && placement(name_w) + key_min + first_pair(name_w) > avail
        {
            name_w -= 1;
        }
        let placement_w = placement(name_w);
        let wanted_active = longest(&|k| active_text(k, name_w).chars().count()).max(6);
        let rest = avail.saturating_sub(placement_w);
        let active_w = wanted_active
            .min(rest.saturating_sub(key_min))
            .max(MIN_ACTIVE_W.min(wanted_active))
            .min(rest.saturating_sub(LEAST_KEY_W));
        let key_w = rest.saturating_sub(active_w).min(wanted_key.max(MIN_KEY_W));
        Self {
            name_w,
            placement_w,
            active_w,
            requests_w,
            key_w,
        }
    }

    fn widths(&self) -> [Constraint; 6] {
        [
            Constraint::Length(self.key_w),
            Constraint::Length(self.placement_w),
            Constraint::Min(self.active_w),
            Constraint::Length(self.requests_w),
            Constraint::Length(SPILLS_W),
            Constraint::Length(HOME_W),
        ]
    }
}

/// `w0:8 w1:2`: the key's in-flight requests per worker, names cut to `name_w`.
fn active_text(k: &KeyRecord, name_w: u16) -> String {
    k.active
        .iter()
        .map(|(w, n)| format!("{}:{n}", truncate_left(w, usize::from(name_w))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The in-flight column within `width`: whole `worker:n` pairs while they fit, then `+N`, the
/// requests in flight on the workers not listed; `11 on 3` (requests on workers) when not even
/// one pair fits. Never a pair cut in two.
fn active_cell(k: &KeyRecord, name_w: u16, width: u16) -> String {
    let width = usize::from(width);
    let total: u64 = k.active.values().sum();
    let mut shown = String::new();
    let mut shown_sum = 0;
    let mut shown_pairs = 0;
    for (i, (worker, n)) in k.active.iter().enumerate() {
        let pair = format!("{}:{n}", truncate_left(worker, usize::from(name_w)));
        let candidate = if shown.is_empty() {
            pair
        } else {
            format!("{shown} {pair}")
        };
        let rest = total - shown_sum - n;
        let suffix = if i + 1 < k.active.len() {
            format!(" +{rest}")
        } else {
            String::new()
        };
        if candidate.chars().count() + suffix.chars().count() > width {
            break;
        }
        shown = candidate;
        shown_sum += n;
        shown_pairs += 1;
    }
    if shown_pairs == k.active.len() {
        return shown;
    }
    if !shown.is_empty() {
        return format!("{shown} +{}", total - shown_sum);
    }
    let summary = format!("{total} on {}", k.active.len());
    if summary.chars().count() <= width {
        summary
    } else {
        total.to_string()
    }
}

/// The panel's block: ` Keys 7/8 sort recent ` with the kept filter in the title, or the prompt on
/// the bottom border while the filter is being typed.
fn block(state: &State, shown: usize, styles: &Styles) -> Block<'static> {
    let ui = state.ui();
    let mut title = vec![
        Span::raw(" Keys "),
        Span::styled(
            format!("{shown}/{} ", state.visible().keys.len()),
            styles.dim(),
        ),
        Span::styled(format!("sort {} ", ui.sort().name()), styles.dim()),
    ];
    if let Some(baseline) = &state.visible().baseline {
        title.push(Span::styled(
            format!(
                "counts since the policy change at {} ",
                clock(baseline.ts_ms)
            ),
            styles.dim(),
        ));
    }
    if !ui.filter().is_empty() && !ui.filter_editing() {
        title.push(Span::styled(
            format!("filter \"{}\" ", ui.filter()),
            styles.tone(Tone::Warning),
        ));
    }
    let block = panel_block(ui.focus() == Panel::Keys, Line::from(title), styles);
    if !ui.filter_editing() {
        return block;
    }
    block.title_bottom(Line::from(vec![
        Span::styled(format!(" /{}▏", ui.filter()), styles.prompt()),
        Span::styled(" Enter keep · Esc clear ", styles.dim()),
    ]))
}

/// One key: label, placement, in-flight requests per worker, requests and spills (since the
/// baseline, when there is one) and the share served at home. A spilled key's row is tinted as
/// well as marked `↷`.
fn key_row(
    k: &KeyRecord,
    columns: &Columns,
    baseline: Option<&Baseline>,
    styles: &Styles,
) -> Row<'static> {
    let name_w = usize::from(columns.name_w);
    let requests_w = usize::from(columns.requests_w);
    let spilled = k.preferred != k.current;
    let placement = format!(
        "{:<name_w$} {} {}",
        truncate_left(&k.preferred, name_w),
        if spilled { "↷" } else { "→" },
        truncate_left(&k.current, name_w)
    );
    let style = if spilled {
        styles.tone(Tone::Warning)
    } else {
        styles.plain()
    };
    let (requests, spills) = baseline.map_or((k.requests_total, k.spills_total), |b| b.since(k));
    let home = ((requests - spills.min(requests)) * 100)
        .checked_div(requests)
        .map_or_else(|| "-".to_owned(), |share| format!("{share}%"));
    Row::new([
        Cell::from(truncate_middle(&k.key, usize::from(columns.key_w))),
        Cell::from(placement),
        Cell::from(active_cell(k, columns.name_w, columns.active_w)),
        Cell::from(format!("{requests:>requests_w$}")),
        Cell::from(format!("{spills:>6}")),
        Cell::from(format!("{home:>4}")),
    ])
    .style(style)
}
