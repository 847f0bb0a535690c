//! One client request from its first byte to its last: the request's record (id, start time,
//! status, outcome) and, once it is routed, its hold on a worker (the load guard). Dropping the
//! exchange ends the request, and that is the one place every request — served, refused before
//! routing (413), refused by routing (503) or failed upstream (502, 504) — is logged and observed
//! in `bch_request_duration_seconds`, exactly once.
//!
//! Both front ends use it: the data plane keeps the exchange in the response body, the endpoint
//! picker in the state of the request's ext_proc stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bch_core::decide::Decision;
use bch_core::load::LoadGuard;
use bch_core::policy::Branch;
use bch_core::router::RoutingTable;
use http::StatusCode;

use super::handle::Routing;
use crate::telemetry::keys::KeyTag;

static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

/// A request in progress. See the module documentation.
pub struct Exchange {
    routing: Arc<Routing>,
    started: Instant,
    request_id: u64,
    /// HTTP status sent to the client (0 until known).
    status: u16,
    errored: bool,
    /// What the client did wrong, when the request failed by the client's fault.
    client_fault: Option<&'static str>,
    branch: Option<Branch>,
    /// The table the request was routed on and the worker it holds, once routed.
    routed: Option<(Arc<RoutingTable>, usize)>,
    guard: Option<LoadGuard>,
    key: Option<KeyTag>,
}

impl Exchange {
    /// A request that just arrived.
    pub fn begin(routing: Arc<Routing>, started: Instant) -> Self {
        Self {
            routing,
            started,
            request_id: REQUEST_IDS.fetch_add(1, Ordering::Relaxed),
            status: 0,
            errored: false,
            client_fault: None,
            branch: None,
            routed: None,
            guard: None,
            key: None,
        }
    }

    /// The routing decision, and the load taken on the chosen worker when there is one.
    pub fn routed(
        &mut self,
        table: &Arc<RoutingTable>,
        decision: &Decision,
        guard: Option<LoadGuard>,
        key: Option<KeyTag>,
    ) {
        self.branch = Some(decision.branch);
        if let (Some(worker), Some(guard)) = (decision.worker, guard) {
            self.routed = Some((Arc::clone(table), worker));
            self.guard = Some(guard);
        }
        self.key = key;
    }

    /// Moves the request's hold to `worker` (a retry after a failed connect): the first worker's
    /// load and telemetry end now.
    pub fn move_to(&mut self, guard: LoadGuard, worker: usize) {
        self.release_worker();
        self.guard = Some(guard);
        if let Some((_, held)) = &mut self.routed {
            *held = worker;
        }
    }

    /// Whether the request holds load on a worker.
    pub fn holds_load(&self) -> bool {
        self.guard.is_some()
    }

    /// Ends the request's hold on its worker now (load and telemetry), keeping the record open
    /// until the exchange ends. For load that no worker of the membership carries any more.
    pub fn release(&mut self) {
        self.release_worker();
    }

    /// Counts a gateway-side error against the worker the request holds.
    pub fn record_error(&mut self) {
        if let Some(guard) = &self.guard {
            guard.stats().record_error();
        }
        self.errored = true;
    }

    /// Notes a failure that is the client's fault (`reason` as in `bch_client_body_errors_total`):
    /// logged with the request, never counted against the worker.
    pub fn record_client_fault(&mut self, reason: &'static str) {
        self.client_fault = Some(reason);
    }

    /// When the request arrived.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The status the client is answered with.
    pub fn set_status(&mut self, status: StatusCode) {
        self.status = status.as_u16();
    }

    /// Time since the request arrived.
    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// The name of the worker the request holds, once routed.
    pub fn worker_name(&self) -> Option<&str> {
        let (table, worker) = self.routed.as_ref()?;
        Some(&table.workers()[*worker].spec.name)
    }

    /// The branch the request was routed by, once routed.
    pub fn branch(&self) -> Option<Branch> {
        self.branch
    }

    fn release_worker(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            if let Some((table, worker)) = &self.routed {
                self.routing
                    .telemetry
                    .finished(table, *worker, self.key.as_ref());
            }
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.release_worker();
        let elapsed = self.started.elapsed();
        self.routing
            .metrics
            .request_duration
            .observe(elapsed.as_secs_f64());
        let worker = self
            .routed
            .as_ref()
            .map_or("-", |(table, worker)| &table.workers()[*worker].spec.name);
        tracing::info!(
            request_id = self.request_id,
            worker = %worker,
            branch = %self.branch.map_or("-", Branch::as_str),
            status = self.status,
            duration_ms = elapsed.as_millis() as u64,
            error = self.errored,
            client_fault = %self.client_fault.unwrap_or("-"),
            "request"
        );
    }
}
