//! The frame every panel is drawn in: the border that shows focus, and the scroll window with its
//! `17–32 of 64` hint on the bottom border, so hidden rows are never a surprise.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Paragraph};

use super::styles::Styles;

/// A panel's bordered block titled `title`; a focused panel gets a double, accented border, so focus
/// shows without colour too.
pub(super) fn panel_block<'a>(focused: bool, title: Line<'a>, styles: &Styles) -> Block<'a> {
    let block = Block::bordered()
        .title(title)
        .border_style(styles.focused(focused));
    if focused {
        block.border_type(BorderType::Double)
    } else {
        block
    }
}

/// The first of `len` rows to show in `visible` rows when the operator scrolled to `scroll`: the
/// scroll offset, pulled back so no empty space is left below the content (the terminal may have
/// grown since the state clamped it). Draws the position hint on the bottom border of the panel at
/// `area` when not every row fits.
pub(super) fn scroll_window(
    frame: &mut Frame,
    area: Rect,
    scroll: usize,
    len: usize,
    visible: usize,
    styles: &Styles,
) -> usize {
    let start = scroll.min(len.saturating_sub(visible));
    if len > visible {
        render_hint(frame, area, position_hint(start, visible, len, styles));
    }
    start
}

/// `" 17–32 of 64 "`, right-aligned.
fn position_hint(start: usize, visible: usize, len: usize, styles: &Styles) -> Line<'static> {
    let end = (start + visible).min(len);
    Line::from(Span::styled(
        format!(" {}–{end} of {len} ", start + 1),
        styles.dim(),
    ))
    .right_aligned()
}

/// Draws `hint` on the bottom border of the panel at `area`, inside the corners.
fn render_hint(frame: &mut Frame, area: Rect, hint: Line<'static>) {
    if area.height < 2 || area.width < 4 {
        return;
    }
    let row = Rect::new(area.x + 1, area.bottom() - 1, area.width - 2, 1);
    frame.render_widget(Paragraph::new(hint), row);
}
