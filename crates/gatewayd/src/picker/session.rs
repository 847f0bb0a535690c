//! One ext_proc stream, which Envoy opens for one HTTP request: the picker's state machine.
//!
//! - The request headers (the first message; its `protocol_config` needs no answer) are routed by
//!   the step the data plane uses ([`crate::routing::route`]), in the one pool the picker serves
//!   (`[picker] model`): the decision reserves load on the chosen worker, and the answer names it
//!   and its fallbacks, all of that pool. A refusal (no healthy worker, a
//!   target-worker miss, a declared body over the limit) is an immediate response in the OpenAI
//!   shape, and the request ends there. A request that finds no worker with room waits in the
//!   admission queue with its answer held back (Envoy waits for it, up to its ext_proc
//!   `message_timeout`): the pick once admitted, an immediate 503 with `Retry-After` if shed, so
//!   the picker is Envoy's flow control.
//! - The response headers say which endpoint Envoy served from. If it is a listed fallback, Envoy
//!   says the chosen worker's connect failed (Envoy retries only connect failures onto
//!   fallbacks). Anyone who reaches the picker port can say so, so the report alone counts
//!   nothing against the worker and leaves its health alone: it is counted as a report and asks
//!   the gateway's own prober to probe the worker now, whose result decides. The load moves to
//!   the worker that served. The answer adds `x-bch-worker` and `x-bch-branch`.
//! - The load is held by the session's [`Exchange`] and released exactly once, by dropping it:
//!   at the end of the response (a last body chunk or trailers, when Envoy sends them; a response
//!   without a body) or when the stream ends for any reason — Envoy closes it after the response,
//!   the client aborted, the upstream failed, Envoy gave up on the picker, the connection to
//!   Envoy broke, or the picker ended a stream Envoy left silent (`service`).
//!
//! Every message Envoy sends gets exactly one answer, in the shape its kind needs.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bch_core::admission::ShedReason;
use bch_core::policy::Branch;
use bch_core::router::RoutingTable;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpHeaders, ProcessingRequest, ProcessingResponse,
};

use super::endpoints::{Addresses, Listed, endpoint_list};
use super::handle::PickerPlane;
use super::messages;
use crate::admission::Admitted;
use crate::config::runtime::RuntimeSettings;
use crate::error::GatewayError;
use crate::per_worker::WorkerKey;
use crate::routing::{Choice, Exchange, Placement, RouteBy, Waiting};

/// The state of one ext_proc stream. Dropping it ends the request (see the module docs).
pub struct Session {
    plane: Arc<PickerPlane>,
    /// Set by the request headers; the second one on a stream is answered but not routed.
    seen_request: bool,
    /// The routed request holding load, until the response ends.
    held: Option<Held>,
    /// The request waiting in the admission queue, its headers' answer held back until it is
    /// admitted or shed.
    queued: Option<Queued>,
}

/// The future of a request waiting in the admission queue.
type AdmissionWait = Pin<Box<dyn Future<Output = Result<Admitted, ShedReason>> + Send>>;

/// A request waiting for a slot: its exchange (record, no load), what the router said, and its
/// place in the queue (dropping it leaves the queue).
struct Queued {
    exchange: Exchange,
    waiting: Waiting,
    admission: AdmissionWait,
}

/// A routed request: its exchange (record and load guard) and where the load is.
struct Held {
    exchange: Exchange,
    table: Arc<RoutingTable>,
    addresses: Arc<Addresses>,
    worker: usize,
    branch: Branch,
    /// The workers Envoy was given: the chosen one and its fallbacks.
    listed: Listed,
}

impl Session {
    /// A new stream, before its first message.
    pub fn new(plane: Arc<PickerPlane>) -> Self {
        Self {
            plane,
            seen_request: false,
            held: None,
            queued: None,
        }
    }

    /// Whether the request waits in the admission queue: the answer to its headers is held back
    /// until [`Session::poll_admitted`] gives it, and no other message is read meanwhile (Envoy
    /// sends none before that answer).
    pub fn is_waiting(&self) -> bool {
        self.queued.is_some()
    }

