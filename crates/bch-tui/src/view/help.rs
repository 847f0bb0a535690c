//! The help overlay: the panels' key bindings, read from the same table the dispatcher uses, and a
//! legend for the workers panel's markers and the compact spill line. In a replay it lists the
//! replay's own keys first (from the replay's table) and folds the keys that would change a
//! gateway into one line that says they do nothing there.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use super::styles::Styles;
use super::workers::{CAP_MARKER, GAP_MARKER, SKEW_MARKER};
use crate::input::{BINDINGS, Binding, REPLAY_BINDINGS};

/// Widest the overlay gets, in columns: the longest line fits, and it stays a pop-up on a wide
/// terminal.
const WIDTH: u16 = 60;

/// Draws the overlay centred on `area`, over whatever is there; `replay` lists the replay's keys.
pub(super) fn draw(frame: &mut Frame, area: Rect, replay: bool, styles: &Styles) {
    let line = |keys: &str, meaning: &'static str| {
        Line::from(vec![
            Span::styled(format!(" {keys:<14}"), styles.key_label()),
            Span::raw(meaning),
        ])
    };
    let mut lines: Vec<Line> = Vec::new();
    if replay {
        lines.extend(REPLAY_BINDINGS.iter().map(|b| line(b.keys, b.meaning)));
        lines.push(write_keys_line(styles));
    }
    lines.extend(
        BINDINGS
            .iter()
            .filter(|b| !(replay && b.writes()))
            .map(|b| line(b.keys, b.meaning)),
    );
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
        .title(if replay {
            " Help · replay · any key closes "
        } else {
            " Help · any key closes "
        })
        .border_style(styles.overlay_border());
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}

/// `g/G s/S c/C d/u do nothing in a replay`: every key that would change a gateway, in one line
/// that keeps the overlay short enough for 80×24.
fn write_keys_line(styles: &Styles) -> Line<'static> {
    let keys: Vec<String> = BINDINGS
        .iter()
        .filter(|b| b.writes())
        .map(|b: &Binding| b.keys.replace(' ', ""))
        .collect();
    Line::from(vec![
        Span::styled(format!(" {:<14} ", keys.join(" ")), styles.key_label()),
        Span::styled("do nothing in a replay", styles.dim()),
    ])
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
