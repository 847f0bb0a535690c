//! The one error type of gatewayd's answers: every refusal the gateway itself produces, on the data
//! plane (400, 405, 408, 413, 502, 503, 504, 508, the connection-limit 503, the `event: error` that
//! ends a broken SSE stream) and on the control plane (400, 401, 403, 404, 405, 409, 413, 415, 500),
//! with its HTTP status and its OpenAI error body `{"error":{"message","type","code"}}`.
//!
//! Clients of an OpenAI-compatible server already parse that body, so a gateway refusal reads like
//! a server error to them. `type` says which side answered: `gateway_error` for the data plane,
//! `control_error` for the control plane. `code` is stable and machine-readable; the message is for
//! people and names the field, worker or limit involved.
//!
//! Inside the code every variant also says who caused it ([`Source`]: the client, a worker or the
//! gateway) and where it was answered ([`Plane`]), each from one exhaustive match: a new variant
//! does not compile until both are decided, and the `type` on the wire follows from the plane.

use std::sync::LazyLock;

use bch_core::admission::ShedReason;
use bytes::Bytes;

/// The response header naming the machine-readable cause of every answer the gateway makes itself
/// (SGLang Model Gateway's name; [`GatewayError::smg_error_code`]).
pub const ERROR_CODE_HEADER_NAME: &str = "x-smg-error-code";
/// The response header of a request admitted after waiting: whole milliseconds in the queue.
pub const QUEUE_WAIT_HEADER_NAME: &str = "x-bch-queue-wait-ms";

/// Who caused a refusal: what it is counted against, and what an operator looks at first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The client: its request, its body or its pace was wrong. Never counted against a worker.
    Client,
    /// A worker: unreachable, silent past a timeout, or answering with something broken.
    Worker,
    /// The gateway or its configuration: no worker to take the request, a limit reached, a
    /// worker URL that leads nowhere (or back to the gateway).
    Gateway,
}

/// The listener that answered a refusal; it fixes the OpenAI `type` of the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// The data plane (and Envoy's endpoint picker, which answers for it): `gateway_error`.
    Data,
    /// The control plane: `control_error`.
    Control,
}

impl Plane {
    /// The OpenAI `type` of this plane's error bodies.
    pub fn error_type(self) -> &'static str {
        match self {
            Plane::Data => "gateway_error",
            Plane::Control => "control_error",
        }
    }
}

/// What a client's request body did wrong: the `reason` label of `bch_client_body_errors_total`
/// and the `client_fault` of the request's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientBodyFault {
    /// The body ended before its declared end: the client left.
    Incomplete,
    /// The body was malformed, such as an invalid chunked encoding.
    Malformed,
    /// The body went over `max_body_bytes`.
    TooLarge,
    /// The body did not arrive in full within `request_body_timeout_ms`.
    Timeout,
}

impl ClientBodyFault {
    /// Every fault, in label order.
    pub const ALL: [ClientBodyFault; 4] = [
        ClientBodyFault::Incomplete,
        ClientBodyFault::Malformed,
        ClientBodyFault::TooLarge,
        ClientBodyFault::Timeout,
    ];

    /// Position in [`ClientBodyFault::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The metric label and log value.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientBodyFault::Incomplete => "incomplete",
            ClientBodyFault::Malformed => "malformed",
            ClientBodyFault::TooLarge => "too_large",
            ClientBodyFault::Timeout => "timeout",
        }
    }
}

/// The name of the worker a refusal concerns (its `name`, as `/admin/workers` lists it), for
/// the message.
pub type WorkerName = String;

