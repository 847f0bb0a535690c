//! Connections to workers: per-worker pools of HTTP/1.1 keep-alive connections, each driven by
//! the task of the request that uses it.
//!
//! hyper-util's pooled client runs every upstream connection in a task of its own and hands each
//! response frame to the client's task through a one-slot channel, so every SSE event crossed
//! tasks twice (a wake-up each way). The issue 8 profile put that handoff at about 1.1 µs per
//! event, the largest remaining cost of streaming (docs/benchmarks.md). Here a connection is a
//! plain [`hyper::client::conn::http1`] connection that the request's own task polls: while it
//! waits for the response head ([`Upstreams::send`]) and then inside the response body
//! ([`UpstreamConnection::drive`], called by [`crate::proxy::ProxyBody`]). A response moves from
//! the worker's socket to the client's without leaving the task, and a held stream costs no
//! task, channel or pool bookkeeping beyond its two sockets' buffers.
//!
//! A connection goes back to its worker's pool only when its response ended cleanly and hyper
//! says it can take another request; anything else closes it. Idle connections are checked
//! when taken (a closed one is dropped), expire after [`IDLE_TIMEOUT`] and are capped at
//! [`MAX_IDLE_PER_WORKER`] per worker.

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bch_core::router::RoutingTable;
use bytes::Bytes;
use http::header::HeaderValue;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tower::ServiceExt;

use crate::config::WorkerUrl;

/// Boxed error type for bodies and connects.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long an idle connection may wait in a pool before it is closed (the same 90 s hyper-util's
/// client used; workers' own keep-alive timeouts are usually shorter, and a connection they closed
/// is noticed when taken).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per worker; beyond this a finished connection is closed. Sized for the
/// 1,024 concurrent requests a busy worker may see, so a burst's connections are reused by the next.
pub const MAX_IDLE_PER_WORKER: usize = 1024;

type UpstreamIo = TokioIo<tokio::net::TcpStream>;

/// Why a request could not be sent to a worker.
pub enum SendError {
    /// Nothing of the request reached the worker: the TCP connect failed, or a new connection closed
    /// before the request was written. The request comes back untouched, so it can go to another
    /// worker.
    NotSent {
        /// What failed.
        error: BoxError,
        /// The request, body unread.
        request: Box<Request<UpstreamBody>>,
    },
    /// The request was (at least partly) written and the exchange failed before a response head.
    Failed(hyper::Error),
}

/// One keep-alive HTTP/1.1 connection to a worker. It makes progress only while someone calls
/// [`drive`](Self::drive) (or awaits [`Upstreams::send`]); dropping it closes the socket, which is
/// how a cancelled request tells the worker to stop.
pub struct UpstreamConnection {
    sender: SendRequest<UpstreamBody>,
    /// `None` once hyper's connection future has finished (the socket is closed).
    connection: Option<Connection<UpstreamIo, UpstreamBody>>,
    /// Weak: the pool holds its idle connections, so a strong reference would keep a pool whose
    /// worker left the membership (and its sockets) alive forever. A connection that finishes
    /// after its pool is gone is closed.
    pool: Weak<WorkerPool>,
}

impl UpstreamConnection {
    /// Does the connection's pending I/O: writes the request, reads the response into its body
    /// channel. Registers `cx` for wake-ups from the socket.
    pub fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(connection) = &mut self.connection {
            if let Poll::Ready(result) = Pin::new(connection).poll(cx) {
                if let Err(error) = result {
                    tracing::debug!(%error, "worker connection ended with an error");
                }
                self.connection = None;
            }
        }
    }

    fn reusable(&self) -> bool {
        self.connection.is_some() && self.sender.is_ready()
    }

    /// Returns the connection to its worker's pool if it can take another request (the response
    /// was read to its end and the worker did not ask to close); otherwise closes it.
    pub fn release(mut self) {
        // One more turn lets hyper finish the exchange (mark the connection idle and ready). An
        // idle connection wakes nobody: whoever takes it next drives it with their own waker.
        self.drive(&mut Context::from_waker(Waker::noop()));
        if self.reusable() {
            if let Some(pool) = self.pool.upgrade() {
                pool.check_in(self);
            }
        }
    }
}

struct IdleConnection {
    connection: UpstreamConnection,
    since: Instant,
}

/// A worker's idle connections, most recently used last. The lock is held only to push or pop
/// (never across I/O or an await); closing expired connections happens after it is released.
#[derive(Default)]
pub struct WorkerPool {
    idle: Mutex<Vec<IdleConnection>>,
}

