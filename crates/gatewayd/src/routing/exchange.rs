//! One client request from its first byte to its last: the request's record (id, method, path,
//! start time, status, outcome, timings) and, once it is routed, its [`Hold`] on a worker.
//! Dropping the exchange ends the request, and that is the one place every request — served,
//! refused before routing (413), refused by routing (503) or failed upstream (502, 504) — is
//! logged, counted by status class and observed in `bch_request_duration_seconds`, exactly once.
//!
//! Both front ends use it: the data plane keeps the exchange in the response body, the endpoint
//! picker in the state of the request's ext_proc stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bch_core::admission::ShedReason;
use bch_core::decide::Decision;
use bch_core::load::{LoadGuard, StatusClass};
use bch_core::policy::Branch;
use bch_core::router::RoutingTable;
use http::header::{HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, StatusCode};

use super::handle::Routing;
use super::hold::Hold;
use super::request_id::{REQUEST_ID_HEADER, RequestId, id_buffer};
use crate::error::{ClientBodyFault, GatewayError, Source};
use crate::server::ClientStall;
use crate::telemetry::keys::KeyTag;

/// The `tracing` target of the access log, one `request` line per request: what a log filter
/// names to keep or mute it (the demo keeps it at `warn`, so its banner stays readable).
pub const ACCESS_LOG: &str = "bch::access";

/// What an exchange takes from the request's head: for its log line and its request id.
pub struct Head {
    /// The request's method.
    pub method: Method,
    /// Its path and query; `None` when the request log is off (nothing reads it then).
    pub path: Option<PathAndQuery>,
    /// The client's `x-request-id`, if it sent one (kept only when usable).
    pub client_id: Option<HeaderValue>,
}

impl Head {
    /// The head of a request the data plane received.
    pub fn of<B>(request: &Request<B>) -> Self {
        Head {
            method: request.method().clone(),
            // Only the log line reads it: not even a reference count when it is off.
            path: request_log_on()
                .then(|| request.uri().path_and_query().cloned())
                .flatten(),
            client_id: request.headers().get(REQUEST_ID_HEADER).cloned(),
        }
    }
}

/// Whether request log lines are written (the path is kept only then).
pub fn request_log_on() -> bool {
    tracing::enabled!(target: ACCESS_LOG, tracing::Level::INFO)
}

/// A request in progress. See the module documentation.
pub struct Exchange {
    routing: Arc<Routing>,
    started: Instant,
    request_id: RequestId,
    method: Method,
    path: Option<PathAndQuery>,
    /// HTTP status sent to the client, once known.
    status: Option<StatusCode>,
    errored: bool,
    /// What the client's body did wrong, when the request failed by the client's fault.
    client_fault: Option<ClientBodyFault>,
    /// The client connection's stall flag, when it has one (the data plane's).
    client_stall: Option<ClientStall>,
    /// The client closed its connection before the response's end ([`Exchange::client_left`]).
    client_left: bool,
    branch: Option<Branch>,
    /// The request's hold on its worker, once routed to one; kept after the load ends, for the
    /// worker's name and response counts.
    hold: Option<Hold>,
    /// When the worker's response head arrived.
    headers_after: Option<Duration>,
    /// When the first byte of the response body arrived.
    first_byte_after: Option<Duration>,
    /// How long the request waited in the admission queue, when it waited.
    queue_wait: Option<Duration>,
    /// Why the request was shed, when it was.
    shed: Option<ShedReason>,
}

impl Exchange {
    /// A request that just arrived: its id, method and path are taken from `head`.
    pub fn begin(routing: Arc<Routing>, started: Instant, head: Head) -> Self {
        let Head {
            method,
            path,
            client_id,
        } = head;
        Self {
            routing,
            started,
            request_id: RequestId::new(client_id),
            method,
            path,
            status: None,
            errored: false,
            client_fault: None,
            client_stall: None,
            client_left: false,
            branch: None,
            hold: None,
            headers_after: None,
            first_byte_after: None,
            queue_wait: None,
            shed: None,
        }
    }