/// A refusal by the gateway. Each variant fixes its status, `code`, [`Source`] and [`Plane`]; see
/// [`GatewayError::status`], [`GatewayError::code`], [`GatewayError::caused_by`] and
/// [`GatewayError::plane`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GatewayError {
    /// The request body is larger than `max_body_bytes` (413). `length` is the declared
    /// `Content-Length` when there was one; a streamed body is cut when it passes the limit.
    #[error("{}", body_too_large_message(*.length, *.limit))]
    PayloadTooLarge {
        /// Declared body length, bytes, when known up front.
        length: Option<u64>,
        /// The limit in force, bytes.
        limit: u64,
    },
    /// No healthy worker can take the request (503).
    #[error("no healthy worker can take the request")]
    NoHealthyWorkers,
    /// No worker is registered at all (503, the same `code` as [`GatewayError::NoHealthyWorkers`]):
    /// no static worker, and discovery found none.
    #[error(
        "no worker is registered: no static worker is configured and DNS discovery has found none"
    )]
    NoWorkers,
    /// The target worker header named an unknown or unhealthy worker (503; never a fall-through).
    #[error("the target worker is unknown or unhealthy")]
    TargetWorkerMiss,
    /// The request names a model no worker serves (404, OpenAI's `model_not_found`).
    #[error("the model {0:?} does not exist: no worker serves it")]
    ModelNotFound(String),
    /// Workers declare models, the request names none and no `[routing] default_model` is set
    /// (400); the message says why the body gave none.
    #[error(
        "the request names no model ({0}): send a JSON body with a \"model\" field, or the x-gateway-model-name header"
    )]
    ModelRequired(String),
    /// The worker chosen on an older routing table left the membership before the request could be
    /// sent to it (502).
    #[error("worker {0} left the membership before the request was sent")]
    WorkerGone(WorkerName),
    /// The worker's path prefix and the client's path make no valid URI (502).
    #[error("cannot build the upstream URI for worker {0}")]
    BadUpstreamUri(WorkerName),
    /// The connection to the worker failed, or the exchange broke before response headers (502).
    #[error("worker {0} could not be reached")]
    WorkerUnreachable(WorkerName),
    /// The TLS handshake with an `https://` worker failed (502, code `worker_unreachable`); the
    /// message says why (`tls: certificate not trusted (UnknownIssuer)`).
    #[error("worker {0} could not be reached: {1}")]
    WorkerTls(WorkerName, &'static str),
    /// The worker answered with something that is not HTTP (a garbage status line, a header over
    /// hyper's limits, conflicting lengths) (502); `reason` is the parser's.
    #[error("worker {worker} sent an invalid response: {reason}")]
    WorkerBadResponse {
        /// The worker.
        worker: WorkerName,
        /// What was wrong, from the HTTP parser.
        reason: String,
    },
    /// The worker's response body broke (or stayed silent past `stream_idle_timeout_ms`) before
    /// its first byte, while a status could still be sent (502).
    #[error(
        "worker {0} sent response headers but no body: it broke the response or fell silent before the first byte"
    )]
    UpstreamBodyBroken(WorkerName),
    /// The client's request body ended before its declared end: the client closed the connection
    /// (400; usually nobody reads it).
    #[error("the request body ended before it was complete (the client closed the connection)")]
    IncompleteRequestBody,
    /// The client's request body is malformed, such as an invalid chunked encoding (400).
    #[error("the request body is malformed: {0}")]
    InvalidRequestBody(String),
    /// The client's request body did not arrive in full within `request_body_timeout_ms` (408).
    #[error("the request body did not arrive within {timeout_ms} ms")]
    RequestBodyTimeout {
        /// The timeout in force, ms.
        timeout_ms: u64,
    },
    /// An HTTP/1.1 request to the data plane without `Host` (400, RFC 9112 §3.2).
    #[error("HTTP/1.1 requests must carry a Host header")]
    MissingHost,
    /// A header that must appear at most once appeared more often (400): the gateway reads the
    /// first, a component behind it might read another.
    #[error("header {0} appears more than once; send it once")]
    RepeatedHeader(String),
    /// The request has more header fields than fit in a request to a worker once the gateway's
    /// own are added (431): refused before anything is sent, so the refusal is the gateway's and
    /// not a worker's.
    #[error(
        "the request has {sent} header fields and the gateway adds {added}: a request to a worker may carry at most {limit}; send at most {}",
        .limit.saturating_sub(*.added)
    )]
    TooManyHeaders {
        /// Header fields the client sent (each field line counts).
        sent: usize,
        /// Header fields the gateway adds to the forwarded request.
        added: usize,
        /// Most header fields a forwarded request may carry.
        limit: usize,
    },
    /// `CONNECT` on the data plane (405): gatewayd forwards requests, it opens no tunnels.
    #[error(
        "CONNECT is not supported: gatewayd forwards HTTP requests to workers and opens no tunnels"
    )]
    TunnelNotSupported,
    /// The request already passed through this gateway (its `Via` names it): a worker URL leads
    /// back here (508).
    #[error(
        "the request already passed through this gateway (its Via header names it): a worker URL leads back to the gateway"
    )]
    LoopDetected,
    /// The worker sent no response headers within `first_byte_timeout_ms` (504).
    #[error("worker {worker} sent no response headers within {timeout_ms} ms")]
    FirstByteTimeout {
        /// The worker.
        worker: WorkerName,
        /// The timeout in force, ms.
        timeout_ms: u64,
    },
    /// Every worker the request may use is at capacity and it could not wait for a slot (503 with
    /// `Retry-After` and `X-SMG-Error-Code`): no queue, the queue full, or its wait timed out.
    /// Never counted against a worker.
    #[error(
        "every worker this request may use is at capacity ({reason}); retry after {retry_after_secs} s"
    )]
    Shed {
        /// Why it could not wait (the `reason` label of the shed counters).
        reason: ShedReason,
        /// The `Retry-After` value, whole seconds.
        retry_after_secs: u64,
    },
    /// The data plane is at `max_connections` (503, then the connection is closed).
    #[error("gateway connection limit reached")]
    TooManyConnections,
    /// Envoy could not reach gatewayd's endpoint picker (503). Envoy sends this body itself, from
    /// the configuration `gatewayd envoy-config` prints.
    #[error("the endpoint picker is unavailable")]
    PickerUnavailable,
    /// A streamed response broke after its headers were sent; only ever sent as an SSE event.
    #[error("the worker's stream ended abnormally")]
    UpstreamStreamError,
    /// [`GatewayError::MissingHost`] on the control plane (400, the same `code`).
    #[error("HTTP/1.1 requests must carry a Host header")]
    MissingControlHost,
    /// No control endpoint at this path (404).
    #[error("no such control endpoint")]
    NotFound,
    /// The control plane needs a bearer token and the request had none or a wrong one (401).
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// A tokenless control plane was addressed by a name that is not its own (403): DNS rebinding.
    #[error("{0}")]
    HostNotAllowed(String),
    /// A browser sent the request from a page whose origin is not allowed (403).
    #[error("{0}")]
    OriginNotAllowed(String),
    /// A control plane request with a body that is not declared `application/json` (415).
    #[error("control plane requests with a body take JSON: send Content-Type: application/json")]
    UnsupportedMediaType,
    /// The control endpoint exists but not for this method (405).
    #[error("this control endpoint does not take this method (see the Allow header)")]
    MethodNotAllowed,
    /// A control plane request body over its limit (413).
    #[error("control plane request bodies are limited to {limit} bytes")]
    ControlBodyTooLarge {
        /// The limit, bytes.
        limit: usize,
    },
    /// A control request body is not the JSON the endpoint takes (400); the message names the field.
    #[error("{0}")]
    InvalidJson(String),
    /// A worker definition is invalid (400); the message names the field.
    #[error("{0}")]
    InvalidWorker(String),
    /// A worker clashes with a registered one (409): same name, URL or ring identity.
    #[error("{0}")]
    WorkerConflict(String),
    /// `DELETE` of a worker that DNS discovery found (409): it would come back on the next refresh.
    #[error("{0}")]
    DiscoveredWorker(String),
    /// No worker has this name (404).
    #[error("no worker named {0:?}")]
    UnknownWorker(String),
    /// A policy change was refused (400); the message names the field.
    #[error("{0}")]
    InvalidPolicy(String),
    /// A query string the endpoint cannot take (400).
    #[error("{0}")]
    InvalidQuery(String),
    /// A routing key the data plane would ignore (400).
    #[error("{0}")]
    InvalidRoutingKey(String),
    /// `POST /admin/reload` on a gateway started without a configuration file (409).
    #[error("{0}")]
    NoConfigFile(String),
    /// The configuration file does not load or validate (400); the message names file and field.
    #[error("{0}")]
    InvalidConfig(String),
    /// The configuration in force could not be rendered as TOML for `GET /admin/config` (500):
    /// a validated configuration always renders, so this is the gateway's bug.
    #[error("cannot render the configuration: {0}")]
    ConfigNotRendered(String),
}

