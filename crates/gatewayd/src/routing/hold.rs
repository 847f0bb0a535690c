//! A routed request's hold on its worker: the load guard, the table and worker it was routed
//! on, the key telemetry follows, and the worker a failed connect moved it away from. Ending the
//! hold (early, on a move, or when it is dropped) ends the worker's load and tells telemetry the
//! request finished there, exactly once per worker held, and offers the freed slot to the
//! admission queue.

use std::sync::Arc;

use bch_core::load::LoadGuard;
use bch_core::router::RoutingTable;

use super::handle::Routing;
use crate::telemetry::keys::KeyTag;

/// See the module documentation. The table and worker stay known after the load ends: the
/// request's record still names the worker and counts its response there.
pub struct Hold {
    routing: Arc<Routing>,
    /// The load taken on `worker`; `None` once the hold ended.
    guard: Option<LoadGuard>,
    /// The table the request was routed on; `worker` and `retried_from` index it.
    table: Arc<RoutingTable>,
    /// The worker held (or last held).
    worker: usize,
    /// The request's key, for telemetry.
    key: Option<KeyTag>,
    /// The worker a failed connect moved the request away from.
    retried_from: Option<usize>,
}

impl Hold {
    /// A hold of `guard`'s load on `worker` of `table`.
    pub fn new(
        routing: Arc<Routing>,
        table: Arc<RoutingTable>,
        worker: usize,
        guard: LoadGuard,
        key: Option<KeyTag>,
    ) -> Self {
        Hold {
            routing,
            guard: Some(guard),
            table,
            worker,
            key,
            retried_from: None,
        }
    }

    /// Moves the hold to `worker`, with `guard` its load there: the first worker's load and
    /// telemetry end now.
    pub fn move_to(&mut self, guard: LoadGuard, worker: usize) {
        self.release();
        self.guard = Some(guard);
        self.retried_from = Some(self.worker);
        self.worker = worker;
    }

    /// Ends the load and tells telemetry, once; later calls change nothing.
    pub fn release(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            self.routing
                .telemetry
                .finished(&self.table, self.worker, self.key.as_ref());
            // The one place load ends: a waiting request may take the slot.
            self.routing.queue.slot_freed();
        }
    }

    /// The load guard, while the hold lasts.
    pub fn guard(&self) -> Option<&LoadGuard> {
        self.guard.as_ref()
    }

    /// The table and the worker held (or last held).
    pub fn worker(&self) -> (&Arc<RoutingTable>, usize) {
        (&self.table, self.worker)
    }

    /// The name of the worker held (or last held).
    pub fn worker_name(&self) -> &str {
        &self.table.workers()[self.worker].spec.name
    }

    /// The name of the worker a failed connect moved the request away from.
    pub fn retried_from_name(&self) -> Option<&str> {
        let from = self.retried_from?;
        Some(&self.table.workers()[from].spec.name)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}
