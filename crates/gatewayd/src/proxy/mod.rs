//! The data plane: route each request by its routing key and stream it to the chosen worker.
//!
//! A request goes through three steps, each its own function: [`route`] (size check, key, decision,
//! load), `send_with_retry` (one retry on another worker when nothing reached the first) and
//! `respond` (response head, then the body streamed). Errors travel as [`GatewayError`] values;
//! one place turns them into answers, and the request's [`Exchange`](exchange) logs every request
//! once when it ends.
//!
//! Request and response bodies are streamed as they arrive, never held back. The worker connection
//! is driven from the response body ([`ProxyBody`], see [`crate::upstream`]), and the request's
//! load guard lives there too, so a worker's active load ends with the last byte sent to the
//! client, on an upstream error, or when the client goes away — and when the client leaves before
//! the worker sent anything, dropping the handler future drops the guard and the pending upstream
//! request (closing that upstream connection).

pub mod body;
pub mod handle;
pub mod loads;
pub mod model;
pub mod request;

use std::sync::Arc;
use std::time::Instant;

use bch_core::policy::Branch;
use bch_core::router::RoutingTable;
use bch_core::routing_key;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Version};
use http_body::Body;

pub use body::ProxyBody;
pub use handle::DataPlane;

use crate::config::runtime::RuntimeSettings;
use crate::error::{ERROR_CODE_HEADER_NAME, GatewayError, QUEUE_WAIT_HEADER_NAME, display_chain};
use crate::http1::RequestBody;
use crate::routing::exchange::Head;
use crate::routing::request_id::REQUEST_ID_HEADER;
use crate::routing::{Choice, Exchange, RouteBy, connect_failed, retry_on};
use crate::server::ClientStall;
use crate::upstream::{ExchangeError, ResponseBody, SendError, UpstreamBody, client_fault};
use request::{
    check_header_budget, client_refusal, point_at, refuse_early, strip_hop_by_hop, upstream_request,
};

/// `x-bch-worker`: the name of the worker that served the request.
pub const WORKER_HEADER: HeaderName = HeaderName::from_static(routing_key::WORKER_HEADER);
/// `x-smg-routed-worker-id`: the URL of the worker that served the request (SGLang Model
/// Gateway's header), beside [`WORKER_HEADER`].
pub const ROUTED_WORKER_HEADER: HeaderName = HeaderName::from_static("x-smg-routed-worker-id");
/// `x-bch-branch`: the routing branch taken.
pub const BRANCH_HEADER: HeaderName = HeaderName::from_static(routing_key::BRANCH_HEADER);
/// `x-bch-queue-wait-ms`: whole milliseconds an admitted request waited in the admission queue
/// (only on requests that waited).
pub const QUEUE_WAIT_HEADER: HeaderName = HeaderName::from_static(QUEUE_WAIT_HEADER_NAME);
/// `x-smg-error-code`: the machine-readable cause of every answer the gateway makes itself
/// (SGLang Model Gateway's name and, where it has one, its code).
pub const ERROR_CODE_HEADER: HeaderName = HeaderName::from_static(ERROR_CODE_HEADER_NAME);

/// Serves one data plane request; `stall` is its connection's flag, which its exchange reads when
/// it ends. Never fails: gateway errors are OpenAI-shaped JSON responses.
pub async fn serve(
    plane: Arc<DataPlane>,
    request: Request<RequestBody>,
    stall: ClientStall,
) -> Response<ProxyBody> {
    if request.method() == http::Method::GET {
        match request.uri().path() {
            "/health" => {
                return json_response(StatusCode::OK, Bytes::from_static(b"{\"status\":\"ok\"}"));
            }
            "/readiness" => return readiness(&plane),
            path if loads::LOADS_PATHS.contains(&path)
                && plane.routing.settings.load().serve_loads =>
            {
                let body = loads::loads_body(&plane.routing.router.table());
                return json_response(StatusCode::OK, body);
            }
            "/v1/models" => {
                if let Some(list) = model::model_list(&plane.routing.router.table()) {
                    return json_response(StatusCode::OK, list);
                }
            }
            _ => {}
        }
    }
    proxy(plane, request, stall).await
}

