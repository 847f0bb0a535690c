//! The ring panel: a strip showing which worker owns each stretch of the hash ring, and one row per
//! worker with its share and arc count. Each worker has a one-character glyph (A–Z, a–z, 0–9) so
//! the strip reads without colour.

use bch_core::telemetry::{RingOwnership, RingShare};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::panel::{panel_block, scroll_window};
use super::styles::Styles;
use super::text::{shown_width, truncate_left};
use crate::state::{FleetPicture, Panel, State};

/// Draws the ring panel at `area`: the strip, then one row per worker from the scroll offset on.
pub(super) fn draw(frame: &mut Frame, area: Rect, state: &State, styles: &Styles) {
    let fleet = state.visible();
    let focused = state.ui().focus() == Panel::Ring;
    let block = panel_block(focused, title(fleet, styles), styles);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(ring) = &fleet.ring else {
        let empty = Paragraph::new(Span::styled("no ring yet", styles.dim()));
        frame.render_widget(empty, inner);
        return;
    };
    if inner.height == 0 || inner.width < 8 {
        return;
    }
    let rows_h = inner.height.saturating_sub(1) as usize;
    let len = ring.workers.len();
    let start = scroll_window(frame, area, state.scroll(Panel::Ring), len, rows_h, styles);
    let columns = Columns::new(ring, usize::from(inner.width));
    let mut lines = vec![ring_strip(fleet, usize::from(inner.width), styles)];
    lines.extend(
        ring.workers
            .iter()
            .enumerate()
            .skip(start)
            .take(rows_h)
            .map(|(i, share)| ring_row(i, share, is_healthy(fleet, &share.name), &columns, styles)),
    );
    frame.render_widget(Paragraph::new(lines), inner);
}

/// The one-character tag of the `i`-th worker in the ring panel: A–Z, a–z, 0–9, then `*` for the
/// 63rd worker on, which the strip can then no longer tell apart.
fn worker_glyph(i: usize) -> char {
    const GLYPHS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    GLYPHS.get(i).map_or('*', |&b| b as char)
}

/// ` Ring 150 vnodes `.
fn title(fleet: &FleetPicture, styles: &Styles) -> Line<'static> {
    let vnodes = fleet
        .ring
        .as_ref()
        .map(|r| format!("{} vnodes ", r.virtual_nodes))
        .unwrap_or_default();
    Line::from(vec![
        Span::raw(" Ring "),
        Span::styled(vnodes, styles.dim()),
    ])
}

/// The ring unrolled over `width` cells: each cell shows the owner of the ring position at its
/// middle.
fn ring_strip(fleet: &FleetPicture, width: usize, styles: &Styles) -> Line<'static> {
    let cells: Vec<Span> = (0..width)
        .map(|i| {
            let x = (i as f64 + 0.5) / width as f64;
            match fleet.owner_at(x) {
                Some(owner) => Span::styled(worker_glyph(owner).to_string(), styles.worker(owner)),
                None => Span::raw(" "),
            }
        })
        .collect();
    Line::from(cells)
}

/// Whether the worker named `name` is healthy; a ring entry without a worker record counts as
/// healthy, since there is nothing to say it is not.
fn is_healthy(fleet: &FleetPicture, name: &str) -> bool {
    fleet
        .workers
        .iter()
        .find(|w| w.name == name)
        .is_none_or(|w| w.healthy)
}

/// Widest worker name shown; longer ones are cut from the left.
const MAX_NAME_W: usize = 24;
/// Names are cut no shorter than this: `…1.17:8000` keeps the port.
const MIN_NAME_W: usize = 10;
/// A row's columns besides the name and the bar: glyph and space, the space after the name, the
/// share (`  25.8% `) and the arcs (` 119 arcs`).
const FIXED_W: usize = 2 + 1 + 8 + 10;

/// Widths of a worker row's columns, the same for every row.
#[derive(Debug, Clone, Copy)]
struct Columns {
    name_w: usize,
    bar_w: usize,
    /// The share every worker would own on a perfectly balanced ring.
    even: f64,
}

impl Columns {
    /// Names whole (up to [`MAX_NAME_W`]) and the bar gets what is left; only when not even an
    /// empty bar fits are names cut from the left, to no less than [`MIN_NAME_W`].
    fn new(ring: &RingOwnership, width: usize) -> Self {
        let longest = ring
            .workers
            .iter()
            .map(|s| shown_width(&s.name))
            .max()
            .unwrap_or(0)
            .clamp(4, MAX_NAME_W);
        let name_w = longest
            .min(width.saturating_sub(FIXED_W))
            .max(MIN_NAME_W.min(longest));
        Self {
            name_w,
            bar_w: width.saturating_sub(FIXED_W + name_w),
            even: 1.0 / ring.workers.len().max(1) as f64,
        }
    }
}

/// `A w0     25.8% ▆▆▆▆▆      119 arcs`.
fn ring_row(
    i: usize,
    share: &RingShare,
    healthy: bool,
    columns: &Columns,
    styles: &Styles,
) -> Line<'static> {
    let Columns {
        name_w,
        bar_w,
        even,
    } = *columns;
    // Bar length relative to twice the even share, so a balanced ring sits at half width and an
    // over- or under-owning worker stands out.
    let bar_len = ((share.share / (2.0 * even)) * bar_w as f64).round() as usize;
    let mut spans = vec![
        Span::styled(format!("{} ", worker_glyph(i)), styles.worker(i)),
        Span::styled(
            format!("{:<name_w$} ", truncate_left(&share.name, name_w)),
            styles.name(healthy, false),
        ),
        Span::raw(format!("{:>6.1}% ", share.share * 100.0)),
    ];
    if bar_w > 0 {
        spans.push(Span::styled(
            format!("{:<bar_w$}", "▆".repeat(bar_len.min(bar_w))),
            styles.worker_bar(i),
        ));
    }
    spans.push(Span::styled(
        format!(" {:>4} arcs", share.arcs.len()),
        styles.dim(),
    ));
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_62_workers_get_distinct_glyphs_then_a_star() {
        let glyphs: std::collections::HashSet<char> = (0..62).map(worker_glyph).collect();
        assert_eq!(glyphs.len(), 62);
        assert_eq!(worker_glyph(62), '*');
        assert_eq!(worker_glyph(63), '*');
    }
}
