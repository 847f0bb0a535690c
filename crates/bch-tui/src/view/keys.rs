//! The key table: each tracked routing key with its preferred and current worker (`↷` when it was
//! served off its preferred one), its in-flight requests per worker, its requests and spills, and
//! the share of its requests served at home (on the preferred worker); counted since the last
//! policy change once one was seen, so the effect of a threshold change reads directly. Filtered
//! and sorted as the state says, with the filter prompt on the bottom border while it is typed.
//! Columns are sized from their content; on a narrow panel the in-flight pairs give way first,
//! then the key (cut in the middle), then worker names (cut from the left, keeping the port). The
//! layout asks [`wanted_width`] whether the table fits beside the spill log.

use bch_core::telemetry::KeyRecord;
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Row, Table};

use super::panel::{panel_block, scroll_window};
use super::styles::{Styles, Tone};
use super::text::{MAX_WANTED_KEY_W, clock, shown_width, truncate_left, truncate_middle, widest};
use crate::state::{Baseline, Panel, State};

/// Width of the `req` column: six digits.
const COUNT_W: u16 = 6;
/// Width of the `spills` column (its heading).
const SPILLS_W: u16 = 6;
/// Width of the `home` column: `100%`.
const HOME_W: u16 = 4;
/// Spaces between columns, five of them.
const SPACING: u16 = 5;
/// The numbers and the spaces between all columns: what every row spends before any text.
const FIXED_W: u16 = COUNT_W + SPILLS_W + HOME_W + SPACING;
/// A key keeps this much (or the whole key, when shorter) before worker names give way: a tenant
/// prefix and an end that tells keys apart (`tenant-acme/ch…7f3a9c21-0001`).
const MIN_KEY_W: u16 = 24;
/// The key column never gets less than this.
const LEAST_KEY_W: u16 = 6;
/// Worker names are never cut below this: `…1.17:8000` keeps the end of the address and the port.
const MIN_NAME_W: u16 = 10;
/// Widest worker name shown; longer ones are cut from the left.
const MAX_NAME_W: u16 = 24;
/// The in-flight column never gets less than this: room for `11 on 3`.
const MIN_ACTIVE_W: u16 = 7;
/// What one in-flight pair needs besides its worker's name, for the layout's choice: `:12 +3`.
const PAIR_EXTRA_W: u16 = 6;

/// Width of the longest worker name the key table shows, capped at [`MAX_NAME_W`].
fn longest_name(state: &State) -> u16 {
    let fleet = state.visible();
    let workers = fleet.workers.iter().map(|w| w.name.as_str());
    let placed = fleet
        .keys
        .values()
        .flat_map(|k| [k.preferred.as_str(), k.current.as_str()]);
    let cap = usize::from(MAX_NAME_W);
    let widest = widest(workers.chain(placed), cap);
    widest.unwrap_or(4).clamp(2, cap) as u16
}

/// Width of the longest tracked key, capped at [`MAX_WANTED_KEY_W`]: what the layout makes room
/// for so keys are whole.
fn wanted_key(state: &State) -> u16 {
    state
        .visible()
        .keys
        .values()
        .map(|k| shown_width(&k.key))
        .max()
        .unwrap_or(3)
        .clamp(3, usize::from(MAX_WANTED_KEY_W)) as u16
}

/// Columns (borders included) the key table needs to show every tracked key and worker name
/// whole and one whole in-flight pair: below it, the layout puts the table above the spill log
/// rather than beside it. Worked out from tracked keys and names, not from what is in flight at
/// the moment, so the layout does not flip with every tick.
pub(super) fn wanted_width(state: &State) -> u16 {
    let name_w = longest_name(state);
    2 + FIXED_W + placement_width(name_w) + wanted_key(state) + (name_w + PAIR_EXTRA_W)
}

/// Rows the table needs for every tracked key: borders, heading and one row each.
pub(super) fn wanted_height(state: &State) -> u16 {
    u16::try_from(state.visible().keys.len())
        .unwrap_or(u16::MAX)
        .max(1)
        .saturating_add(3)
}

