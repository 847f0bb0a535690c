//! The data plane: route each request by its routing key and stream it to the chosen worker.
//!
//! Request and response bodies are streamed as they arrive, never held back: response frames that
//! have already arrived are passed on together, nothing waits for more. The worker connection is
//! driven from the response body ([`ProxyBody`], see [`crate::upstream`]), and the request's load
//! guard lives there too, so a worker's active load ends with the last byte sent to the client, on
//! an upstream error, or when the client goes away — and when the client leaves before the worker
//! sent anything, dropping the handler future drops the guard and the pending upstream request
//! (closing that upstream connection).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bch_core::decide::Decision;
use bch_core::load::LoadGuard;
use bch_core::policy::Branch;
use bch_core::router::RoutingTable;
use bch_core::routing_key;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use crate::gateway::Gateway;
use crate::telemetry::KeyEvent;
use crate::upstream::{
    BoxError, SendError, UpstreamBody, UpstreamConnection, UpstreamTarget, is_body_too_large,
};

static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

/// `x-bch-worker`: the name of the worker that served the request.
pub const WORKER_HEADER: HeaderName = HeaderName::from_static("x-bch-worker");
/// `x-bch-branch`: the routing branch taken.
pub const BRANCH_HEADER: HeaderName = HeaderName::from_static("x-bch-branch");