impl WorkerPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IdleConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used idle connection that is still open, if any.
    fn check_out(&self) -> Option<UpstreamConnection> {
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            let idle = self.lock().pop()?;
            if idle.since.elapsed() >= IDLE_TIMEOUT {
                // It was the newest, so every other one is older still. Closed after the lock
                // is released.
                let expired = std::mem::take(&mut *self.lock());
                drop(expired);
                return None;
            }
            let mut connection = idle.connection;
            // Reads a close (or stray bytes) the worker sent while the connection sat idle.
            connection.drive(&mut cx);
            if connection.reusable() {
                return Some(connection);
            }
        }
    }

    fn check_in(&self, connection: UpstreamConnection) {
        let now = Instant::now();
        let (expired, refused) = {
            let mut idle = self.lock();
            let expired = take_expired(&mut idle, now);
            if idle.len() < MAX_IDLE_PER_WORKER {
                idle.push(IdleConnection {
                    connection,
                    since: now,
                });
                (expired, None)
            } else {
                (expired, Some(connection))
            }
        };
        drop((expired, refused));
    }

    /// Closes connections idle for longer than [`IDLE_TIMEOUT`].
    fn sweep(&self) {
        let expired = take_expired(&mut self.lock(), Instant::now());
        drop(expired);
    }

    /// Idle connections right now.
    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }
}

/// Removes the connections idle for [`IDLE_TIMEOUT`] or longer (a prefix: the vector is in
/// check-in order) and returns them, to be closed once the lock is released.
fn take_expired(idle: &mut Vec<IdleConnection>, now: Instant) -> Vec<IdleConnection> {
    let fresh_from = idle.partition_point(|c| now.duration_since(c.since) >= IDLE_TIMEOUT);
    if fresh_from == 0 {
        Vec::new()
    } else {
        idle.drain(..fresh_from).collect()
    }
}

/// What the proxy needs to reach one worker, derived once per routing-table membership
/// generation instead of once per request: the parsed URL, the `Host` header, the `x-bch-worker`
/// response header and the worker's connection pool (which outlives generations while the
/// worker's URL stays the same).
pub struct UpstreamTarget {
    /// The worker's name.
    pub name: String,
    url_text: String,
    /// The parsed URL, or why it does not parse.
    pub url: Result<WorkerUrl, String>,
    /// `Host` for requests to this worker.
    pub host_header: Option<HeaderValue>,
    /// `x-bch-worker` for responses from this worker.
    pub worker_header: Option<HeaderValue>,
    pool: Arc<WorkerPool>,
}

impl UpstreamTarget {
    fn new(spec: &bch_core::router::WorkerSpec, previous: Option<&UpstreamTargets>) -> Self {
        let url = WorkerUrl::parse(&spec.url);
        let host_header = url
            .as_ref()
            .ok()
            .and_then(|u| HeaderValue::from_str(u.authority.as_str()).ok());
        let pool = previous
            .and_then(|p| p.targets.iter().find(|t| t.url_text == spec.url))
            .map_or_else(Arc::default, |t| Arc::clone(&t.pool));
        Self {
            name: spec.name.clone(),
            url_text: spec.url.clone(),
            url,
            host_header,
            worker_header: HeaderValue::from_str(&spec.name).ok(),
            pool,
        }
    }

    /// The worker's idle connection pool.
    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }
}

/// The [`UpstreamTarget`]s of one membership generation, indexed like the table's workers.
pub struct UpstreamTargets {
    generation: u64,
    targets: Vec<UpstreamTarget>,
}

impl std::ops::Index<usize> for UpstreamTargets {
    type Output = UpstreamTarget;

    fn index(&self, worker: usize) -> &UpstreamTarget {
        &self.targets[worker]
    }
}

impl UpstreamTargets {
    fn build(table: &RoutingTable, previous: Option<&UpstreamTargets>) -> Self {
        Self {
            generation: table.membership_generation(),
            targets: table
                .workers()
                .iter()
                .map(|w| UpstreamTarget::new(&w.spec, previous))
                .collect(),
        }
    }
}

/// The way to workers: per-generation [`UpstreamTarget`]s (read without a lock, through an
/// `ArcSwap`) and how to open new connections.
pub struct Upstreams {
    current: ArcSwapOption<UpstreamTargets>,
    connector: HttpConnector,
    http1: http1::Builder,
}