    /// The answer to the request headers of a waiting request, once it is admitted (the pick) or
    /// shed (an immediate 503). `Pending` while it waits; only call while [`Session::is_waiting`].
    pub fn poll_admitted(&mut self, cx: &mut Context<'_>) -> Poll<ProcessingResponse> {
        let Some(queued) = self.queued.as_mut() else {
            return Poll::Pending;
        };
        let Poll::Ready(outcome) = queued.admission.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        let Queued {
            mut exchange,
            waiting,
            ..
        } = self.queued.take().expect("checked above");
        let routing = &self.plane.routing;
        let settings = routing.settings.load();
        match crate::routing::admit(routing, &settings, waiting, outcome, &mut exchange) {
            Ok(choice) => Poll::Ready(self.pick(exchange, choice, &settings)),
            Err(error) => Poll::Ready(refuse(exchange, &error)),
        }
    }

    /// The answer to one message from Envoy; `None` when the message needs none.
    pub fn on_message(&mut self, message: &ProcessingRequest) -> Option<ProcessingResponse> {
        let request = message.request.as_ref()?;
        tracing::trace!(message = kind(request), "ext_proc message");
        match request {
            Request::RequestHeaders(headers) if !self.seen_request => {
                self.seen_request = true;
                return self.on_request_headers(headers);
            }
            Request::ResponseHeaders(headers) => {
                if let Some(held) = self.held.as_mut() {
                    let answer = held.on_response_headers(&self.plane, message, headers);
                    if headers.end_of_stream {
                        // No body follows (204, 304, HEAD, `Content-Length: 0`): the response
                        // ends here.
                        self.finish();
                    }
                    return Some(answer);
                }
            }
            Request::ResponseBody(body) if body.end_of_stream => self.finish(),
            Request::ResponseTrailers(_) => self.finish(),
            _ => {}
        }
        messages::continue_unchanged(message)
    }

    /// Routes the request; `None` when it waits for a slot (see [`Session::poll_admitted`]).
    fn on_request_headers(&mut self, message: &HttpHeaders) -> Option<ProcessingResponse> {
        let routing = &self.plane.routing;
        let headers = messages::headers(message);
        let head = messages::head(headers);
        let mut exchange = Exchange::begin(Arc::clone(routing), Instant::now(), head);
        let settings = routing.settings.load();
        // The picker serves one pool and reads no body: the request is its pool's model's.
        let by = RouteBy {
            model: settings.picker_model.clone(),
            rid_key: None,
        };
        match crate::routing::route_now(routing, &settings, headers, &by, &mut exchange) {
            Ok(Placement::Chosen(choice)) => Some(self.pick(exchange, choice, &settings)),
            Ok(Placement::Wait(waiting)) => {
                let admission = waiting.routed.table.policy().admission;
                let wait =
                    routing
                        .queue
                        .wait(waiting.key.clone(), waiting.model.clone(), &admission);
                self.queued = Some(Queued {
                    exchange,
                    waiting,
                    admission: Box::pin(wait),
                });
                None
            }
            // No worker serves the picker's model now (its pool's last worker left): for
            // Envoy's client that is a pool without workers, not a model it named wrong.
            Err(GatewayError::ModelNotFound(_)) => {
                Some(refuse(exchange, &GatewayError::NoHealthyWorkers))
            }
            Err(error) => Some(refuse(exchange, &error)),
        }
    }

    /// The pick for a routed request: the chosen worker and its fallbacks; the session holds the
    /// request (and its load) until the response ends.
    fn pick(
        &mut self,
        exchange: Exchange,
        choice: Choice,
        settings: &RuntimeSettings,
    ) -> ProcessingResponse {
        let addresses = self.plane.addresses.for_table(&choice.table);
        let mut endpoints = String::with_capacity(24 * (1 + settings.picker_fallbacks));
        let Some(listed) = endpoint_list(
            &choice.table,
            &addresses,
            &choice,
            settings.picker_fallbacks,
            &mut endpoints,
        ) else {
            // The same situation as the data plane's worker without an endpoint, the same answer.
            let worker = choice.table.workers()[choice.worker].spec.name.clone();
            return refuse(exchange, &GatewayError::WorkerGone(worker));
        };
        let Choice {
            table,
            worker,
            branch,
            ..
        } = choice;
        self.held = Some(Held {
            exchange,
            table,
            addresses,
            worker,
            branch,
            listed,
        });
        messages::pick(endpoints)
    }