/// `GET /readiness`: 200 while some worker takes requests (healthy and not draining), else 503.
fn readiness(plane: &DataPlane) -> Response<ProxyBody> {
    let healthy = plane.routing.router.table().routable_count();
    let status = if healthy > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = format!(r#"{{"ready":{},"healthy_workers":{healthy}}}"#, healthy > 0);
    json_response(status, Bytes::from(body))
}

async fn proxy(
    plane: Arc<DataPlane>,
    request: Request<RequestBody>,
    stall: ClientStall,
) -> Response<ProxyBody> {
    let head = Head::of(&request);
    let client_version = request.version();
    let mut exchange = Exchange::begin(Arc::clone(&plane.routing), Instant::now(), head);
    exchange.watch_client_stall(Some(stall));
    let settings = plane.routing.settings.load();
    let forwarded = match route(&plane, &settings, request, &mut exchange).await {
        Ok(routed) => send_with_retry(&plane, &settings, routed, &mut exchange).await,
        Err(error) => Err(error),
    };
    match forwarded {
        Ok(answered) => respond(answered, exchange, &settings, client_version).await,
        Err(error) => refuse(exchange, &error),
    }
}

/// A routed request, ready to be sent.
struct Routed {
    request: Request<UpstreamBody>,
    client_path: Option<PathAndQuery>,
    table: Arc<RoutingTable>,
    worker: usize,
    branch: Branch,
    /// The request's model and body key, for a retry's pick.
    by: RouteBy,
}

/// A worker's answer: its response head, its body (unread) relayed from the connection it came
/// on.
struct Answered {
    response: Response<ResponseBody>,
    worker_header: Option<HeaderValue>,
    /// `x-smg-routed-worker-id`: the serving worker's URL as configured.
    routed_worker_header: Option<HeaderValue>,
    branch: Branch,
}

/// Refuses what may not be forwarded ([`refuse_early`]), reads the body's model and key when
/// routing needs them ([`model::route_by`]), then the shared routing step
/// ([`crate::routing::route`]: size, key, decision in the model's pool, load), then the request
/// made into one for the chosen worker.
async fn route(
    plane: &DataPlane,
    settings: &RuntimeSettings,
    request: Request<RequestBody>,
    exchange: &mut Exchange,
) -> Result<Routed, GatewayError> {
    refuse_early(
        request.method(),
        request.version(),
        request.headers(),
        &settings.routing_headers,
        &plane.via,
    )?;
    let (mut parts, body) = request.into_parts();
    let sent = parts.headers.len();
    exchange.forward_id(&mut parts.headers);
    check_header_budget(sent, &parts.headers)?;
    let body_deadline =
        tokio::time::Instant::from_std(exchange.started()) + settings.request_body_timeout;
    let mut body = UpstreamBody::new(body, settings.max_body_bytes, body_deadline);
    let table = plane.routing.router.table();
    let by = model::route_by(&table, settings, &parts.method, &parts.headers, &mut body).await?;
    drop(table);
    let Choice {
        table,
        worker,
        branch,
        ..
    } = crate::routing::route(&plane.routing, settings, &parts.headers, &by, exchange).await?;
    Ok(Routed {
        client_path: parts.uri.path_and_query().cloned(),
        request: upstream_request(parts, body, &plane.via),
        table,
        worker,
        branch,
        by,
    })
}

/// Sends the request and waits for the response head. A request that provably never reached its
/// worker (the connect failed) goes once to the next healthy worker clockwise; target-worker
/// requests are pinned and never move.
async fn send_with_retry(
    plane: &DataPlane,
    settings: &RuntimeSettings,
    routed: Routed,
    exchange: &mut Exchange,
) -> Result<Answered, GatewayError> {
    let Routed {
        mut request,
        client_path,
        table,
        mut worker,
        branch,
        by,
    } = routed;
    let targets = plane.upstreams.for_table(&table);
    let mut may_retry = branch != Branch::TargetWorkerHit;
    loop {
        let name = &table.workers()[worker].spec.name;
        let target = targets
            .get(worker)
            .ok_or_else(|| GatewayError::WorkerGone(name.clone()))?;
        point_at(&mut request, client_path.as_ref(), target)?;
        let sent = tokio::time::timeout(
            settings.first_byte_timeout,
            plane.upstreams.send(target, request),
        )
        .await;
        let Ok(sent) = sent else {
            exchange.record_error();
            return Err(GatewayError::FirstByteTimeout {
                worker: name.clone(),
                timeout_ms: settings.first_byte_timeout.as_millis() as u64,
            });
        };
        match sent {
            Ok(response) => {
                exchange.headers_arrived();
                exchange.set_status(response.status());
                return Ok(Answered {
                    response,
                    worker_header: target.worker_header.clone(),
                    routed_worker_header: target.routed_worker_header.clone(),
                    branch,
                });
            }
            Err(SendError::NotSent {
                error,
                request: back,
            }) => {
                let failed = FailedConnect {
                    table: &table,
                    worker,
                    may_retry,
                    by: &by,
                };
                if let Some(next) = failed.handle(plane, settings, &*error, &back, exchange) {
                    (worker, request, may_retry) = (next, *back, false);
                    continue;
                }
                tracing::warn!(worker = %name, error = %display_chain(&*error), "worker request failed");
                return Err(unreachable(name, &*error));
            }
            Err(SendError::Failed(error)) => {
                return Err(failed_exchange(settings, exchange, name, &error));
            }
        }
    }
}

/// The answer to an exchange that failed after (part of) the request was written: the client's
/// fault when its body failed, else the worker's — an invalid response says so, anything else is
/// "could not be reached".
fn failed_exchange(
    settings: &RuntimeSettings,
    exchange: &mut Exchange,
    worker: &str,
    error: &ExchangeError,
) -> GatewayError {
    if let Some(fault) = client_fault(error) {
        return client_refusal(settings, fault);
    }
    exchange.record_error();
    let reason = display_chain(error);
    if error.is_parse() {
        // Not HTTP: a garbage status line, a head over the limits, conflicting lengths.
        tracing::warn!(%worker, %reason, "worker sent an invalid response");
        return GatewayError::WorkerBadResponse {
            worker: worker.to_owned(),
            reason,
        };
    }
    tracing::warn!(%worker, error = %reason, "worker request failed");
    unreachable(worker, error)
}

/// The answer when `worker` could not be reached: one that says TLS when the handshake failed (or,
/// in TLS 1.3, the worker refused the client certificate on the first read).
fn unreachable(worker: &str, error: &(dyn std::error::Error + 'static)) -> GatewayError {
    match crate::upstream::tls_problem(error) {
        Some(problem) => GatewayError::WorkerTls(worker.to_owned(), problem.as_str()),
        None => GatewayError::WorkerUnreachable(worker.to_owned()),
    }
}

/// A connect to `worker` that failed before anything of the request was sent.
struct FailedConnect<'a> {
    table: &'a Arc<RoutingTable>,
    worker: usize,
    may_retry: bool,
    by: &'a RouteBy,
}

impl FailedConnect<'_> {
    /// Counts the error, marks the worker unhealthy (passive health), and moves the request to the
    /// retry pick if it may move and there is one: the next healthy worker of the request's pool
    /// clockwise from its key (the same headers and body give the same key).
    fn handle(
        &self,
        plane: &DataPlane,
        settings: &RuntimeSettings,
        error: &(dyn std::error::Error + 'static),
        request: &Request<UpstreamBody>,
        exchange: &mut Exchange,
    ) -> Option<usize> {
        let routing = &plane.routing;
        let cause = display_chain(error);
        connect_failed(routing, settings, self.table, self.worker, exchange, &cause);
        if !self.may_retry {
            return None;
        }
        let key = self
            .by
            .key(&settings.routing_headers, request.headers())
            .key;
        let pool = self.by.pool(self.table).ok()?;
        let (next, guard) = (routing.router).route_retry_in(self.table, &key, self.worker, pool)?;
        let workers = self.table.workers();
        tracing::debug!(from = %workers[self.worker].spec.name, to = %workers[next].spec.name, "retrying after connect failure");
        retry_on(routing, exchange, guard, next);
        Some(next)
    }
}

/// The worker's response head, with gatewayd's headers, and its body streamed (a chunked one to an
/// HTTP/1.1 client in the framing it came in). A body that is not
/// an event stream is read to its first frame first: if the worker breaks it before that, the
/// client still gets a 502 (an event stream's head goes out at once, and a break later in it gets
/// its `event: error`).
async fn respond(
    answered: Answered,
    mut exchange: Exchange,
    settings: &RuntimeSettings,
    client_version: Version,
) -> Response<ProxyBody> {
    let Answered {
        response,
        worker_header,
        routed_worker_header,
        branch,
    } = answered;
    let (mut parts, mut body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(value) = worker_header {
        parts.headers.insert(WORKER_HEADER, value);
    }
    if let Some(value) = routed_worker_header {
        parts.headers.insert(ROUTED_WORKER_HEADER, value);
    }
    parts
        .headers
        .insert(BRANCH_HEADER, HeaderValue::from_static(branch.as_str()));
    parts
        .headers
        .insert(REQUEST_ID_HEADER, exchange.request_id().clone());
    if let Some(waited) = exchange.queue_wait_ms() {
        parts
            .headers
            .insert(QUEUE_WAIT_HEADER, HeaderValue::from(waited));
    }
    if body.is_end_stream() {
        // No body (204, 304, `Content-Length: 0`): the server will not poll one, so the exchange
        // ends here (the connection went back to its pool when the head was read).
        drop(exchange);
        return Response::from_parts(parts, ProxyBody::empty());
    }
    // A broken event stream ends with an appended `event: error`, which only a body of no fixed
    // length can carry: with a `Content-Length` the client would get the event cut at that
    // length, a "complete" body that is not one. Such a stream is aborted like any other body.
    let event_stream = body.size_hint().exact().is_none()
        && parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    // A chunked body goes to an HTTP/1.1 client chunked too: relayed in the framing it came in,
    // validated on its way, never decoded and encoded again. (An HTTP/1.0 client, or an HTTP/1.0
    // response, gets the data delimited by the close.)
    if client_version == Version::HTTP_11 && parts.version == Version::HTTP_11 {
        body.keep_chunk_framing();
    }
    let mut body = ProxyBody::stream(body, exchange, event_stream, settings.stream_idle_timeout);
    if !event_stream && let Err(exchange) = body.first_frame().await {
        let worker = exchange.worker_name().unwrap_or("-").to_owned();
        return refuse(exchange, &GatewayError::UpstreamBodyBroken(worker));
    }
    Response::from_parts(parts, body)
}

/// The gateway's own answer to a refused or failed request; the exchange ends (and logs) here.
fn refuse(mut exchange: Exchange, error: &GatewayError) -> Response<ProxyBody> {
    exchange.fail(error);
    let mut response = json_response(error.status(), error.body());
    response
        .headers_mut()
        .insert(REQUEST_ID_HEADER, exchange.request_id().clone());
    if let Some(branch) = exchange.branch() {
        response
            .headers_mut()
            .insert(BRANCH_HEADER, HeaderValue::from_static(branch.as_str()));
    }
    let headers = response.headers_mut();
    headers.insert(
        ERROR_CODE_HEADER,
        HeaderValue::from_static(error.smg_error_code()),
    );
    if let Some(seconds) = error.retry_after_secs() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn json_response(status: StatusCode, body: Bytes) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_errors_are_openai_shaped_and_carry_the_branch_header() {
        let response = json_response(
            GatewayError::NoHealthyWorkers.status(),
            GatewayError::NoHealthyWorkers.body(),
        );
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn every_client_fault_has_its_metric_label() {
        use crate::error::ClientBodyFault;
        use crate::upstream::ClientBodyError;
        let settings = RuntimeSettings::from_config(&crate::config::Config::default());
        for (fault, label) in [
            (ClientBodyError::Incomplete, ClientBodyFault::Incomplete),
            (
                ClientBodyError::Malformed("x".into()),
                ClientBodyFault::Malformed,
            ),
            (ClientBodyError::TooLarge, ClientBodyFault::TooLarge),
            (ClientBodyError::Timeout, ClientBodyFault::Timeout),
        ] {
            let refusal = client_refusal(&settings, &fault);
            assert_eq!(refusal.client_body_fault(), Some(label), "{refusal:?}");
        }
    }
}