/// `preferred → current` with names of `name_w`; never narrower than its heading.
fn placement_width(name_w: u16) -> u16 {
    (name_w * 2 + 3).max(19)
}

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
    // The key the history pane (Enter) acts on, reversed while the table has focus.
    let selected = (state.ui().focus() == Panel::Keys)
        .then(|| state.selected_key())
        .flatten()
        .map(|k| k.key.as_str());
    let table_rows: Vec<Row> = shown
        .iter()
        .map(|k| {
            let row = key_row(k, &columns, baseline, styles);
            if selected == Some(k.key.as_str()) {
                row.add_modifier(Modifier::REVERSED)
            } else {
                row
            }
        })
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
    /// Each column sized from its content: names the longest worker name, keys the longest shown
    /// key, the in-flight column every pair. When the panel is narrower, text gives way in this
    /// order: the in-flight column first (one whole pair and `+N`, then `N on M`), then the key
    /// (to [`MIN_KEY_W`]), then worker names (to [`MIN_NAME_W`], keeping the port). Room left
    /// over goes back where it makes a column whole (the key first), then to the key, then to
    /// the in-flight column; what no column needs stays at the right end, not as blanks inside
    /// the table.
    fn new(state: &State, shown: &[&KeyRecord], width: u16) -> Self {
        let longest_name = longest_name(state);
        let widest = |f: &dyn Fn(&KeyRecord) -> usize| -> u16 {
            shown.iter().map(|k| f(k)).max().unwrap_or(0) as u16
        };
        let whole_key = widest(&|k| shown_width(&k.key)).max(3);
        let key_min = whole_key.min(MIN_KEY_W);
        // The heading `active` is six wide.
        let whole_active = |name_w: u16| widest(&|k| active_text(k, name_w).chars().count()).max(6);
        let one_pair = |name_w: u16| {
            widest(&|k| first_pair_width(k, name_w))
                .max(MIN_ACTIVE_W)
                .min(whole_active(name_w))
        };
        let least_active = whole_active(longest_name).min(MIN_ACTIVE_W);
        let avail = width.saturating_sub(FIXED_W);
        let fits =
            |name_w: u16, key: u16, active: u16| placement_width(name_w) + key + active <= avail;
        let mut choice = [
            (whole_key, whole_active(longest_name)),
            (whole_key, one_pair(longest_name)),
            (whole_key, least_active),
            (key_min, least_active),
        ]
        .into_iter()
        .find(|&(key, active)| fits(longest_name, key, active))
        .map(|(key, active)| (longest_name, key, active));
        if choice.is_none() {
            let floor = MIN_NAME_W.min(longest_name);
            choice = (floor..longest_name)
                .rev()
                .find(|&name_w| fits(name_w, key_min, least_active))
                .map(|name_w| (name_w, key_min, least_active));
        }
        let (name_w, key_w, active_w) =
            choice.unwrap_or((MIN_NAME_W.min(longest_name), LEAST_KEY_W, least_active));
        let placement_w = placement_width(name_w);
        // Give what is left back: first where it makes a column whole (the key, else the pairs),
        // then to the key, then to the pairs.
        let mut rest = avail.saturating_sub(placement_w + key_w + active_w);
        let mut key_w = key_w;
        let mut active_w = active_w;
        let key_gap = whole_key.saturating_sub(key_w);
        let active_gap = whole_active(name_w).saturating_sub(active_w);
        if key_gap <= rest {
            key_w += key_gap;
            rest -= key_gap;
        } else if active_gap <= rest {
            active_w += active_gap;
            rest -= active_gap;
        }
        let more = whole_key.saturating_sub(key_w).min(rest);
        key_w += more;
        rest -= more;
        active_w += whole_active(name_w).saturating_sub(active_w).min(rest);
        // When even the least does not fit, the key gives way down to its floor.
        let over = (placement_w + key_w + active_w).saturating_sub(avail);
        let key_w = key_w.saturating_sub(over).max(LEAST_KEY_W);
        Self {
            name_w,
            placement_w,
            active_w,
            requests_w: COUNT_W,
            key_w,
        }
    }

    fn widths(&self) -> [Constraint; 6] {
        [
            Constraint::Length(self.key_w),
            Constraint::Length(self.placement_w),
            Constraint::Length(self.active_w),
            Constraint::Length(self.requests_w),
            Constraint::Length(SPILLS_W),
            Constraint::Length(HOME_W),
        ]
    }
}

/// Width of `w0:8 +3`: the first of the key's in-flight pairs, whole with names cut to `name_w`,
/// and the sum of the rest; 0 for a key with nothing in flight.
fn first_pair_width(k: &KeyRecord, name_w: u16) -> usize {
    let Some((worker, n)) = k.active.iter().next() else {
        return 0;
    };
    let pair = truncate_left(worker, usize::from(name_w)).chars().count() + 1 + n.to_string().len();
    if k.active.len() == 1 {
        return pair;
    }
    let rest: u64 = k.active.values().sum::<u64>() - n;
    pair + 2 + rest.to_string().len()
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
