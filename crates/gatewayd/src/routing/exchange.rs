//! One client request from its first byte to its last: the request's record (id, method, path,
//! start time, status, outcome, timings) and, once it is routed, its hold on a worker (the load
//! guard). Dropping the exchange ends the request, and that is the one place every request —
//! served, refused before routing (413), refused by routing (503) or failed upstream (502, 504) —
//! is logged, counted by status class and observed in `bch_request_duration_seconds`, exactly
//! once.
//!
//! Every request has an id: the client's own `x-request-id` when it sent a usable one, else one
//! made here (a per-process random prefix and a counter). It goes to the worker, back to the
//! client and into the log line, so one request can be followed through all three.
//!
//! Both front ends use it: the data plane keeps the exchange in the response body, the endpoint
//! picker in the state of the request's ext_proc stream.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use bch_core::decide::Decision;
use bch_core::load::{LoadGuard, StatusClass};
use bch_core::policy::Branch;
use bch_core::router::RoutingTable;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, StatusCode};

use super::handle::Routing;
use crate::error::{ClientBodyFault, GatewayError, Source};
use crate::telemetry::keys::KeyTag;

/// The `tracing` target of the access log, one `request` line per request: what a log filter
/// names to keep or mute it (the demo keeps it at `warn`, so its banner stays readable).
pub const ACCESS_LOG: &str = "bch::access";

/// `x-request-id`: the request's id, kept from the client or made by the gateway, forwarded to
/// the worker and returned to the client.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-sent request id kept, bytes; a longer one (or one that is not visible ASCII) is
/// replaced by the gateway's own.
const MAX_CLIENT_ID: usize = 128;

static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

/// 8 hex digits, random per process, so ids of two replicas or two runs do not collide.
/// The per-process part of the gateway's ids: `xxxxxxxx-xxxx-4xxx-`, 60 random bits in the shape
/// of a version-4 UUID. Ids are UUID-shaped because workers may insist: llama-cpp-python's server
/// answers 400 to any `x-request-id` that does not parse as a UUID.
static ID_PREFIX: LazyLock<[u8; 19]> = LazyLock::new(|| {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mut prefix = *b"00000000-0000-4000-";
    let digits = [0..8, 9..13, 15..18].into_iter().flatten();
    for (i, at) in digits.enumerate() {
        prefix[at] = HEX[((random >> (4 * i)) & 0xf) as usize];
    }
    prefix
});

const HEX: &[u8; 16] = b"0123456789abcdef";

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
    /// The client's id, or ours once something needed it as a header value.
    request_id: Option<HeaderValue>,
    /// The number of the id this gateway made (0: the client's id is used). Rendered only when
    /// the id is needed: the picker only logs it, and a log line writes it from a stack buffer.
    our_id: u64,
    method: Method,
    path: Option<PathAndQuery>,
    /// HTTP status sent to the client, once known.
    status: Option<StatusCode>,
    errored: bool,
    /// What the client's body did wrong, when the request failed by the client's fault.
    client_fault: Option<ClientBodyFault>,
    branch: Option<Branch>,
    /// The table the request was routed on and the worker it holds, once routed.
    routed: Option<(Arc<RoutingTable>, usize)>,
    /// The worker a failed connect moved the request away from.
    retried_from: Option<usize>,
    guard: Option<LoadGuard>,
    key: Option<KeyTag>,
    /// When the worker's response head arrived.
    headers_after: Option<Duration>,
    /// When the first byte of the response body arrived.
    first_byte_after: Option<Duration>,
}

impl Exchange {
    /// A request that just arrived: its id, method and path are taken from `head`.
    pub fn begin(routing: Arc<Routing>, started: Instant, head: Head) -> Self {
        let Head {
            method,
            path,
            client_id,
        } = head;
        let client_id = client_id.filter(usable_id);
        Self {
            routing,
            started,
            our_id: match client_id {
                Some(_) => 0,
                None => REQUEST_IDS.fetch_add(1, Ordering::Relaxed),
            },
            request_id: client_id,
            method,
            path,
            status: None,
            errored: false,
            client_fault: None,
            branch: None,
            routed: None,
            retried_from: None,
            guard: None,
            key: None,
            headers_after: None,
            first_byte_after: None,
        }
    }

    /// Puts the request id on the request for the worker: the gateway's own, or the client's
    /// (replacing one the gateway found unusable).
    pub fn forward_id(&mut self, headers: &mut HeaderMap) {
        if self.our_id != 0 {
            let id = self.request_id().clone();
            headers.insert(REQUEST_ID_HEADER, id);
        }
    }

