//! The key selection the history pane is opened on, and opening it (Enter) on the focused
//! panel's selection; the pane reads [`State::history`], the frozen copy while paused.

use bch_core::telemetry::KeyRecord;

use super::history::History;
use super::placements::KeyHistory;
use super::ui::HistoryOf;
use super::{Panel, State};

impl State {
    /// The history the pane shows: the frozen copy while paused, else the live one.
    pub fn history(&self) -> &History {
        self.frozen_history.as_ref().unwrap_or(&self.history)
    }

    /// The key the history pane acts on: the picked one while the key table shows it, else the
    /// table's first row.
    pub fn selected_key(&self) -> Option<&KeyRecord> {
        let rows = self.key_rows();
        let picked = self.ui.selected_key();
        rows.iter()
            .find(|k| Some(k.key.as_str()) == picked)
            .or(rows.first())
            .copied()
    }

    /// The selected key's placements, when it has any.
    pub fn selected_key_history(&self) -> Option<&KeyHistory> {
        self.history().placements.key(&self.selected_key()?.key)
    }

    /// Moves the key selection `delta` rows in the table's order and scrolls so it stays on
    /// screen.
    pub(super) fn move_key_selection(&mut self, delta: i32) {
        let rows = self.key_rows();
        if rows.is_empty() {
            return;
        }
        let current = self
            .selected_key()
            .and_then(|k| rows.iter().position(|r| r.key == k.key))
            .unwrap_or(0);
        let next = current
            .saturating_add_signed(delta as isize)
            .min(rows.len() - 1);
        let key = rows[next].key.clone();
        self.ui.select_key(key);
        let visible = self.ui.viewport(Panel::Keys).max(1);
        let scroll = self.ui.scroll(Panel::Keys);
        if next < scroll {
            self.ui.scroll_to(next);
        } else if next >= scroll + visible {
            self.ui.scroll_to(next + 1 - visible);
        }
    }

    /// Enter: closes the history pane, or opens it on the focused panel's selection (the key
    /// table's key, the workers panel's worker); elsewhere says where it works.
    pub(super) fn toggle_history(&mut self) {
        if self.ui.history_of().is_some() {
            self.ui.close_history();
            return;
        }
        match self.ui.focus() {
            Panel::Keys if self.selected_key().is_some() => self.ui.open_history(HistoryOf::Key),
            Panel::Workers if self.selected_worker().is_some() => {
                self.ui.open_history(HistoryOf::Worker);
            }
            Panel::Keys => self.notice = Some("no tracked key to show the history of".into()),
            Panel::Workers => self.notice = Some("no worker to show the history of".into()),
            Panel::Ring | Panel::Spills => {
                self.notice = Some(
                    "Enter shows a history in the keys panel (a key's placements) or the workers panel (a worker's load): Tab there first"
                        .into(),
                );
            }
        }
    }
}
