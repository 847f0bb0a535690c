//! The warnings pane (`w`): one sentence per problem the state reports, most serious first, drawn
//! over the key table and the spill log while open, a long one wrapped inside the border under its
//! own first word (a hanging indent), so each warning's glyph stands alone at the left; and the
//! header's one-line summary while closed.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};

use super::styles::{Styles, Tone};
use super::text::{printable, truncate_right, wrap};
use crate::state::{Severity, Warning};

/// The glyph before a warning: `✗` for an alert, `!` for a warning, so a monochrome terminal and
/// a text snapshot keep the difference.
fn glyph(severity: Severity) -> (&'static str, Tone) {
    match severity {
        Severity::Alert => ("✗", Tone::Alert),
        Severity::Warning => ("!", Tone::Warning),
    }
}

/// The glyph's column and the space either side of it: where a warning's text starts, and where
/// its wrapped lines start too.
const INDENT: usize = 3;

/// Draws the pane over `area`, whatever is there.
pub(super) fn draw(frame: &mut Frame, area: Rect, warnings: &[Warning], styles: &Styles) {
    let text_w = usize::from(area.width.saturating_sub(2)).saturating_sub(INDENT);
    let lines: Vec<Line> = if warnings.is_empty() {
        vec![Line::styled(" nothing is wrong", styles.tone(Tone::Good))]
    } else {
        warnings
            .iter()
            .flat_map(|w| {
                let (mark, tone) = glyph(w.severity);
                wrap(&w.sentence, text_w)
                    .into_iter()
                    .enumerate()
                    .map(move |(index, text)| {
                        let lead = if index == 0 {
                            Span::styled(format!(" {mark} "), styles.tone(tone))
                        } else {
                            Span::raw(" ".repeat(INDENT))
                        };
                        Line::from(vec![lead, Span::raw(text)])
                    })
            })
            .collect()
    };
    frame.render_widget(Clear, area);
    let block = Block::bordered()
        .border_type(BorderType::Rounded)
        .title(format!(" Warnings ({}) · w closes ", warnings.len()))
        .border_style(styles.overlay_border());
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// The header line that sums the warnings up while the pane is closed: `✗ 3 warnings (w): worker
/// w2 fails its health probes: refused`, cut to `width`; `None` when nothing is wrong.
pub(super) fn summary_line(
    warnings: &[Warning],
    width: u16,
    styles: &Styles,
) -> Option<Line<'static>> {
    let count = count_span(warnings, styles)?;
    let text = format!("{}: {}", count.content, printable(&warnings[0].sentence));
    Some(Line::styled(
        truncate_right(&text, width as usize),
        count.style,
    ))
}

/// ` ✗ 3 warnings (w)` in the tone of the most serious one: the count a replay's timeline line
/// ends with, where there is no room for a sentence; `None` when nothing is wrong.
pub(super) fn count_span(warnings: &[Warning], styles: &Styles) -> Option<Span<'static>> {
    let first = warnings.first()?;
    let (mark, tone) = glyph(first.severity);
    Some(Span::styled(
        format!(
            " {mark} {} warning{} (w)",
            warnings.len(),
            if warnings.len() == 1 { "" } else { "s" },
        ),
        styles.tone(tone),
    ))
}