impl Upstreams {
    /// Connections time out after `connect_timeout` and use `TCP_NODELAY` (an SSE event must not
    /// wait for a delayed ACK).
    pub fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        Self {
            current: ArcSwapOption::empty(),
            connector,
            http1: http1::Builder::new(),
        }
    }

    /// The targets for `table`'s membership generation. A request that sees a newer generation
    /// than the cached one builds and stores it; one holding an older table gets a private copy.
    pub fn for_table(&self, table: &RoutingTable) -> Arc<UpstreamTargets> {
        let generation = table.membership_generation();
        let cached = self.current.load_full();
        if let Some(cached) = &cached {
            if cached.generation == generation {
                return Arc::clone(cached);
            }
            if cached.generation > generation {
                return Arc::new(UpstreamTargets::build(table, Some(cached)));
            }
        }
        let built = Arc::new(UpstreamTargets::build(table, cached.as_deref()));
        self.current.store(Some(Arc::clone(&built)));
        built
    }

    /// Closes idle connections past [`IDLE_TIMEOUT`] in every current worker's pool; called
    /// periodically so a worker that gets no traffic does not keep sockets open forever.
    pub fn sweep(&self) {
        if let Some(current) = self.current.load_full() {
            for target in &current.targets {
                target.pool.sweep();
            }
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) to `target` on an idle pooled connection or a
    /// new one, and waits for the response head. On success the connection comes back with the
    /// response: the caller must keep [driving](UpstreamConnection::drive) it while it reads the
    /// body, then [release](UpstreamConnection::release) it.
    ///
    /// A pooled connection the worker closed while the request was on its way is replaced by
    /// another (the request comes back untouched from hyper); the caller decides about other
    /// workers on [`SendError::NotSent`].
    pub async fn send(
        &self,
        target: &UpstreamTarget,
        mut request: Request<UpstreamBody>,
    ) -> Result<(Response<Incoming>, UpstreamConnection), SendError> {
        loop {
            let (mut connection, pooled) = match target.pool.check_out() {
                Some(connection) => (connection, true),
                None => match self.connect(target).await {
                    Ok(connection) => (connection, false),
                    Err(error) => {
                        return Err(SendError::NotSent {
                            error,
                            request: Box::new(request),
                        });
                    }
                },
            };
            let mut response = pin!(connection.sender.try_send_request(request));
            let result = poll_fn(|cx| {
                connection.drive(cx);
                response.as_mut().poll(cx)
            })
            .await;
            match result {
                Ok(response) => return Ok((response, connection)),
                Err(mut error) => match error.take_message() {
                    Some(back) if pooled => request = back,
                    Some(back) => {
                        return Err(SendError::NotSent {
                            error: error.into_error().into(),
                            request: Box::new(back),
                        });
                    }
                    None => return Err(SendError::Failed(error.into_error())),
                },
            }
        }
    }

    async fn connect(&self, target: &UpstreamTarget) -> Result<UpstreamConnection, BoxError> {
        let url = target.url.as_ref().map_err(|e| BoxError::from(e.clone()))?;
        let uri = Uri::builder()
            .scheme(url.scheme.clone())
            .authority(url.authority.clone())
            .path_and_query("/")
            .build()?;
        let io = self.connector.clone().oneshot(uri).await?;
        let (sender, connection) = self.http1.handshake(io).await?;
        Ok(UpstreamConnection {
            sender,
            connection: Some(connection),
            pool: Arc::downgrade(&target.pool),
        })
    }
}

/// The request body on its way to a worker: the client's body, cut off with an error once it
/// passes `max_body_bytes` (for bodies without a `Content-Length`, which is checked up front).
pub struct UpstreamBody {
    inner: Incoming,
    remaining: u64,
}

/// The error a request body over the limit ends with; see [`is_body_too_large`].
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the configured limit")]
pub struct BodyTooLarge;

impl UpstreamBody {
    /// `inner`, allowed `max_bytes` bytes.
    pub fn new(inner: Incoming, max_bytes: u64) -> Self {
        Self {
            inner,
            remaining: max_bytes,
        }
    }

    /// The client's body back (for a retry on another worker).
    pub fn into_inner(self) -> Incoming {
        self.inner
    }
}

/// Whether `error` (or one of its causes) is [`BodyTooLarge`].
pub fn is_body_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<BodyTooLarge>() {
            return true;
        }
        cause = error.source();
    }
    false
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.remaining {
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
                    }
                    this.remaining -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => Poll::Ready(Some(Err(Box::new(error)))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
