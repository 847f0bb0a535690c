//! The key table: each tracked routing key with its preferred and current worker (`↷` when it was
//! served off its preferred one), its in-flight requests per worker, its requests and spills, and
//! the share of its requests served at home (on the preferred worker); counted since the last
//! policy change once one was seen, so the effect of a threshold change reads directly. Filtered
//! and sorted as the state says, with the filter prompt on the bottom border while it is typed.
//! The numbers get their full width first; the key column takes what is left.

use bch_core::telemetry::KeyRecord;
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Row, Table};

use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{clock, truncate_left, truncate_middle};
use crate::state::{Baseline, Panel, State};

/// Fixed widths of the `req` and `spills` columns.
const COUNT_W: u16 = 6;
/// Width of the `home` column: `100%`.
const HOME_W: u16 = 4;
/// The key column never gets less than this.
const MIN_KEY_W: u16 = 8;

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

/// Column widths, the same for every row.
#[derive(Debug, Clone, Copy)]
struct Columns {
    /// Worker names in the placement column are cut to this.
    name_w: u16,
    /// `preferred → current`.
    placement_w: u16,
    /// In-flight requests per worker, as wide as the widest shown row needs (within reason).
    active_w: u16,
    /// Keys are cut to this.
    key_w: u16,
}

impl Columns {
    fn new(state: &State, shown: &[&KeyRecord], width: u16) -> Self {
        let name_w = state
            .visible()
            .workers
            .iter()
            .map(|w| w.name.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(2, 12) as u16;
        let placement_w = (name_w * 2 + 3).max(19);
        let numbers = COUNT_W * 2 + HOME_W + 5;
        let longest =
            |f: &dyn Fn(&KeyRecord) -> usize| shown.iter().map(|k| f(k)).max().unwrap_or(0);
        let wanted_active = longest(&|k| active_text(k).chars().count()).clamp(6, 40) as u16;
        let wanted_key = longest(&|k| k.key.chars().count()).max(3) as u16;
        // Numbers first: placement and counts are fixed; in-flight gets what it needs while the
        // key keeps its minimum; the key takes the rest, up to its longest label.
        let room = width.saturating_sub(placement_w + numbers);
        let active_w = wanted_active.min(room.saturating_sub(MIN_KEY_W)).max(6);
        let key_w = room
            .saturating_sub(active_w)
            .min(wanted_key)
            .max(MIN_KEY_W.min(room));
        Self {
            name_w,
            placement_w,
            active_w,
            key_w,
        }
    }

    fn widths(&self) -> [Constraint; 6] {
        [
            Constraint::Length(self.key_w),
            Constraint::Length(self.placement_w),
            Constraint::Min(self.active_w),
            Constraint::Length(COUNT_W),
            Constraint::Length(COUNT_W),
            Constraint::Length(HOME_W),
        ]
    }
}

/// `w0:8 w1:2`: the key's in-flight requests per worker.
fn active_text(k: &KeyRecord) -> String {
    k.active
        .iter()
        .map(|(w, n)| format!("{w}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
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
        Cell::from(active_text(k)),
        Cell::from(format!("{requests:>6}")),
        Cell::from(format!("{spills:>6}")),
        Cell::from(format!("{home:>4}")),
    ])
    .style(style)
}