/// Handles one data plane request. Never fails: gateway errors are OpenAI-shaped JSON responses.
pub async fn handle(
    gateway: Arc<Gateway>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let path = request.uri().path();
    if request.method() == http::Method::GET {
        if path == "/health" {
            return Ok(json_response(
                StatusCode::OK,
                Bytes::from_static(b"{\"status\":\"ok\"}"),
            ));
        }
        if path == "/readiness" {
            let healthy = gateway
                .router
                .table()
                .health()
                .iter()
                .filter(|h| **h)
                .count();
            let status = if healthy > 0 {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let body = format!(r#"{{"ready":{},"healthy_workers":{healthy}}}"#, healthy > 0);
            return Ok(json_response(status, Bytes::from(body)));
        }
    }
    Ok(proxy(gateway, request).await)
}

async fn proxy(gateway: Arc<Gateway>, request: Request<Incoming>) -> Response<ProxyBody> {
    let started = Instant::now();
    let settings = gateway.settings.load();
    if let Some(length) = content_length(request.headers()) {
        if length > settings.max_body_bytes {
            return gateway_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                &format!(
                    "request body of {length} bytes exceeds the limit of {} bytes",
                    settings.max_body_bytes
                ),
                None,
            );
        }
    }
    let (parts, body) = request.into_parts();
    let extracted = extract_key(&settings, &parts.headers);
    if let Some(reason) = extracted.ignored_explicit {
        gateway.metrics.record_ignored_key(reason);
    }
    let key = extracted.key;
    let mut routed = gateway.router.route(&key);
    gateway.metrics.record_branch(routed.decision.branch);
    let key_event = KeyEvent::from_key(&key, settings.redact_keys);
    gateway
        .telemetry
        .routed(&routed.table, &routed.decision, key_event.clone());
    let (Some(mut worker), Some(guard)) = (routed.decision.worker, routed.guard.take()) else {
        let (code, message) = match routed.decision.branch {
            Branch::TargetWorkerMiss => (
                "target_worker_miss",
                "the target worker is unknown or unhealthy",
            ),
            _ => (
                "no_healthy_workers",
                "no healthy worker can take the request",
            ),
        };
        return gateway_error(
            StatusCode::SERVICE_UNAVAILABLE,
            code,
            message,
            Some(routed.decision.branch),
        );
    };
    let table = routed.table;
    let decision = routed.decision;
    let mut lease = Lease::new(
        Arc::clone(&gateway),
        guard,
        Arc::clone(&table),
        worker,
        decision.branch,
        key_event,
        started,
    );

    let client_path = parts.uri.path_and_query().cloned();
    let mut upstream_request =
        upstream_request(parts, UpstreamBody::new(body, settings.max_body_bytes));
    let mut retried = false;
    let targets = gateway.upstreams.for_table(&table);
    loop {
        let spec = &table.workers()[worker].spec;
        let target = &targets[worker];
        if let Err(message) = point_at(&mut upstream_request, client_path.as_ref(), target) {
            return gateway_error(
                StatusCode::BAD_GATEWAY,
                "bad_worker_url",
                &message,
                Some(decision.branch),
            );
        }
        let sent = tokio::time::timeout(
            settings.first_byte_timeout,
            gateway.upstreams.send(target, upstream_request),
        )
        .await;
        match sent {
            Ok(Ok((response, connection))) => {
                let ttfb = started.elapsed();
                gateway
                    .metrics
                    .time_to_first_byte
                    .observe(ttfb.as_secs_f64());
                lease.status = response.status().as_u16();
                return respond(response, connection, lease, target, decision, &settings);
            }
            Ok(Err(SendError::NotSent { error, request })) => {
                lease.record_error();
                if settings.passive_health && gateway.router.set_health(&spec.name, false) {
                    tracing::warn!(worker = %spec.name, error = %error_chain(&*error), "connect failed; marked unhealthy until probes succeed");
                }
                // Nothing of the request reached this worker, so it may go to another one, once.
                // Target-worker requests are pinned.
                if !retried && decision.branch != Branch::TargetWorkerHit {
                    // The key borrows the request's headers, which travelled with the request: the
                    // same headers give the same key.
                    let key = extract_key(&settings, request.headers()).key;
                    if let Some((next, guard)) = gateway.router.route_retry(&table, &key, worker) {
                        gateway.metrics.record_retry();
                        tracing::debug!(from = %spec.name, to = %table.workers()[next].spec.name, "retrying after connect failure");
                        worker = next;
                        lease.move_to(guard, next);
                        upstream_request = *request;
                        retried = true;
                        continue;
                    }
                }
                tracing::warn!(worker = %spec.name, error = %error_chain(&*error), "worker request failed");
                lease.status = 502;
                return gateway_error(
                    StatusCode::BAD_GATEWAY,
                    "worker_unreachable",
                    &format!("worker {} could not be reached", spec.name),
                    Some(decision.branch),
                );
            }
            Ok(Err(SendError::Failed(error))) => {
                lease.record_error();
                if is_body_too_large(&error) {
                    lease.status = 413;
                    return gateway_error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        &format!(
                            "request body exceeds the limit of {} bytes",
                            settings.max_body_bytes
                        ),
                        Some(decision.branch),
                    );
                }
                tracing::warn!(worker = %spec.name, error = %error_chain(&error), "worker request failed");
                lease.status = 502;
                return gateway_error(
                    StatusCode::BAD_GATEWAY,
                    "worker_unreachable",
                    &format!("worker {} could not be reached", spec.name),
                    Some(decision.branch),
                );
            }
            Err(_elapsed) => {
                lease.record_error();
                lease.status = 504;
                return gateway_error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "first_byte_timeout",
                    &format!(
                        "worker {} sent no response headers within {} ms",
                        spec.name,
                        settings.first_byte_timeout.as_millis()
                    ),
                    Some(decision.branch),
                );
            }
        }
    }
}

fn respond(
    response: Response<Incoming>,
    connection: UpstreamConnection,
    lease: Lease,
    target: &UpstreamTarget,
    decision: Decision,
    settings: &crate::gateway::RuntimeSettings,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(value) = &target.worker_header {
        parts.headers.insert(WORKER_HEADER, value.clone());
    }
    parts.headers.insert(
        BRANCH_HEADER,
        HeaderValue::from_static(decision.branch.as_str()),
    );
    if body.is_end_stream() {
        // No body (204, 304, `Content-Length: 0`): hyper will not poll one, so the exchange ends
        // here and the connection can serve the next request.
        connection.release();
        drop(lease);
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
    Response::from_parts(
        parts,
        ProxyBody::stream(
            body,
            connection,
            lease,
            event_stream,
            settings.stream_idle_timeout,
        ),
    )
}

fn extract_key<'a>(
    settings: &crate::gateway::RuntimeSettings,
    headers: &'a HeaderMap,
) -> routing_key::Extracted<'a> {
    routing_key::extract(&settings.routing_headers, |name| {
        headers.get(name).map(HeaderValue::as_bytes)
    })
}

