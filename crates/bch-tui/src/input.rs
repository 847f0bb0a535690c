//! Key presses → [`Action`]s, through small named predicates so each binding reads as what it means
//! and the help overlay and the docs can list the same bindings.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// Something the operator asked for. [`crate::state::State::apply_action`] carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Leave the console.
    Quit,
    /// `min_load_gap` − 1.
    GapDown,
    /// `min_load_gap` + 1.
    GapUp,
    /// `max_load_skew` − 0.05.
    SkewDown,
    /// `max_load_skew` + 0.05.
    SkewUp,
    /// Freeze or unfreeze the panels (data keeps flowing underneath).
    TogglePause,
    /// Move focus to the next panel.
    FocusNext,
    /// Move focus to the previous panel.
    FocusPrev,
    /// Scroll the focused panel by this many rows (negative is up).
    Scroll(i32),
    /// Scroll the focused panel to its first row.
    ScrollTop,
    /// Scroll the focused panel to its last row.
    ScrollBottom,
    /// Cycle the key table's sort column.
    CycleSort,
    /// Start typing a key filter.
    StartFilter,
    /// A character typed into the filter.
    FilterChar(char),
    /// Delete the filter's last character.
    FilterBackspace,
    /// Keep the typed filter and stop editing.
    FilterApply,
    /// Drop the filter and stop editing.
    FilterClear,
    /// Open or close the help overlay.
    ToggleHelp,
}

/// Rows moved by PgUp/PgDn.
pub const PAGE: i32 = 10;

/// Which keys mean what depends on whether a text prompt or the help overlay is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The panels have the keyboard.
    Normal,
    /// The `/` filter prompt has the keyboard: letters are text, not commands.
    Filter,
    /// The help overlay is open: any other key closes it.
    Help,
}

/// Ctrl-C quits from every mode, including while typing a filter.
pub fn is_ctrl_c(key: &KeyEvent) -> bool {
    key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL)
}

/// `q` quits.
pub fn is_quit(key: &KeyEvent) -> bool {
    is_char(key, 'q')
}

/// `?` toggles help.
pub fn is_help(key: &KeyEvent) -> bool {
    is_char(key, '?')
}

/// `Tab` moves focus forward.
pub fn is_focus_next(key: &KeyEvent) -> bool {
    key.code == KeyCode::Tab
}

/// `Shift-Tab` moves focus back.
pub fn is_focus_prev(key: &KeyEvent) -> bool {
    key.code == KeyCode::BackTab
}

/// `/` opens the filter prompt.
pub fn is_filter(key: &KeyEvent) -> bool {
    is_char(key, '/')
}

/// `p` pauses the view.
pub fn is_pause(key: &KeyEvent) -> bool {
    is_char(key, 'p')
}

/// `o` cycles the key table's sort order.
pub fn is_sort(key: &KeyEvent) -> bool {
    is_char(key, 'o')
}

/// A plain (no Ctrl/Alt) press of `c`. Shift is allowed because terminals report `G` as Shift+g.
fn is_char(key: &KeyEvent, c: char) -> bool {
    key.code == KeyCode::Char(c)
        && !key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
}

/// Maps one terminal key event to an action, or `None` for keys with no binding in `mode`.
pub fn map_key(mode: Mode, key: &KeyEvent) -> Option<Action> {
    // Key release and repeat events (reported by some terminals) would double every press.
    if key.kind == KeyEventKind::Release {
        return None;
    }
    if is_ctrl_c(key) {
        return Some(Action::Quit);
    }
    match mode {
        Mode::Filter => match key.code {
            KeyCode::Esc => Some(Action::FilterClear),
            KeyCode::Enter => Some(Action::FilterApply),
            KeyCode::Backspace => Some(Action::FilterBackspace),
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                Some(Action::FilterChar(c))
            }
            _ => None,
        },
        Mode::Help if is_quit(key) => Some(Action::Quit),
        Mode::Help => Some(Action::ToggleHelp),
        Mode::Normal => normal(key),
    }
}

