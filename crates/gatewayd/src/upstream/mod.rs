//! Connections to workers: per-worker pools of HTTP/1.1 keep-alive connections, each driven by
//! the task of the request that uses it, speaking HTTP/1.1 through the gateway's own small
//! exchange instead of a hyper client connection.
//!
//! hyper-util's pooled client ran every upstream connection in a task of its own and handed each
//! response frame to the client's task through a one-slot channel (a wake-up each way per SSE
//! event); a hyper `client::conn::http1` connection polled by the request's task removed the
//! tasks, but its chunked decoder still read size lines a byte at a time, split a `Bytes` per
//! chunk and passed each through its body channel: about a quarter of an SSE stream's
//! instructions (docs/benchmarks.md). Now [`Upstreams::send`] writes the request itself
//! ([`exchange`]: hyper's head and framing rules, the body streamed) and parses the response
//! head with `httparse` under hyper's limits, and the response body ([`ResponseBody`], in
//! [`relay`]) is read straight from the socket by the proxy's response body: what one read
//! returned is one frame, a chunked body validated in place by [`crate::chunked`] (and, for an
//! HTTP/1.1 client, kept in its chunk framing for the client's connection to write as it is). A held stream costs
//! its socket, its small parser state and nothing else: no task, channel, or read buffer between
//! reads.
//!
//! Every response from a worker takes this path, and no hyper client path is kept beside it: the
//! gateway alters only response heads (and appends `event: error` after a broken event stream's
//! last data, which a relay can do), `1xx` heads are skipped as hyper skipped them, HTTP/1.0
//! responses are relayed by length or up to the close, and a `101` is refused as an invalid
//! response (a request to a worker never asks for an upgrade: `Upgrade` and `Connection` are
//! hop-by-hop).
//!
//! A connection goes back to its worker's pool only when its request was written in full, its
//! response ended cleanly with nothing after it, and the worker allows reuse (HTTP/1.1 without
//! `Connection: close`, or HTTP/1.0 with `keep-alive`, as hyper decided); anything else closes
//! it. Idle connections are checked when taken (one the worker closed, or that holds stray
//! bytes, is dropped), retired after `upstream_idle_timeout_ms` (default
//! [`crate::config::server::DEFAULT_UPSTREAM_IDLE_TIMEOUT`], below the workers' own idle timeout) and
//! are capped at [`pool::MAX_IDLE_PER_WORKER`] per worker.
//!
//! What the proxy needs to reach a worker — its parsed URL, the `Host` and `x-bch-worker` header
//! values, its pool — is an [`Endpoint`], built when the worker joins the membership (the admin
//! owner [publishes](Upstreams::publish) endpoints before it changes the router) and looked up by
//! URL once per membership generation, never per request.