/// The client's request made into a request for a worker, reusing its head (no header copies):
/// HTTP/1.1, without `Host` and hop-by-hop headers, extensions dropped. [`point_at`] then
/// gives it a worker's URI and `Host`.
fn upstream_request(parts: http::request::Parts, body: UpstreamBody) -> Request<UpstreamBody> {
    let mut request = Request::from_parts(parts, body);
    *request.version_mut() = http::Version::HTTP_11;
    request.extensions_mut().clear();
    let headers = request.headers_mut();
    headers.remove(header::HOST);
    strip_hop_by_hop(headers);
    request
}

/// Points `request` at `target`: origin-form URI (the worker's path prefix, then the client's path
/// and query) and the worker's `Host`. Called again when a retry moves the request to another
/// worker.
fn point_at(
    request: &mut Request<UpstreamBody>,
    client_path: Option<&http::uri::PathAndQuery>,
    target: &UpstreamTarget,
) -> Result<(), String> {
    let url = target.url.as_ref().map_err(String::clone)?;
    let uri = if url.prefix.is_empty() {
        // The common case shares the client's path instead of copying it.
        Ok(Uri::from(client_path.cloned().unwrap_or_else(|| {
            http::uri::PathAndQuery::from_static("/")
        })))
    } else {
        let path_and_query = client_path.map_or("/", http::uri::PathAndQuery::as_str);
        format!("{}{path_and_query}", url.prefix)
            .parse::<Uri>()
            .map_err(|e| e.to_string())
    }
    .map_err(|e| format!("cannot build upstream URI for {}: {e}", target.name))?;
    *request.uri_mut() = uri;
    if let Some(host) = &target.host_header {
        request.headers_mut().insert(header::HOST, host.clone());
    }
    Ok(())
}

/// Hop-by-hop headers that are never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers (RFC 9110 §7.6.1): the fixed list plus any named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests and responses carry none: one pass over the names (cheap comparisons for
    // standard headers) instead of nine hashed removals.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An OpenAI-shaped gateway error: `{"error":{"message","type","code"}}`.