    /// The request id, for the response to the client.
    pub fn request_id(&mut self) -> &HeaderValue {
        let our_id = self.our_id;
        self.request_id.get_or_insert_with(|| {
            let mut buf = [0u8; ID_LEN];
            let len = render_id(our_id, &mut buf);
            HeaderValue::from_bytes(&buf[..len])
                .expect("hex digits and a dash are a valid header value")
        })
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
            self.retried_from = Some(*held);
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

    /// The request is answered with the gateway's refusal `error`: its status, and when the
    /// client's body was at fault, `bch_client_body_errors_total` and the log line's
    /// `client_fault` (never the worker's error count). The one place both front ends account a
    /// refused or failed request; a worker's failure was counted where it happened
    /// ([`Exchange::record_error`]).
    pub fn fail(&mut self, error: &GatewayError) {
        self.status = Some(error.status());
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

/// A client's id is kept when it is visible ASCII of at most [`MAX_CLIENT_ID`] bytes.
fn usable_id(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_CLIENT_ID && bytes.iter().all(|b| b.is_ascii_graphic())
}

/// `{8 random hex digits}-{counter in hex}`: unique within a process, and across processes with
/// near certainty. Written into a stack buffer (no formatting machinery, one allocation for the
/// header value): this runs for every request.
/// Length of an id this gateway makes: a UUID's 36 characters.
const ID_LEN: usize = 36;

/// Writes the id numbered `n` into `id`: the process's prefix, the UUID variant digit `8`, then
/// the low 60 bits of `n` in 15 hex digits (`…-8nnn-nnnnnnnnnnnn`); answers its length.
fn render_id(n: u64, id: &mut [u8; ID_LEN]) -> usize {
    id[..19].copy_from_slice(&*ID_PREFIX);
    id[19] = b'8';
    id[23] = b'-';
    let digits = (20..23).chain(24..36);
    for (i, at) in digits.enumerate() {
        id[at] = HEX[((n >> (4 * (14 - i))) & 0xf) as usize];
    }
    ID_LEN
}

#[cfg(test)]
fn new_request_id() -> HeaderValue {
    let mut buf = [0u8; ID_LEN];
    let len = render_id(REQUEST_IDS.fetch_add(1, Ordering::Relaxed), &mut buf);
    HeaderValue::from_bytes(&buf[..len]).expect("a valid header value")
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
        self.release_worker();
        let elapsed = self.started.elapsed();
        let seconds = elapsed.as_secs_f64();
        self.routing.metrics.request_duration.observe(seconds);
        let class = self
            .status
            .map_or(StatusClass::None, |s| StatusClass::of(s.as_u16()));
        match &self.routed {
            Some((table, worker)) => table.workers()[*worker]
                .stats
                .record_response(class, seconds),
            None => self.routing.metrics.record_unrouted_response(class),
        }
        let worker = self.routed.as_ref().map_or("-", |(table, worker)| {
            table.workers()[*worker].spec.name.as_str()
        });
        let retried_from = match (&self.routed, self.retried_from) {
            (Some((table, _)), Some(from)) => table.workers()[from].spec.name.as_str(),
            _ => "-",
        };
        let mut buf = [0u8; ID_LEN];
        let id_text = match &self.request_id {
            Some(id) => id.to_str().unwrap_or("-"),
            None => {
                let len = render_id(self.our_id, &mut buf);
                std::str::from_utf8(&buf[..len]).unwrap_or("-")
            }
        };
        tracing::info!(
            target: ACCESS_LOG,
            request_id = id_text,
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
            error = self.errored,
            client_fault = %self.client_fault.map_or("-", ClientBodyFault::as_str),
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_version_4_uuids_numbered_per_process() {
        let (a, b) = (new_request_id(), new_request_id());
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        let groups: Vec<&str> = a.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups.concat().bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(groups[2].starts_with('4'), "version 4: {a}");
        assert!(groups[3].starts_with('8'), "RFC 4122 variant: {a}");
        assert_eq!(a[..20], b[..20], "one prefix per process");
        let counter = |id: &str| u64::from_str_radix(&id[20..].replace('-', ""), 16).unwrap();
        assert_eq!(counter(b), counter(a) + 1);
    }

    #[test]
    fn the_counter_fills_its_fifteen_digits() {
        let mut buf = [0u8; ID_LEN];
        render_id(0x0123_4567_89ab_cdef, &mut buf);
        assert_eq!(&buf[19..], b"8123-456789abcdef");
        render_id(1, &mut buf);
        assert_eq!(&buf[19..], b"8000-000000000001");
    }
}
