//! The terminal guard: raw mode and the alternate screen on the way in, and a restored terminal on
//! every way out — normal quit, error return, panic and a stop signal (the binary handles those);
//! on a terminal that hung up, restoring fails quietly instead of panicking.

use std::io::{self, Stdout};
use std::sync::Once;

use crossterm::cursor::Show;
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

/// The terminal type the binary draws on.
type Tui = Terminal<CrosstermBackend<Stdout>>;

/// Owns the terminal while the console runs; dropping it restores the terminal.
pub struct TerminalGuard {
    /// Always `Some` until the guard drops.
    terminal: Option<Tui>,
}

/// The restoring panic hook goes in once per process, however often a guard is entered, so hooks
/// do not pile up around each other.
static PANIC_HOOK: Once = Once::new();

impl TerminalGuard {
    /// Enters raw mode and the alternate screen, and installs a panic hook that restores the
    /// terminal before the panic message prints (otherwise the message lands in the alternate
    /// screen and vanishes, and the shell is left in raw mode).
    pub fn enter() -> io::Result<Self> {
        PANIC_HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        enable_raw_mode()?;
        // From here on, a failure must still undo raw mode.
        let setup = (|| {
            let mut stdout = io::stdout();
            execute!(stdout, EnterAlternateScreen)?;
            let mut terminal = Terminal::new(CrosstermBackend::new(stdout))?;
            terminal.hide_cursor()?;
            terminal.clear()?;
            Ok(terminal)
        })();
        match setup {
            Ok(terminal) => Ok(Self {
                terminal: Some(terminal),
            }),
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }

    /// The terminal to draw on; raw mode and the alternate screen last as long as the guard.
    pub fn terminal(&mut self) -> &mut Tui {
        self.terminal
            .as_mut()
            .expect("the terminal is only taken when the guard drops")
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        if let Some(mut terminal) = self.terminal.take() {
            // ratatui's own drop shows a hidden cursor and reports a failure with `eprintln!`,
            // which panics when stderr is the same terminal and it hung up. So show it here, and
            // when that fails the terminal is gone: skip ratatui's drop (it holds nothing but the
            // stdout handle and buffers, and the process is ending).
            if terminal.show_cursor().is_err() {
                std::mem::forget(terminal);
            }
        }
        restore();
    }
}

/// Leaves the alternate screen, shows the cursor and disables raw mode. Safe to call more than once
/// and from a panic hook: errors are ignored because there is nowhere left to report them.
fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(io::stdout(), LeaveAlternateScreen, Show);
}