fn normal(key: &KeyEvent) -> Option<Action> {
    let action = match key.code {
        _ if is_quit(key) => Action::Quit,
        _ if is_help(key) => Action::ToggleHelp,
        _ if is_pause(key) => Action::TogglePause,
        _ if is_filter(key) => Action::StartFilter,
        _ if is_sort(key) => Action::CycleSort,
        _ if is_focus_next(key) => Action::FocusNext,
        _ if is_focus_prev(key) => Action::FocusPrev,
        _ if is_char(key, 'g') => Action::GapDown,
        _ if is_char(key, 'G') => Action::GapUp,
        _ if is_char(key, 's') => Action::SkewDown,
        _ if is_char(key, 'S') => Action::SkewUp,
        KeyCode::Up | KeyCode::Char('k') => Action::Scroll(-1),
        KeyCode::Down | KeyCode::Char('j') => Action::Scroll(1),
        KeyCode::PageUp => Action::Scroll(-PAGE),
        KeyCode::PageDown => Action::Scroll(PAGE),
        KeyCode::Home => Action::ScrollTop,
        KeyCode::End => Action::ScrollBottom,
        KeyCode::Esc => Action::FilterClear,
        _ => return None,
    };
    Some(action)
}

/// The bindings as (keys, meaning) pairs, for the help overlay.
pub const HELP: &[(&str, &str)] = &[
    ("g / G", "min_load_gap −1 / +1"),
    ("s / S", "max_load_skew −0.05 / +0.05"),
    ("p", "pause the view (data keeps flowing)"),
    ("Tab / S-Tab", "focus next / previous panel"),
    ("↑ ↓ PgUp PgDn", "scroll the focused panel"),
    ("Home / End", "first / last row"),
    ("o", "cycle the key table's sort column"),
    ("/", "filter keys: type, Enter keep, Esc clear"),
    ("?", "this help (any key closes)"),
    ("q / Ctrl-C", "quit"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn threshold_keys_distinguish_case() {
        let shift = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::SHIFT);
        assert_eq!(
            map_key(Mode::Normal, &key(KeyCode::Char('g'))),
            Some(Action::GapDown)
        );
        assert_eq!(map_key(Mode::Normal, &shift('G')), Some(Action::GapUp));
        assert_eq!(
            map_key(Mode::Normal, &key(KeyCode::Char('s'))),
            Some(Action::SkewDown)
        );
        assert_eq!(map_key(Mode::Normal, &shift('S')), Some(Action::SkewUp));
    }

    #[test]
    fn filter_mode_types_letters_instead_of_commands() {
        assert_eq!(
            map_key(Mode::Filter, &key(KeyCode::Char('q'))),
            Some(Action::FilterChar('q'))
        );
        assert_eq!(
            map_key(Mode::Filter, &key(KeyCode::Char('g'))),
            Some(Action::FilterChar('g'))
        );
        assert_eq!(
            map_key(Mode::Filter, &key(KeyCode::Enter)),
            Some(Action::FilterApply)
        );
        assert_eq!(
            map_key(Mode::Filter, &key(KeyCode::Esc)),
            Some(Action::FilterClear)
        );
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(map_key(Mode::Filter, &ctrl_c), Some(Action::Quit));
    }

    #[test]
    fn help_mode_closes_on_any_key_but_still_quits() {
        assert_eq!(
            map_key(Mode::Help, &key(KeyCode::Char('x'))),
            Some(Action::ToggleHelp)
        );
        assert_eq!(
            map_key(Mode::Help, &key(KeyCode::Char('q'))),
            Some(Action::Quit)
        );
    }

    #[test]
    fn releases_and_ctrl_letters_are_ignored() {
        let mut release = key(KeyCode::Char('q'));
        release.kind = KeyEventKind::Release;
        assert_eq!(map_key(Mode::Normal, &release), None);
        let ctrl_g = KeyEvent::new(KeyCode::Char('g'), KeyModifiers::CONTROL);
        assert_eq!(map_key(Mode::Normal, &ctrl_g), None);
        assert_eq!(
            map_key(Mode::Normal, &key(KeyCode::PageDown)),
            Some(Action::Scroll(PAGE))
        );
    }
}
