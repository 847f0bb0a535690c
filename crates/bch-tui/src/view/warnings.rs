//! The warnings pane (`w`): one line per problem the state reports, most serious first, drawn over
//! the key table and the spill log while open; and the header's one-line summary while closed.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph, Wrap};

use super::styles::{Styles, Tone};
use super::text::{printable, truncate_right};
use crate::state::{Severity, Warning};

/// The glyph before a warning: `✗` for an alert, `!` for a warning, so a monochrome terminal and
/// a text snapshot keep the difference.
fn glyph(severity: Severity) -> (&'static str, Tone) {
    match severity {
        Severity::Alert => ("✗", Tone::Alert),
        Severity::Warning => ("!", Tone::Warning),
    }
}

/// Draws the pane over `area`, whatever is there.
pub(super) fn draw(frame: &mut Frame, area: Rect, warnings: &[Warning], styles: &Styles) {
    let lines: Vec<Line> = if warnings.is_empty() {
        vec![Line::styled(" nothing is wrong", styles.tone(Tone::Good))]
    } else {
        warnings
            .iter()
            .map(|w| {
                let (mark, tone) = glyph(w.severity);
                Line::from(vec![
                    Span::styled(format!(" {mark} "), styles.tone(tone)),
                    Span::raw(printable(&w.sentence).into_owned()),
                ])
            })
            .collect()
    };
    frame.render_widget(Clear, area);
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .title(format!(" Warnings ({}) · w closes ", warnings.len()))
        .border_style(styles.overlay_border());
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        area,
    );
}

/// The header line that sums the warnings up while the pane is closed: `✗ 3 warnings (w): worker
/// w2 fails its health probes: refused`, cut to `width`; `None` when nothing is wrong.
pub(super) fn summary_line(
    warnings: &[Warning],
    width: u16,
    styles: &Styles,
) -> Option<Line<'static>> {
    let first = warnings.first()?;
    let (mark, tone) = glyph(first.severity);
    let text = format!(
        " {mark} {} warning{} (w): {}",
        warnings.len(),
        if warnings.len() == 1 { "" } else { "s" },
        printable(&first.sentence)
    );
    Some(Line::styled(
        truncate_right(&text, width as usize),
        styles.tone(tone),
    ))
}
