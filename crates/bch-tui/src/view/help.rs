//! The help overlay: the panels' key bindings, read from the same table the dispatcher uses, and a
//! legend for the workers panel's markers and the compact spill line.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use super::styles::Styles;
use super::workers::{CAP_MARKER, GAP_MARKER, SKEW_MARKER};
use crate::input::BINDINGS;

/// Widest the overlay gets, in columns: the longest line fits, and it stays a pop-up on a wide
/// terminal.
const WIDTH: u16 = 60;

/// Draws the overlay centred on `area`, over whatever is there.
pub(super) fn draw(frame: &mut Frame, area: Rect, styles: &Styles) {
    let mut lines: Vec<Line> = BINDINGS
        .iter()
        .map(|b| {
            Line::from(vec![
                Span::styled(format!(" {:<14}", b.keys), styles.key_label()),
                Span::raw(b.meaning),
            ])
        })
        .collect();
    let legend = legend(styles);
    // The blank line between keys and legend goes first on a short terminal, before a legend line.
    if lines.len() + 1 + legend.len() + 2 <= usize::from(area.height) {
        lines.push(Line::raw(""));
    }
    lines.extend(legend);
    let height = (lines.len() as u16 + 2).min(area.height);
    let width = WIDTH.min(area.width);
    let popup = area.centered(Constraint::Length(width), Constraint::Length(height));
    frame.render_widget(Clear, popup);
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .title(" Help · any key closes ")
        .border_style(styles.overlay_border());
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}

/// What the markers, FULL, `↷` and the compact spill numbers mean.
fn legend(styles: &Styles) -> [Line<'static>; 7] {
    [
        Line::from(vec![
            Span::styled(format!(" {GAP_MARKER} "), styles.gap_marker()),
            Span::raw("min + min_load_gap   "),
            Span::styled(format!("{SKEW_MARKER} "), styles.skew_marker()),
            Span::raw("mean × max_load_skew"),
        ]),
        Line::raw(" A worker above both marks is OVER: its keys spill."),
        Line::raw(" DRAIN: no new requests (d); u takes it back."),
        Line::from(vec![
            Span::styled(format!(" {CAP_MARKER} "), styles.cap_marker()),
            Span::raw("cap: FULL takes no new request; spill log: full@4."),
        ]),
        Line::raw(" ↷ in the key table: served off its preferred worker."),
        Line::raw(" Narrow spill log: 9>2+2 9>3.50×1.50 = load > min+gap,"),
        Line::raw("   load > mean×skew."),
    ]
}
