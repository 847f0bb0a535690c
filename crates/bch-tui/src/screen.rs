//! One rendered screen as plain text: what `--snapshot` prints, and what the replay test compares
//! with the live console's screens.

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tokio::time::Instant;

use crate::state::State;
use crate::view;

/// The console drawn at `width`×`height` cells at `now`, one line per row, trailing blanks
/// trimmed, styles left out. Tells the state the panels' heights first, as the live loop does.
pub fn screen_text(state: &mut State, width: u16, height: u16, now: Instant) -> String {
    let area = ratatui::layout::Rect::new(0, 0, width, height);
    state.set_viewports(view::viewports(area, state));
    let mut terminal =
        Terminal::new(TestBackend::new(width, height)).expect("a test backend always opens");
    terminal
        .draw(|frame| view::draw(frame, state, now))
        .expect("drawing into memory cannot fail");
    let buffer = terminal.backend().buffer();
    let mut text = String::new();
    for row in 0..height {
        let mut line = String::new();
        for column in 0..width {
            line.push_str(buffer[(column, row)].symbol());
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}