fn body_too_large_message(length: Option<u64>, limit: u64) -> String {
    match length {
        Some(length) => {
            format!("request body of {length} bytes exceeds the limit of {limit} bytes")
        }
        None => format!("request body exceeds the limit of {limit} bytes"),
    }
}

impl GatewayError {
    /// The JSON body, `{"error":{"message","type","code"}}`, fields in that order.
    pub fn body(&self) -> Bytes {
        openai_error_body(self.error_type(), self.code(), &self.to_string())
    }
}

/// `{"error":{"message","type","code"}}` with the fields in the order OpenAI sends them.
fn openai_error_body(error_type: &str, code: &str, message: &str) -> Bytes {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        error: Fields<'a>,
    }
    #[derive(serde::Serialize)]
    struct Fields<'a> {
        message: &'a str,
        #[serde(rename = "type")]
        error_type: &'a str,
        code: &'a str,
    }
    let body = Body {
        error: Fields {
            message,
            error_type,
            code,
        },
    };
    Bytes::from(serde_json::to_vec(&body).expect("strings always serialise"))
}

/// The event appended to an SSE stream that broke after its headers were sent, so a client can
/// tell a cut stream from a finished one: two line feeds, then `event: error` with the OpenAI
/// error body as data.
///
/// The line feeds make it an event of its own wherever the stream was cut. After a cut inside an
/// event (`data: par`), the first ends that line and the second dispatches what the worker had
/// sent of the event; without them `event: error` would be glued onto the cut line and an SSE
/// client would read one `message` event, never the error. At an event boundary they are
/// harmless blank lines: by the HTML standard's event stream rules a blank line dispatches the
/// event, and dispatching with an empty data buffer only clears the buffers (no event reaches
/// the client).
pub fn sse_stream_error_event() -> Bytes {
    static EVENT: LazyLock<Bytes> = LazyLock::new(|| {
        let body = GatewayError::UpstreamStreamError.body();
        let mut event = Vec::with_capacity(body.len() + 26);
        event.extend_from_slice(b"\n\nevent: error\ndata: ");
        event.extend_from_slice(&body);
        event.extend_from_slice(b"\n\n");
        Bytes::from(event)
    });
    EVENT.clone()
}

/// `error` and its causes, `outer: inner: innermost`, for log lines (hyper's errors keep the
/// interesting part, such as "connection refused", in their sources).
pub fn display_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The complete raw HTTP/1.1 answer to a connection over `max_connections`: such a connection is
/// never handed to hyper, so the answer is written as bytes and the connection closed.
pub fn over_capacity_response() -> Bytes {
    let error = GatewayError::TooManyConnections;
    let body = error.body();
    let status = error.status();
    let mut response = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n{ERROR_CODE_HEADER_NAME}: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        error.smg_error_code(),
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    Bytes::from(response)
}

mod classification;
mod smg;
#[cfg(test)]
mod tests;
