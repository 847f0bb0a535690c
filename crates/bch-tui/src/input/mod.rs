//! Key presses → [`Action`]s. The panels' bindings are one table, [`BINDINGS`], that both the
//! dispatcher and the help overlay read, so a key cannot work without being listed or be listed
//! without working. The filter prompt, the worker search and the help overlay take the keyboard with rules of their
//! own ([`Mode`]).

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// Something the operator asked for; the state carries it out (`State::apply_action`), so what a
/// key does is testable without a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Restore the terminal and leave the console.
    Quit,
    /// Ask the gateway for `min_load_gap` − 1 (not sent at 0, where there is nothing below).
    GapDown,
    /// Ask the gateway for `min_load_gap` + 1.
    GapUp,
    /// Ask the gateway for `max_load_skew` − 0.05; below 1.0 the gateway refuses and says why.
    SkewDown,
    /// Ask the gateway for `max_load_skew` + 0.05.
    SkewUp,
    /// Ask the gateway for `max_in_flight_per_worker` − 1 (1 → 0 lifts the cap; not sent
    /// at 0).
    CapDown,
    /// Ask the gateway for `max_in_flight_per_worker` + 1; from 0 (no cap), the busiest worker's
    /// load now.
    CapUp,
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
    /// Order the workers panel by load, or back by configuration.
    ToggleWorkerOrder,
    /// Show the next model's pool (all workers → each model by name → all workers).
    CyclePool,
    /// Drain the selected worker: no new requests, its in-flight ones finish.
    Drain,
    /// Route new requests to the selected worker again.
    Undrain,
    /// Open the `/` prompt and move focus to the key table, to type a key filter.
    StartFilter,
    /// A character typed into the filter.
    FilterChar(char),
    /// Delete the filter's last character.
    FilterBackspace,
    /// Keep the typed filter and stop editing.
    FilterApply,
    /// Drop the filter and stop editing.
    FilterClear,
    /// Open the `f` prompt on the workers panel, to find a worker by name.
    StartSearch,
    /// A character typed into the worker search; the selection follows the first match.
    SearchChar(char),
    /// Delete the worker search's last character.
    SearchBackspace,
    /// Close the worker search, keeping the worker it found selected.
    SearchApply,
    /// Close the worker search and go back to where the view was when it opened.
    SearchCancel,
    /// Select the worker with the highest load (the load the rule reads) and scroll to it.
    JumpHottest,
    /// Open or close the help overlay.
    ToggleHelp,
    /// Open or close the warnings pane (the panels keep the keyboard).
    ToggleWarnings,
    /// Open the history pane on the focused panel's selection (a key's placements, a worker's
    /// load), or close it.
    ToggleHistory,
}

impl Action {
    /// Whether the action asks a gateway to change something (a threshold, a capacity, a
    /// drain): what a read-only console refuses.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Action::GapDown
                | Action::GapUp
                | Action::SkewDown
                | Action::SkewUp
                | Action::CapDown
                | Action::CapUp
                | Action::Drain
                | Action::Undrain
        )
    }
}

/// Rows PgUp/PgDn scroll by.
pub(crate) const PAGE: i32 = 10;

/// Which keys mean what depends on whether a text prompt or the help overlay is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The panels have the keyboard: keys mean what [`BINDINGS`] says.
    Normal,
    /// The `/` filter prompt has the keyboard: letters are text, not commands.
    Filter,
    /// The `f` worker search prompt has the keyboard: letters are text, not commands.
    Search,
    /// The help overlay is open: any other key closes it.
    Help,
}

/// Ctrl-C quits from every mode, including while typing a filter.
fn is_ctrl_c(key: &KeyEvent) -> bool {
    key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL)
}

/// `q` quits (in every mode but the filter prompt, where it is a letter).
fn is_quit(key: &KeyEvent) -> bool {
    is_char(key, 'q')
}

/// A plain (no Ctrl/Alt) press of `c`. Shift is allowed because terminals report `G` as Shift+g.
fn is_char(key: &KeyEvent, c: char) -> bool {
    key.code == KeyCode::Char(c)
        && !key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
}

/// Whether a key event is the key a binding means.
type KeyTest = fn(&KeyEvent) -> bool;

/// One line of the help overlay and the keys behind it.
#[derive(Debug)]
pub(crate) struct Binding {
    /// The keys as the help overlay names them (`g / G`).
    pub(crate) keys: &'static str,
    /// What they do, in the help overlay's words.
    pub(crate) meaning: &'static str,
    /// Each key of the line and the action it stands for. A key may be left out of `keys` when
    /// it is an alias (`j`/`k` for the arrows) or the line's meaning already covers it (`Esc`
    /// clears the filter).
    actions: &'static [(KeyTest, Action)],
}