pub fn gateway_error(
    status: StatusCode,
    code: &str,
    message: &str,
    branch: Option<Branch>,
) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "error": {"message": message, "type": "gateway_error", "code": code}
    });
    let mut response = json_response(status, Bytes::from(body.to_string()));
    if let Some(branch) = branch {
        response
            .headers_mut()
            .insert(BRANCH_HEADER, HeaderValue::from_static(branch.as_str()));
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

/// The request's hold on a worker: its load guard plus what the access log, metrics and telemetry
/// need when the request ends. Dropping it ends the request.
pub struct Lease {
    gateway: Arc<Gateway>,
    guard: Option<LoadGuard>,
    table: Arc<RoutingTable>,
    worker: usize,
    branch: Branch,
    key: Option<KeyEvent>,
    started: Instant,
    request_id: u64,
    /// HTTP status sent to the client (0 until known).
    pub status: u16,
    errored: bool,
}

impl Lease {
    fn new(
        gateway: Arc<Gateway>,
        guard: LoadGuard,
        table: Arc<RoutingTable>,
        worker: usize,
        branch: Branch,
        key: Option<KeyEvent>,
        started: Instant,
    ) -> Self {
        Self {
            gateway,
            guard: Some(guard),
            table,
            worker,
            branch,
            key,
            started,
            request_id: REQUEST_IDS.fetch_add(1, Ordering::Relaxed),
            status: 0,
            errored: false,
        }
    }

    fn move_to(&mut self, guard: LoadGuard, worker: usize) {
        self.finish_on_worker();
        self.guard = Some(guard);
        self.worker = worker;
    }

    fn record_error(&mut self) {
        if let Some(guard) = &self.guard {
            guard.stats().record_error();
        }
        self.errored = true;
    }

    fn finish_on_worker(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            self.gateway
                .telemetry
                .finished(&self.table, self.worker, self.key.as_ref());
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.finish_on_worker();
        let elapsed = self.started.elapsed();
        self.gateway
            .metrics
            .request_duration
            .observe(elapsed.as_secs_f64());
        tracing::info!(
            request_id = self.request_id,
            worker = %self.table.workers()[self.worker].spec.name,
            branch = %self.branch,
            status = self.status,
            duration_ms = elapsed.as_millis() as u64,
            error = self.errored,
            "request"
        );
    }
}

/// Response bodies: a fixed gateway answer, or a worker's stream carrying the request's lease.
pub struct ProxyBody {
    kind: BodyKind,
}

enum BodyKind {
    Full(Option<Bytes>),
    Stream(Box<StreamState>),
}

struct StreamState {
    inner: Incoming,
    /// The worker connection `inner` comes from, driven here; `None` once released or closed.
    upstream: Option<UpstreamConnection>,
    /// A frame (trailers) or error met while gathering, returned by the next poll.
    deferred: Option<Result<Frame<Bytes>, hyper::Error>>,
    lease: Option<Lease>,
    event_stream: bool,
    idle_timeout: Duration,
    /// When the last frame arrived (or the stream started).
    last_frame: tokio::time::Instant,
    /// Armed the first time the worker makes the stream wait, then moved forward only when it
    /// fires: a frame costs a clock read, not a timer update.
    idle: Option<Pin<Box<Sleep>>>,
}

/// Most bytes [`StreamState::gather`] merges into one frame.
const GATHER_LIMIT: usize = 16 * 1024;

const SSE_ERROR_EVENT: &[u8] = b"event: error\ndata: {\"error\":{\"message\":\"the worker's stream ended abnormally\",\"type\":\"gateway_error\",\"code\":\"upstream_stream_error\"}}\n\n";

impl ProxyBody {
    /// No body.
    pub fn empty() -> Self {
        Self {
            kind: BodyKind::Full(None),
        }
    }

    /// A complete body.
    pub fn full(bytes: Bytes) -> Self {
        Self {
            kind: BodyKind::Full(Some(bytes)),
        }
    }

    fn stream(
        inner: Incoming,
        upstream: UpstreamConnection,
        lease: Lease,
        event_stream: bool,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            kind: BodyKind::Stream(Box::new(StreamState {
                inner,
                upstream: Some(upstream),
                deferred: None,
                lease: Some(lease),
                event_stream,
                idle_timeout,
                last_frame: tokio::time::Instant::now(),
                idle: None,
            })),
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            BodyKind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            BodyKind::Stream(state) => state.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Full(bytes) => bytes.is_none(),
            BodyKind::Stream(state) => state.lease.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            BodyKind::Full(None) => SizeHint::with_exact(0),
            BodyKind::Stream(state) => state.inner.size_hint(),
        }
    }
}

