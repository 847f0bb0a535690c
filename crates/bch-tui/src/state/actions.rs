//! The operator's actions on the [`State`]: [`State::apply_action`] and the steps it takes
//! (moving the worker selection, drains, threshold nudges, scrolling within a panel's rows).

use bch_core::telemetry::WorkerRecord;

use super::commands::Threshold;
use super::{Change, Effect, Panel, State};
use crate::input::Action;

impl State {
    /// Carries out an operator action; the effect tells the app what to send, or to quit.
    pub fn apply_action(&mut self, action: Action) -> Effect {
        if action.writes()
            && let Some(why) = self.read_only()
        {
            self.notice = Some(why.to_owned());
            return Effect::None;
        }
        match action {
            Action::Quit => return Effect::Quit,
            Action::GapDown => return self.nudge(Threshold::MinLoadGap, false),
            Action::GapUp => return self.nudge(Threshold::MinLoadGap, true),
            Action::SkewDown => return self.nudge(Threshold::MaxLoadSkew, false),
            Action::SkewUp => return self.nudge(Threshold::MaxLoadSkew, true),
            Action::CapDown => return self.nudge(Threshold::Capacity, false),
            Action::CapUp => return self.nudge(Threshold::Capacity, true),
            Action::TogglePause => {
                self.frozen = match self.frozen {
                    Some(_) => None,
                    None => Some(self.live().clone()),
                };
                self.refresh_pool_view();
                self.frozen_history = self.frozen.as_ref().map(|_| self.history.clone());
            }
            Action::FocusNext => self.ui.focus_step(true),
            Action::FocusPrev => self.ui.focus_step(false),
            Action::Scroll(delta) if self.ui.focus() == Panel::Workers => {
                self.move_worker_selection(delta);
            }
            Action::ScrollTop if self.ui.focus() == Panel::Workers => {
                self.move_worker_selection(i32::MIN / 2);
            }
            Action::ScrollBottom if self.ui.focus() == Panel::Workers => {
                self.move_worker_selection(i32::MAX / 2);
            }
            Action::Scroll(delta) if self.ui.focus() == Panel::Keys => {
                self.move_key_selection(delta);
            }
            Action::ScrollTop if self.ui.focus() == Panel::Keys => {
                self.move_key_selection(i32::MIN / 2);
            }
            Action::ScrollBottom if self.ui.focus() == Panel::Keys => {
                self.move_key_selection(i32::MAX / 2);
            }
            Action::Scroll(delta) => {
                let max = self.max_scroll(self.ui.focus());
                self.ui.scroll_by(delta, max);
            }
            Action::ScrollTop => self.ui.scroll_to(0),
            Action::ScrollBottom => self.ui.scroll_to(self.max_scroll(self.ui.focus())),
            Action::CycleSort => self.ui.cycle_sort(),
            Action::ToggleWorkerOrder => self.ui.toggle_worker_order(),
            Action::CyclePool => self.cycle_pool(),
            Action::Drain | Action::Undrain => return self.drain(action == Action::Drain),
            // The pane covers the key table and its prompt: it closes so the filter is seen.
            Action::StartFilter => {
                self.ui.close_history();
                self.ui.start_filter();
            }
            Action::FilterChar(c) => self.ui.type_filter(c),
            Action::FilterBackspace => self.ui.erase_filter_char(),
            Action::FilterApply => self.ui.keep_filter(),
            // Esc closes the history pane first; the filter is cleared by the next one.
            Action::FilterClear if self.ui.history_of().is_some() && !self.ui.filter_editing() => {
                self.ui.close_history();
            }
            Action::FilterClear => self.ui.clear_filter(),
            Action::StartSearch => self.ui.start_search(),
            Action::SearchChar(c) => {
                let needle = self.ui.type_search(c).map(str::to_owned);
                self.follow_search(needle);
            }
            Action::SearchBackspace => {
                let needle = self.ui.erase_search_char().map(str::to_owned);
                self.follow_search(needle);
            }
            Action::SearchApply => self.ui.keep_search(),
            Action::SearchCancel => self.ui.cancel_search(),
            Action::JumpHottest => self.jump_to_hottest(),
            Action::ToggleHelp => self.ui.toggle_help(),
            Action::ToggleWarnings => self.ui.toggle_warnings(),
            Action::ToggleHistory => self.toggle_history(),
        }
        Effect::None
    }