impl Binding {
    /// Whether the line's keys ask a gateway to change something ([`Action::writes`]): what a
    /// replay and a read-only console refuse.
    pub(crate) fn writes(&self) -> bool {
        self.actions.iter().any(|&(_, action)| action.writes())
    }
}

/// The bindings of [`Mode::Normal`], in help-overlay order: the one place they are written down, so
/// the dispatcher and the help overlay cannot disagree. No key matches two entries, so the order
/// only matters to the overlay.
pub(crate) const BINDINGS: &[Binding] = &[
    Binding {
        keys: "g / G",
        meaning: "min_load_gap −1 / +1",
        actions: &[
            (|k| is_char(k, 'g'), Action::GapDown),
            (|k| is_char(k, 'G'), Action::GapUp),
        ],
    },
    Binding {
        keys: "s / S",
        meaning: "max_load_skew −0.05 / +0.05",
        actions: &[
            (|k| is_char(k, 's'), Action::SkewDown),
            (|k| is_char(k, 'S'), Action::SkewUp),
        ],
    },
    Binding {
        keys: "c / C",
        meaning: "capacity per worker −1 / +1 (0 = no cap)",
        actions: &[
            (|k| is_char(k, 'c'), Action::CapDown),
            (|k| is_char(k, 'C'), Action::CapUp),
        ],
    },
    Binding {
        keys: "d / u",
        meaning: "drain / undrain the selected worker",
        actions: &[
            (|k| is_char(k, 'd'), Action::Drain),
            (|k| is_char(k, 'u'), Action::Undrain),
        ],
    },
    Binding {
        keys: "f",
        meaning: "find a worker: type, Enter keep, Esc back",
        actions: &[(|k| is_char(k, 'f'), Action::StartSearch)],
    },
    Binding {
        keys: "h",
        meaning: "jump to the hottest worker",
        actions: &[(|k| is_char(k, 'h'), Action::JumpHottest)],
    },
    Binding {
        keys: "l",
        meaning: "order workers by load / by configuration",
        actions: &[(|k| is_char(k, 'l'), Action::ToggleWorkerOrder)],
    },
    Binding {
        keys: "m",
        meaning: "one model's pool: all → each model → all",
        actions: &[(|k| is_char(k, 'm'), Action::CyclePool)],
    },
    Binding {
        keys: "p",
        meaning: "pause the view (data keeps flowing)",
        actions: &[(|k| is_char(k, 'p'), Action::TogglePause)],
    },
    Binding {
        keys: "Tab / S-Tab",
        meaning: "focus next / previous panel",
        actions: &[
            (|k| k.code == KeyCode::Tab, Action::FocusNext),
            (|k| k.code == KeyCode::BackTab, Action::FocusPrev),
        ],
    },
    Binding {
        keys: "↑ ↓ PgUp PgDn",
        meaning: "scroll the panel (workers, keys: select)",
        // `k`/`j` are vi aliases of the arrows and, like them, ignore modifiers.
        actions: &[
            (
                |k| matches!(k.code, KeyCode::Up | KeyCode::Char('k')),
                Action::Scroll(-1),
            ),
            (
                |k| matches!(k.code, KeyCode::Down | KeyCode::Char('j')),
                Action::Scroll(1),
            ),
            (|k| k.code == KeyCode::PageUp, Action::Scroll(-PAGE)),
            (|k| k.code == KeyCode::PageDown, Action::Scroll(PAGE)),
        ],
    },
    Binding {
        keys: "Home / End",
        meaning: "first / last row",
        actions: &[
            (|k| k.code == KeyCode::Home, Action::ScrollTop),
            (|k| k.code == KeyCode::End, Action::ScrollBottom),
        ],
    },
    Binding {
        keys: "o",
        meaning: "cycle the key table's sort column",
        actions: &[(|k| is_char(k, 'o'), Action::CycleSort)],
    },
    Binding {
        keys: "/",
        meaning: "filter keys: type, Enter keep, Esc clear",
        // Esc outside the prompt clears a filter kept with Enter.
        actions: &[
            (|k| is_char(k, '/'), Action::StartFilter),
            (|k| k.code == KeyCode::Esc, Action::FilterClear),
        ],
    },
    Binding {
        keys: "Enter",
        meaning: "key or worker history; Esc closes",
        actions: &[(|k| k.code == KeyCode::Enter, Action::ToggleHistory)],
    },
    Binding {
        keys: "w",
        meaning: "warnings: what is wrong and why",
        actions: &[(|k| is_char(k, 'w'), Action::ToggleWarnings)],
    },
    Binding {
        keys: "?",
        meaning: "this help (any key closes)",
        actions: &[(|k| is_char(k, '?'), Action::ToggleHelp)],
    },
    Binding {
        keys: "q / Ctrl-C",
        meaning: "quit",
        actions: &[(is_quit, Action::Quit), (is_ctrl_c, Action::Quit)],
    },
];