    /// Puts the request id on the request for the worker: the gateway's own, or the client's
    /// (replacing one the gateway found unusable).
    pub fn forward_id(&mut self, headers: &mut HeaderMap) {
        if self.request_id.is_ours() {
            let id = self.request_id.header_value().clone();
            headers.insert(REQUEST_ID_HEADER, id);
        }
    }

    /// Watches the client connection's `stall` flag: a response still in progress when the
    /// client's stall failed its connection is recorded as cut by the client (`error=true`,
    /// `client_fault=client_stall`, `bch_client_stalls_total`), never against the worker.
    pub fn watch_client_stall(&mut self, stall: Option<ClientStall>) {
        self.client_stall = stall;
    }

    /// The client went away while the response was still being sent (its connection closed, so
    /// the body was dropped before its end): logged `error=true client_fault=client_left` with the
    /// status already sent, unless the response had already failed for another reason. Like a
    /// stall, it is never counted against the worker.
    pub fn client_left(&mut self) {
        self.client_left = true;
    }

    /// The gateway ended the request before its end for a reason that is nobody's fault it can
    /// name (the picker ending a stream Envoy left silent): logged `error=true`, counted against
    /// no worker.
    pub fn cut_by_gateway(&mut self) {
        self.errored = true;
    }

    /// The request id, for the response to the client.
    pub fn request_id(&mut self) -> &HeaderValue {
        self.request_id.header_value()
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
            let routing = Arc::clone(&self.routing);
            self.hold = Some(Hold::new(routing, Arc::clone(table), worker, guard, key));
        }
    }

    /// The request was admitted after waiting `waited` in the admission queue (`None`: at once).
    pub fn waited(&mut self, waited: Option<Duration>) {
        self.queue_wait = waited;
    }

    /// Whole milliseconds the request waited in the admission queue, when it waited: the
    /// `x-bch-queue-wait-ms` response header.
    pub fn queue_wait_ms(&self) -> Option<u64> {
        millis(self.queue_wait)
    }

    /// Moves the request's hold to `worker` (a retry after a failed connect): the first worker's
    /// load and telemetry end now.
    /// A request is only moved once routed (it holds a worker).
    pub fn move_to(&mut self, guard: LoadGuard, worker: usize) {
        if let Some(hold) = &mut self.hold {
            hold.move_to(guard, worker);
        }
    }

    /// Whether the request holds load on a worker.
    pub fn holds_load(&self) -> bool {
        self.hold
            .as_ref()
            .is_some_and(|hold| hold.guard().is_some())
    }

    /// Ends the request's hold on its worker now (load and telemetry), keeping the record open
    /// until the exchange ends. For load that no worker of the membership carries any more.
    pub fn release_worker(&mut self) {
        if let Some(hold) = &mut self.hold {
            hold.release();
        }
    }

    /// Counts a gateway-side error against the worker the request holds.
    pub fn record_error(&mut self) {
        if let Some(guard) = self.hold.as_ref().and_then(Hold::guard) {
            guard.stats().record_error();
        }
        self.errored = true;
    }

    /// The request is answered with the gateway's refusal `error`: its status, and when the
    /// client's body was at fault, `bch_client_body_errors_total` and the log line's
    /// `client_fault` (never the worker's error count). The one place both front ends account a
    /// refused or failed request; a worker's failure was counted where it happened
    /// ([`Exchange::record_error`]).
    pub fn fail(&mut self, error: &GatewayError) {
        self.status = Some(error.status());
        if let GatewayError::Shed { reason, .. } = error {
            self.shed = Some(*reason);
        }
        match error.caused_by() {
            Source::Client => {
                if let Some(fault) = error.client_body_fault() {
                    self.routing.metrics.record_client_body_error(fault);
                    self.client_fault = Some(fault);
                }
            }
            Source::Worker | Source::Gateway => {}
        }
    }

    /// When the request arrived.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The status the client is answered with.
    pub fn set_status(&mut self, status: StatusCode) {
        self.status = Some(status);
    }

    /// The worker's response head arrived: observed in `bch_response_headers_seconds`.
    pub fn headers_arrived(&mut self) {
        let after = self.started.elapsed();
        self.headers_after = Some(after);
        self.routing
            .metrics
            .response_headers
            .observe(after.as_secs_f64());
    }

    /// The first chunk of the response body arrived; for an event stream that is the first
    /// token, observed in `bch_time_to_first_token_seconds`. Later calls change nothing.
    pub fn first_chunk(&mut self, event_stream: bool) {
        if self.first_byte_after.is_some() {
            return;
        }
        let after = self.started.elapsed();
        self.first_byte_after = Some(after);
        if event_stream {
            self.routing
                .metrics
                .time_to_first_token
                .observe(after.as_secs_f64());
        }
    }

    /// The name of the worker the request holds, once routed.
    pub fn worker_name(&self) -> Option<&str> {
        self.hold.as_ref().map(Hold::worker_name)
    }

    /// The branch the request was routed by, once routed.
    pub fn branch(&self) -> Option<Branch> {
        self.branch
    }
}