    /// Moves the worker selection `delta` rows in the panel's order and scrolls so it stays on
    /// screen.
    fn move_worker_selection(&mut self, delta: i32) {
        let rows = self.worker_rows();
        if rows.is_empty() {
            return;
        }
        let current = self
            .selected_worker()
            .and_then(|w| rows.iter().position(|r| r.name == w.name))
            .unwrap_or(0);
        let next = current
            .saturating_add_signed(delta as isize)
            .min(rows.len() - 1);
        let name = rows[next].name.clone();
        self.ui.select_worker(name);
        let visible = self.ui.viewport(Panel::Workers).max(1);
        let scroll = self.ui.scroll(Panel::Workers);
        if next < scroll {
            self.ui.scroll_to(next);
        } else if next >= scroll + visible {
            self.ui.scroll_to(next + 1 - visible);
        }
    }

    /// `d` / `u`: asks every replica to drain or undrain the selected worker.
    fn drain(&mut self, drain: bool) -> Effect {
        let Some(worker) = self.selected_worker() else {
            self.notice = Some("no worker to drain yet".into());
            return Effect::None;
        };
        let name = worker.name.clone();
        self.notice = None;
        let change = if drain {
            Change::Drain(name)
        } else {
            Change::Undrain(name)
        };
        Effect::Send(self.commands.send(change, self.replicas.len()))
    }

    /// One press of a threshold key: asks the gateway for the next step of `threshold`, or says
    /// why not. Nothing changes locally until the gateway's `ack`.
    fn nudge(&mut self, threshold: Threshold, up: bool) -> Effect {
        let Some(policy) = self.live().policy else {
            self.notice = Some("no policy known yet: wait for the gateway's snapshot".into());
            return Effect::None;
        };
        if let Some(record) = &self.live().policy_unknown {
            self.notice = Some(format!(
                "this console does not know the gateway's {}: its thresholds are not changed from here",
                record.unknown_names().join(", ")
            ));
            return Effect::None;
        }
        // Capacity applies under every policy; the thresholds only under the bounded one.
        if threshold != Threshold::Capacity && !self.live().bound_in_force() {
            self.notice = Some(format!(
                "{} never spills: the thresholds change nothing (PUT /admin/policy to switch kind)",
                policy.kind
            ));
            return Effect::None;
        }
        let pending = self.commands.newest_pending(threshold);
        let busiest = self
            .live()
            .workers
            .iter()
            .map(WorkerRecord::rule_load)
            .max()
            .unwrap_or(0);
        match Change::step(threshold, up, pending, &policy, busiest) {
            Ok(change) => {
                self.notice = None;
                Effect::Send(self.commands.send(change, self.replicas.len()))
            }
            Err(why) => {
                self.notice = Some(why.to_owned());
                Effect::None
            }
        }
    }

    /// The last first-row that still fills the panel's viewport (or the last row, before the
    /// viewport is known).
    fn max_scroll(&self, panel: Panel) -> usize {
        let visible = self.ui.viewport(panel).max(1);
        self.rows_in(panel).saturating_sub(visible)
    }

    fn rows_in(&self, panel: Panel) -> usize {
        let fleet = self.visible();
        match panel {
            Panel::Workers => fleet.workers.len(),
            Panel::Ring => fleet.ring.as_ref().map_or(0, |r| r.workers.len()),
            Panel::Keys => self.key_rows().len(),
            Panel::Spills => fleet.spills.len(),
        }
    }
}