/// What one of a replay's own keys asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayKey {
    /// Space: pause or play.
    TogglePlay,
    /// ← / →: ten seconds back (`false`) or forward (`true`).
    Seek(bool),
    /// `[` / `]`: the previous or the next spill.
    Spill(bool),
    /// `<` / `>`: the start or the end.
    Edge(bool),
    /// `-` / `+`: one step slower or faster.
    Speed(bool),
}

/// One line of a replay's help overlay and the keys behind it.
#[derive(Debug)]
pub(crate) struct ReplayBinding {
    /// The keys as the help overlay names them (`[ / ]`).
    pub(crate) keys: &'static str,
    /// What they do, in the help overlay's words.
    pub(crate) meaning: &'static str,
    /// Each key of the line and what it asks for (`=` is `+` without Shift).
    actions: &'static [(KeyTest, ReplayKey)],
}

/// A replay's own keys, in help-overlay order: read by the replay's dispatcher and by its help
/// overlay, like [`BINDINGS`]. They are tried before [`BINDINGS`] while the panels have the
/// keyboard, and none of them is bound there.
pub(crate) const REPLAY_BINDINGS: &[ReplayBinding] = &[
    ReplayBinding {
        keys: "Space",
        meaning: "pause / play",
        actions: &[(|k| k.code == KeyCode::Char(' '), ReplayKey::TogglePlay)],
    },
    ReplayBinding {
        keys: "← / →",
        meaning: "seek 10 s back / forward",
        actions: &[
            (|k| k.code == KeyCode::Left, ReplayKey::Seek(false)),
            (|k| k.code == KeyCode::Right, ReplayKey::Seek(true)),
        ],
    },
    ReplayBinding {
        keys: "[ / ]",
        meaning: "previous / next spill",
        actions: &[
            (|k| k.code == KeyCode::Char('['), ReplayKey::Spill(false)),
            (|k| k.code == KeyCode::Char(']'), ReplayKey::Spill(true)),
        ],
    },
    ReplayBinding {
        keys: "< / >",
        meaning: "start / end of the recording",
        actions: &[
            (|k| k.code == KeyCode::Char('<'), ReplayKey::Edge(false)),
            (|k| k.code == KeyCode::Char('>'), ReplayKey::Edge(true)),
        ],
    },
    ReplayBinding {
        keys: "- / +",
        meaning: "slower / faster, ×0.25 to ×16",
        actions: &[
            (|k| k.code == KeyCode::Char('-'), ReplayKey::Speed(false)),
            (
                |k| matches!(k.code, KeyCode::Char('+' | '=')),
                ReplayKey::Speed(true),
            ),
        ],
    },
];

/// Maps a key event to one of a replay's own keys; `None` for a release, a key with Ctrl or Alt
/// and every key [`REPLAY_BINDINGS`] does not list.
pub(crate) fn map_replay_key(key: &KeyEvent) -> Option<ReplayKey> {
    if key.kind == KeyEventKind::Release
        || key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
    {
        return None;
    }
    REPLAY_BINDINGS
        .iter()
        .flat_map(|b| b.actions)
        .find(|(matches, _)| matches(key))
        .map(|&(_, replay_key)| replay_key)
}

/// Maps one terminal key event to an action, or `None` for keys with no binding in `mode`.
pub(crate) fn map_key(mode: Mode, key: &KeyEvent) -> Option<Action> {
    // Releases are dropped: Windows consoles (and terminals speaking the kitty keyboard protocol
    // with event types on) report a key coming up as an event of its own, which would act on every
    // press twice. Repeats are kept on purpose: a held key goes on doing what it does (hold ↓ to
    // scroll), as it does on the many terminals that send a held key as a stream of presses.
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
        Mode::Search => match key.code {
            KeyCode::Esc => Some(Action::SearchCancel),
            KeyCode::Enter => Some(Action::SearchApply),
            KeyCode::Backspace => Some(Action::SearchBackspace),
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                Some(Action::SearchChar(c))
            }
            _ => None,
        },
        Mode::Help if is_quit(key) => Some(Action::Quit),
        Mode::Help => Some(Action::ToggleHelp),
        Mode::Normal => BINDINGS
            .iter()
            .flat_map(|b| b.actions)
            .find(|(matches, _)| matches(key))
            .map(|&(_, action)| action),
    }
}

#[cfg(test)]
mod tests;