impl StreamState {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.lease.is_none() {
            return Poll::Ready(None);
        }
        let polled = match self.deferred.take() {
            Some(frame) => Poll::Ready(Some(frame)),
            None => self.poll_worker(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => Frame::data(self.gather(data, cx)),
                    Err(other) => other,
                };
                if frame.is_trailers() || (self.inner.is_end_stream() && self.deferred.is_none()) {
                    // The last byte of a Content-Length body, or trailers (always last): hyper
                    // drops a body once its length or its trailers are written, without polling it
                    // again, so the request ends here, and the worker connection, read to its
                    // end, can serve the next one.
                    self.finish();
                } else if self.idle.is_some() {
                    self.last_frame = tokio::time::Instant::now();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                self.record_error();
                tracing::warn!(error = %error_chain(&error), "worker stream broke");
                Poll::Ready(self.end_abnormally(error.into()))
            }
            Poll::Pending => {
                let idle_timeout = self.idle_timeout;
                if self.idle.is_none() {
                    // First wait: every frame so far came at once, so the silence starts now.
                    self.last_frame = tokio::time::Instant::now();
                }
                let deadline = self.last_frame + idle_timeout;
                let idle = self
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                loop {
                    ready!(idle.as_mut().poll(cx));
                    // Fired: a frame may have come since it was armed.
                    let deadline = self.last_frame + idle_timeout;
                    if deadline <= tokio::time::Instant::now() {
                        break;
                    }
                    idle.as_mut().reset(deadline);
                }
                self.record_error();
                tracing::warn!(
                    idle_ms = self.idle_timeout.as_millis() as u64,
                    "worker stream idle too long; ending it"
                );
                Poll::Ready(self.end_abnormally("worker stream idle timeout".into()))
            }
        }
    }

    fn record_error(&mut self) {
        if let Some(lease) = &mut self.lease {
            lease.record_error();
        }
    }

    /// The worker's next frame. Its bytes come in through this task: drive the connection, then
    /// take what it delivered to the body.
    fn poll_worker(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(upstream) = &mut self.upstream {
            upstream.drive(cx);
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    /// `first` plus the data frames the worker has already delivered behind it, up to
    /// [`GATHER_LIMIT`] bytes: a burst of SSE events (one chunk each) becomes one frame for the
    /// client's connection instead of one chunk header, queue entry and poll round each. Nothing
    /// waits: gathering stops at the first frame that is not there yet. A trailer frame or error
    /// met on the way is kept for the next poll; the end of the body finishes the response.
    fn gather(&mut self, first: Bytes, cx: &mut Context<'_>) -> Bytes {
        let mut merged: Option<BytesMut> = None;
        while !self.inner.is_end_stream()
            && merged.as_ref().map_or(first.len(), BytesMut::len) < GATHER_LIMIT
        {
            match self.poll_worker(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => merged
                        .get_or_insert_with(|| {
                            let mut merged =
                                BytesMut::with_capacity(2 * (first.len() + data.len()));
                            merged.extend_from_slice(&first);
                            merged
                        })
                        .extend_from_slice(&data),
                    Err(other) => {
                        self.deferred = Some(Ok(other));
                        break;
                    }
                },
                Poll::Ready(Some(Err(error))) => {
                    self.deferred = Some(Err(error));
                    break;
                }
                Poll::Ready(None) => {
                    self.finish();
                    break;
                }
                Poll::Pending => break,
            }
        }
        merged.map_or(first, BytesMut::freeze)
    }

    /// Ends a complete response: its worker connection goes back to the pool (if hyper can reuse
    /// it) and the lease ends.
    fn finish(&mut self) {
        if let Some(upstream) = self.upstream.take() {
            upstream.release();
        }
        self.lease = None;
    }

    /// Ends a broken stream. For SSE the client gets a final `event: error` so it can tell a cut
    /// stream from a finished one; other bodies end with an error, which aborts the connection.
    fn end_abnormally(&mut self, error: BoxError) -> Option<Result<Frame<Bytes>, BoxError>> {
        // Closes the worker connection: the worker sees the client is gone.
        self.upstream = None;
        self.lease = None;
        if self.event_stream {
            Some(Ok(Frame::data(Bytes::from_static(SSE_ERROR_EVENT))))
        } else {
            Some(Err(error))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        headers.insert("x-secret-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert("x-smg-routing-key", HeaderValue::from_static("k"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["authorization", "x-smg-routing-key"]);
    }

    #[test]
    fn gateway_errors_are_openai_shaped() {
        let response = gateway_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_healthy_workers",
            "none",
            Some(Branch::NoHealthyWorkers),
        );
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[BRANCH_HEADER], "no_healthy_workers");
        let BodyKind::Full(Some(bytes)) = &response.body().kind else {
            panic!("full body expected");
        };
        let json: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(json["error"]["code"], "no_healthy_workers");
        assert_eq!(json["error"]["type"], "gateway_error");
        assert_eq!(json["error"]["message"], "none");
    }
}