/// Whole milliseconds of `d`, when there is one.
fn millis(d: Option<Duration>) -> Option<u64> {
    d.map(|d| d.as_millis() as u64)
}

/// A time in the log line: whole milliseconds, `-1` when never (the documented log format).
fn logged_millis(d: Option<Duration>) -> i64 {
    millis(d).map_or(-1, |ms| ms as i64)
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // The worker's load ends before the line is written.
        self.release_worker();
        // Still in progress while its connection failed for a stall: the stall cut it. The
        // exchange of a finished response ends before its connection could stall.
        let stalled = self.client_stall.as_ref().is_some_and(ClientStall::stalled);
        if stalled {
            self.errored = true;
            self.routing.metrics.record_client_stall();
        }
        // Cut because the gateway's process stopped with it still running (the shutdown grace
        // expired): an error, but not the client's.
        let dropped = self
            .client_stall
            .as_ref()
            .is_some_and(ClientStall::dropped_by_gateway);
        // A response that already failed (the worker broke it, the gateway ended it) says so;
        // only an intact one cut short by the client is the client's doing.
        let left = !stalled && !dropped && self.client_left && !self.errored;
        if left || dropped {
            self.errored = true;
        }
        let elapsed = self.started.elapsed();
        let seconds = elapsed.as_secs_f64();
        self.routing.metrics.request_duration.observe(seconds);
        let class = self
            .status
            .map_or(StatusClass::None, |s| StatusClass::of(s.as_u16()));
        match &self.hold {
            Some(hold) => {
                let (table, worker) = hold.worker();
                table.workers()[worker]
                    .stats
                    .record_response(class, seconds);
            }
            None => self.routing.metrics.record_unrouted_response(class),
        }
        let worker = self.hold.as_ref().map_or("-", Hold::worker_name);
        let retried_from = self
            .hold
            .as_ref()
            .and_then(Hold::retried_from_name)
            .unwrap_or("-");
        let mut buffer = id_buffer();
        tracing::info!(
            target: ACCESS_LOG,
            request_id = self.request_id.text(&mut buffer),
            method = %self.method,
            path = self.path.as_ref().map_or("/", PathAndQuery::path),
            worker = %worker,
            retried_from = %retried_from,
            branch = %self.branch.map_or("-", Branch::as_str),
            // 0: no status was sent (the client left first).
            status = self.status.map_or(0, |s| s.as_u16()),
            headers_ms = logged_millis(self.headers_after),
            ttfb_ms = logged_millis(self.first_byte_after.or(self.headers_after)),
            duration_ms = elapsed.as_millis() as u64,
            queue_ms = logged_millis(self.queue_wait),
            shed = %self.shed.map_or("-", ShedReason::as_str),
            error = self.errored,
            client_fault = %self.client_fault.map_or(
                if stalled {
                    "client_stall"
                } else if left {
                    "client_left"
                } else {
                    "-"
                },
                ClientBodyFault::as_str
            ),
            "request"
        );
    }
}