pub mod body;
pub mod exchange;
pub mod pool;
pub mod relay;
pub mod tls;

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use arc_swap::ArcSwap;
use bch_core::generation_cache::{GenerationCache, PerGeneration};
use bch_core::router::{RoutingTable, WorkerSpec};
use bytes::BytesMut;
use http::header::HeaderValue;
use http::{Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls_pki_types::ServerName;

pub use body::{BoxError, ClientBodyError, UpstreamBody, client_fault};
pub use exchange::ExchangeError;
pub use pool::{UpstreamConnection, WorkerPool};
pub use relay::{RelayError, ResponseBody};
pub use tls::{TlsProblem, WorkerTls, tls_problem};

use crate::config::{Member, WorkerUrl};
use crate::per_worker::WorkerKey;
use exchange::WriteError;

/// Why a request could not be sent to a worker.
pub enum SendError {
    /// Nothing of the request reached the worker: the TCP connect or the TLS handshake failed, or a
    /// new connection closed
    /// before the request was written. The request comes back untouched, so it can go to another
    /// worker.
    NotSent {
        /// What failed.
        error: BoxError,
        /// The request, body unread.
        request: Box<Request<UpstreamBody>>,
    },
    /// The request was (at least partly) written and the exchange failed before a response head.
    Failed(ExchangeError),
}

/// One worker as the proxy reaches it: everything derived from its name and URL, built once when
/// it joins the membership, and its pool of keep-alive connections, which lives as long as some
/// membership generation still names the worker's URL.
pub struct Endpoint {
    /// The worker's name.
    pub name: String,
    /// The worker's URL, parsed.
    pub url: WorkerUrl,
    /// `Host` for requests to this worker (`None` if the authority is no valid header value).
    pub host_header: Option<HeaderValue>,
    /// `x-bch-worker` for responses from this worker (`None` if the name is no valid header value).
    pub worker_header: Option<HeaderValue>,
    /// `x-smg-routed-worker-id` for responses from this worker: its URL as configured, the way SMG
    /// names a worker (`None` if it is no valid header value, which a parsed URL cannot be).
    pub routed_worker_header: Option<HeaderValue>,
    /// `http://host:port/` (or `https://`), what a new connection is opened to.
    connect_uri: Uri,
    /// For an `https://` worker, the name its certificate is checked against.
    server_name: Option<ServerName<'static>>,
    pool: Arc<WorkerPool>,
}

impl Endpoint {
    fn new(
        spec: &WorkerSpec,
        url: WorkerUrl,
        server_name: Option<ServerName<'static>>,
        pool: Arc<WorkerPool>,
    ) -> Self {
        let connect_uri = Uri::builder()
            .scheme(url.scheme.clone())
            .authority(url.authority.clone())
            .path_and_query("/")
            .build()
            .expect("scheme and authority come from a parsed URI");
        Self {
            name: spec.name.clone(),
            host_header: HeaderValue::from_str(url.authority.as_str()).ok(),
            worker_header: HeaderValue::from_str(&spec.name).ok(),
            routed_worker_header: HeaderValue::from_str(&spec.url).ok(),
            url,
            connect_uri,
            server_name,
            pool,
        }
    }
}

/// The [`Endpoint`]s of one membership generation, indexed like the table's workers.
pub struct UpstreamTargets {
    generation: u64,
    targets: Vec<Option<Arc<Endpoint>>>,
}

impl PerGeneration for UpstreamTargets {
    fn generation(&self) -> u64 {
        self.generation
    }
}

impl UpstreamTargets {
    /// The endpoint of worker `worker`; `None` only for a worker that left the membership, with an
    /// unparseable URL, before its first request could be sent.
    pub fn get(&self, worker: usize) -> Option<&Endpoint> {
        self.targets.get(worker)?.as_deref()
    }
}

/// The way to workers: the published endpoints by worker, the per-generation targets built from
/// them (read without a lock, through `ArcSwap`s) and how to open new connections.
pub struct Upstreams {
    endpoints: ArcSwap<HashMap<WorkerKey, Arc<Endpoint>>>,
    current: GenerationCache<UpstreamTargets>,
    connector: HttpConnector,
    /// TLS toward `https://` workers; `http://` workers never touch it.
    tls: Arc<WorkerTls>,
    /// The TLS handshake's own limit, after the TCP connect's: `connect_timeout` again.
    handshake_timeout: Duration,
    idle_timeout: Duration,
}

impl Upstreams {
    /// Connections time out after `connect_timeout` (and an https worker's TLS handshake after
    /// as long again), use `TCP_NODELAY` (an SSE event must not wait for a delayed ACK) and are
    /// retired after `idle_timeout` unused in a pool; `tls` is the way to `https://` workers.
    pub fn new(connect_timeout: Duration, idle_timeout: Duration, tls: Arc<WorkerTls>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        // https URIs too: the TLS session is layered on the TCP stream by `WorkerTls::connect`.
        connector.enforce_http(false);
        Self {
            endpoints: ArcSwap::from_pointee(HashMap::new()),
            current: GenerationCache::default(),
            connector,
            tls,
            handshake_timeout: connect_timeout,
            idle_timeout,
        }
    }

    /// TLS toward `https://` workers, shared with the prober and the scraper; a reload replaces
    /// its configuration.
    pub fn tls(&self) -> &Arc<WorkerTls> {
        &self.tls
    }

    /// Makes `members` the published endpoints. Called by the admin owner before the router sees a
    /// new membership, so every routing table a request can load finds its workers here. A worker
    /// whose URL stays keeps its pool (also across a rename); a worker that left is dropped here,
    /// and its pool closes once no cached generation names it any more.
    pub fn publish(&self, members: &[Member]) {
        let previous = self.endpoints.load();
        let endpoints = members
            .iter()
            .map(|member| {
                let spec = &member.spec;
                let key = WorkerKey::of(spec);
                let endpoint = match previous.get(&key) {
                    Some(old)
                        if old.name == spec.name
                            && old.routed_worker_header.as_ref().map(HeaderValue::as_bytes)
                                == Some(spec.url.as_bytes())
                            && old.url == member.url
                            && old.server_name == member.server_name =>
                    {
                        Arc::clone(old)
                    }
                    Some(old) => Arc::new(Endpoint::new(
                        spec,
                        member.url.clone(),
                        member.server_name.clone(),
                        Arc::clone(&old.pool),
                    )),
                    None => Arc::new(Endpoint::new(
                        spec,
                        member.url.clone(),
                        member.server_name.clone(),
                        Arc::new(WorkerPool::new(self.idle_timeout)),
                    )),
                };
                (key, endpoint)
            })
            .collect();
        self.endpoints.store(Arc::new(endpoints));
    }

    /// The targets for `table`'s membership generation. A request that sees a newer generation
    /// than the cached one builds and stores it; one holding an older table gets a private copy.
    pub fn for_table(&self, table: &RoutingTable) -> Arc<UpstreamTargets> {
        self.current.for_table(table, |table| self.build(table))
    }

    fn build(&self, table: &RoutingTable) -> UpstreamTargets {
        let endpoints = self.endpoints.load();
        UpstreamTargets {
            generation: table.membership_generation(),
            targets: table
                .workers()
                .iter()
                .map(|w| {
                    // Queried by the URL a `WorkerKey` is made of: no key built per worker.
                    endpoints
                        .get(w.spec.url.as_str())
                        .map(Arc::clone)
                        .or_else(|| departed_endpoint(&w.spec, self.idle_timeout))
                })
                .collect(),
        }
    }

    /// Closes idle connections past the idle timeout in every current worker's pool; called
    /// periodically so a worker that gets no traffic does not keep sockets open forever.
    pub fn sweep(&self) {
        if let Some(current) = self.current.current() {
            for target in current.targets.iter().flatten() {
                target.pool.sweep();
            }
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) to `target` on an idle pooled connection or a
    /// new one, and waits for the response head. The response's body reads the rest from the
    /// connection (and writes the rest of the request, if the worker answered early); its end
    /// gives the connection back to the pool.
    ///
    /// A pooled connection that fails the request's first write is replaced by another (the
    /// request, untouched, is sent again); the caller decides about other workers on
    /// [`SendError::NotSent`].
    pub async fn send(
        &self,
        target: &Endpoint,
        mut request: Request<UpstreamBody>,
    ) -> Result<Response<ResponseBody>, SendError> {
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
            let method = request.method().clone();
            connection.writer = Some(Box::new(exchange::RequestWriter::new(request)));
            let mut head = BytesMut::new();
            let result = poll_fn(|cx| {
                if let Some(writer) = &mut connection.writer {
                    match writer.poll_write(cx, &mut connection.io) {
                        Poll::Pending => {}
                        Poll::Ready(Ok(())) => connection.writer = None,
                        Poll::Ready(Err(WriteError::Body(error))) => {
                            return Poll::Ready(Err(Failure::Exchange(ExchangeError::Body(error))));
                        }
                        Poll::Ready(Err(WriteError::Io(error))) => {
                            return Poll::Ready(Err(Failure::Write(error)));
                        }
                    }
                }
                exchange::poll_head(cx, &mut connection.io, &mut head, &method)
                    .map_err(Failure::Exchange)
            })
            .await;
            let error = match result {
                Ok(parsed) => {
                    let exchange::ParsedHead {
                        response,
                        framing,
                        keep_alive,
                        rest,
                    } = parsed;
                    let body = ResponseBody::new(connection, framing, keep_alive, rest);
                    return Ok(response.map(|()| body));
                }
                Err(Failure::Exchange(error)) => return Err(SendError::Failed(error)),
                Err(Failure::Write(error)) => error,
            };
            let writer = connection.writer.take().expect("a write failed");
            match writer.give_back() {
                Some(back) if pooled => request = back,
                Some(back) => {
                    return Err(SendError::NotSent {
                        error: error.into(),
                        request: Box::new(back),
                    });
                }
                None => return Err(SendError::Failed(ExchangeError::Write(error))),
            }
        }
    }

    async fn connect(&self, target: &Endpoint) -> Result<UpstreamConnection, BoxError> {
        let io = self
            .tls
            .connect(
                &self.connector,
                &target.connect_uri,
                target.server_name.as_ref(),
                self.handshake_timeout,
            )
            .await?;
        Ok(UpstreamConnection {
            io,
            writer: None,
            reusable: true,
            pool: Arc::downgrade(&target.pool),
        })
    }
}

/// How waiting for a response head ended badly: a write that failed (which may leave the request
/// whole, to be sent elsewhere) or anything else.
enum Failure {
    Write(std::io::Error),
    Exchange(ExchangeError),
}

/// The endpoint of a worker the admin owner removed between a request's routing decision and its
/// first look at the targets (the two are microseconds apart, so this is rare): the request was
/// routed while the worker was a member, so it is still served, on a connection of its own. The URL
/// was validated when the worker joined; should it not parse, the request gets a 502. An https
/// worker's certificate is checked against its URL's host (its `server_name` left with it).
fn departed_endpoint(spec: &WorkerSpec, idle_timeout: Duration) -> Option<Arc<Endpoint>> {
    let url = WorkerUrl::parse(&spec.url).ok()?;
    Some(Arc::new(Endpoint::new(
        spec,
        url,
        None,
        Arc::new(WorkerPool::new(idle_timeout)),
    )))
}
