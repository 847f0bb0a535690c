//! The key table: each tracked routing key with its preferred and current worker (`↷` when it was
//! served off its preferred one), its in-flight requests per worker, and its totals; filtered and
//! sorted as the state says, with the filter prompt on the bottom border while it is typed.

use bch_core::telemetry::KeyRecord;
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Row, Table};

use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{truncate_left, truncate_middle};
use crate::state::{Panel, State};

/// Fixed widths of the `req` and `spills` columns.
const COUNT_W: u16 = 6;

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
    let columns = Columns::new(state, inner.width);
    let table_rows: Vec<Row> = rows
        .iter()
        .skip(start)
        .take(visible)
        .map(|k| key_row(k, &columns, styles))
        .collect();
    let header = Row::new(["key", "preferred → current", "active", "req", "spills"])
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
    /// Keys are cut to this.
    key_w: usize,
}

impl Columns {
    fn new(state: &State, width: u16) -> Self {
        let name_w = state
            .visible()
            .workers
            .iter()
            .map(|w| w.name.chars().count())
            .max()
            .unwrap_or(4)
            .clamp(2, 12) as u16;
        let placement_w = (name_w * 2 + 3).max(19);
        // The key column's share of what the fixed columns and the four gaps leave (Fill 3 of 5),
        // so a long key is cut in the middle here rather than at its end by the table.
        let key_w = usize::from(width.saturating_sub(placement_w + COUNT_W * 2 + 4)) * 3 / 5;
        Self {
            name_w,
            placement_w,
            key_w: key_w.max(6),
        }
    }

    fn widths(&self) -> [Constraint; 5] {
        [
            Constraint::Fill(3),
            Constraint::Length(self.placement_w),
            Constraint::Fill(2),
            Constraint::Length(COUNT_W),
            Constraint::Length(COUNT_W),
        ]
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

/// One key: label, placement, in-flight requests per worker, totals. A spilled key's row is tinted
/// as well as marked `↷`.
fn key_row(k: &KeyRecord, columns: &Columns, styles: &Styles) -> Row<'static> {
    let name_w = usize::from(columns.name_w);
    let spilled = k.preferred != k.current;
    let placement = format!(
        "{:<name_w$} {} {}",
        truncate_left(&k.preferred, name_w),
        if spilled { "↷" } else { "→" },
        truncate_left(&k.current, name_w)
    );
    let active = k
        .active
        .iter()
        .map(|(w, n)| format!("{w}:{n}"))
        .collect::<Vec<_>>()
        .join(" ");
    let style = if spilled {
        styles.tone(Tone::Warning)
    } else {
        styles.plain()
    };
    Row::new([
        Cell::from(truncate_middle(&k.key, columns.key_w)),
        Cell::from(placement),
        Cell::from(active),
        Cell::from(format!("{:>6}", k.requests_total)),
        Cell::from(format!("{:>6}", k.spills_total)),
    ])
    .style(style)
}