    /// The picker ends the stream because Envoy left it silent too long: the request is logged
    /// `error=true` (it did not end as Envoy would have ended it), blaming no worker.
    pub fn end_silent(&mut self) {
        if let Some(held) = self.held.as_mut() {
            held.exchange.cut_by_gateway();
        }
        self.finish();
    }

    /// The response ended: the exchange ends (load released, telemetry told, request logged).
    fn finish(&mut self) {
        self.held = None;
    }
}

impl Held {
    /// Records the response (status, time to its headers), follows a fallback Envoy served from,
    /// and answers with `x-bch-worker` and `x-bch-branch`.
    fn on_response_headers(
        &mut self,
        plane: &PickerPlane,
        message: &ProcessingRequest,
        headers: &HttpHeaders,
    ) -> ProcessingResponse {
        self.exchange.headers_arrived();
        if let Some(status) = messages::status(messages::headers(headers)) {
            self.exchange.set_status(status);
        }
        if let Some(served) = messages::served_endpoint(message) {
            let chosen = self.addresses.get(self.worker).map(|a| a.addr);
            if chosen != Some(served) {
                self.follow_fallback(plane, served);
            }
        }
        let worker = self
            .exchange
            .holds_load()
            .then(|| self.table.workers()[self.worker].spec.name.as_str());
        messages::annotate(worker, self.branch, self.exchange.queue_wait_ms())
    }

    /// Envoy served the request from `served`, not the chosen worker. A listed fallback is
    /// Envoy's word that the chosen worker's connect failed: a peer's word, so it is counted as a
    /// report and asks for a probe of the chosen worker, whose result decides its health; no
    /// error is counted against it. Any other worker means Envoy did not follow the pick (its
    /// cluster lacks the listed endpoints). Either way the load moves to the worker that served;
    /// an address that is no worker of the table releases the load: nothing of ours serves it.
    fn follow_fallback(&mut self, plane: &PickerPlane, served: std::net::SocketAddr) {
        let routing = &plane.routing;
        let next = self.addresses.index_of(served);
        let given = next.is_some_and(|next| self.listed.contains(next));
        if given {
            plane.metrics.record_fallback_report();
            let chosen = &self.table.workers()[self.worker];
            let asked = plane.probe_requests.probe(WorkerKey::of_worker(chosen));
            tracing::debug!(worker = %chosen.spec.name, %served, asked, "Envoy reports serving a fallback; probing the chosen worker");
        } else if plane.admit_claim_warning() {
            tracing::warn!(%served, "Envoy served an endpoint it was not given (does its cluster hold every worker?)");
        }
        let moved = next.and_then(|next| Some((next, routing.router.reserve(&self.table, next)?)));
        let Some((next, guard)) = moved else {
            self.exchange.release_worker();
            return;
        };
        self.exchange.move_to(guard, next);
        self.worker = next;
    }
}

/// The answer to a refused request; its exchange ends here (logged with the refusal's status).
fn refuse(mut exchange: Exchange, error: &GatewayError) -> ProcessingResponse {
    exchange.fail(error);
    messages::refuse(error, exchange.branch())
}

/// The name of a message's kind, for trace lines.
fn kind(request: &Request) -> &'static str {
    match request {
        Request::RequestHeaders(_) => "request_headers",
        Request::ResponseHeaders(_) => "response_headers",
        Request::RequestBody(_) => "request_body",
        Request::ResponseBody(_) => "response_body",
        Request::RequestTrailers(_) => "request_trailers",
        Request::ResponseTrailers(_) => "response_trailers",
    }
}
