//! The workers panel's rows at any fleet size: the window of rows a frame draws (in load order
//! without ordering the whole fleet), the worker search (`f`) and the jump to the hottest worker
//! (`h`). Both jumps select a worker by name and scroll the panel so it shows.

use std::cmp::Reverse;

use bch_core::telemetry::WorkerRecord;

use super::{Panel, State, WorkerOrder};

impl State {
    /// Rows `start..start + len` of the workers panel, in the chosen order (the same rows
    /// [`State::worker_rows`] gives there). In load order only the first `start + len` rows are
    /// ordered, so a frame costs a linear pass, not a sort of the whole fleet.
    pub fn worker_window(&self, start: usize, len: usize) -> Vec<&WorkerRecord> {
        let workers = &self.visible().workers;
        if self.ui.worker_order() == WorkerOrder::Config {
            return workers.iter().skip(start).take(len).collect();
        }
        let end = start.saturating_add(len).min(workers.len());
        // Configuration order breaks ties, as the stable sort of `worker_rows` does.
        let mut ranked: Vec<(Reverse<u64>, usize)> = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (Reverse(w.rule_load()), i))
            .collect();
        if end < ranked.len() {
            ranked.select_nth_unstable(end);
            ranked.truncate(end);
        }
        ranked.sort_unstable();
        ranked
            .iter()
            .skip(start)
            .map(|&(_, i)| &workers[i])
            .collect()
    }

    /// The worker a search for `needle` finds: the one named exactly so (ignoring case), else the
    /// first in the panel's order whose name contains it (ignoring case); `None` for an empty
    /// needle or no match.
    pub fn find_worker(&self, needle: &str) -> Option<&WorkerRecord> {
        if needle.is_empty() {
            return None;
        }
        let needle = needle.to_lowercase();
        let rows = self.worker_rows();
        let exact = rows.iter().find(|w| w.name.to_lowercase() == needle);
        exact
            .or_else(|| {
                rows.iter()
                    .find(|w| w.name.to_lowercase().contains(&needle))
            })
            .copied()
    }

    /// How many workers' names contain `needle` (ignoring case), for the search prompt.
    pub fn worker_matches(&self, needle: &str) -> usize {
        let needle = needle.to_lowercase();
        self.visible()
            .workers
            .iter()
            .filter(|w| w.name.to_lowercase().contains(&needle))
            .count()
    }

    /// The worker with the highest load the rule reads; the first in configuration order among
    /// equals. `None` without workers.
    pub fn hottest_worker(&self) -> Option<&WorkerRecord> {
        self.visible()
            .workers
            .iter()
            .min_by_key(|w| Reverse(w.rule_load()))
    }

    /// Selects the worker that `needle` finds, live as the search is typed; with no match the
    /// selection stays where it is.
    pub(super) fn follow_search(&mut self, needle: Option<String>) {
        let found = needle.and_then(|n| self.find_worker(&n).map(|w| w.name.clone()));
        if let Some(name) = found {
            self.show_worker(name);
        }
    }

    /// `h`: focuses the workers panel and selects the hottest worker.
    pub(super) fn jump_to_hottest(&mut self) {
        match self.hottest_worker().map(|w| w.name.clone()) {
            Some(name) => {
                self.ui.focus_workers();
                self.show_worker(name);
            }
            None => self.notice = Some("no worker to jump to yet".into()),
        }
    }

    /// Selects the worker named `name` and scrolls the workers panel just enough to show it.
    fn show_worker(&mut self, name: String) {
        let Some(row) = self.worker_rows().iter().position(|w| w.name == name) else {
            return;
        };
        self.ui.select_worker(name);
        let visible = self.ui.viewport(Panel::Workers).max(1);
        let scroll = self.ui.scroll(Panel::Workers);
        if row < scroll {
            self.ui.scroll_workers_to(row);
        } else if row >= scroll + visible {
            self.ui.scroll_workers_to(row + 1 - visible);
        }
    }
}
