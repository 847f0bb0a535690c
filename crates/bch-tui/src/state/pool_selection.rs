//! The pool selector: which model's pool the panels show (`m` cycles all workers → each model in
//! name order → all workers; `--model` starts on one). The choice is view-only ([`super::Ui`]),
//! so a replay that seeks back keeps it; the pool's picture is derived from the whole fleet's
//! whenever that changes, never per draw: the ring of a pool is hashed again only when its
//! members change.

use super::State;

impl State {
    /// The model whose pool the panels show; `None`: every worker.
    pub fn pool(&self) -> Option<&str> {
        self.ui.pool()
    }

    /// Shows `model`'s pool (`None`: every worker), as `--model` asks before the first frame. A
    /// model no worker serves (yet) shows an empty pool until one does.
    pub fn set_pool(&mut self, model: Option<String>) {
        self.ui.set_pool(model);
        self.refresh_pool_view();
    }

    /// `m`: the next pool after the one shown, in the gateway's order (models by name), then
    /// every worker again. A fleet that declares no model has one pool: nothing to pick, and the
    /// notice says so.
    pub(super) fn cycle_pool(&mut self) {
        let next = {
            let whole = self.whole();
            let models = whole.models();
            if models.is_empty() && self.ui.pool().is_none() {
                self.notice = Some("no model declared: one pool of every worker".into());
                return;
            }
            match self.ui.pool() {
                None => models.first().map(|m| (*m).to_owned()),
                Some(shown) => (models.into_iter()).find(|m| *m > shown).map(str::to_owned),
            }
        };
        self.set_pool(next);
    }

    /// Derives the shown pool's picture again from the whole fleet (paused: from the frozen
    /// copy), reusing the last one's ring while the pool's members are the same.
    pub(super) fn refresh_pool_view(&mut self) {
        self.pool_view = match self.ui.pool() {
            None => None,
            Some(model) => Some(self.whole().pool_view(model, self.pool_view.as_ref())),
        };
    }

    /// [`State::refresh_pool_view`] after a frame or a connection event changed the live fleet:
    /// while paused the panels show the frozen copy, whose pool's picture has not changed.
    pub(super) fn refresh_live_pool_view(&mut self) {
        if self.frozen.is_none() {
            self.refresh_pool_view();
        }
    }
}
