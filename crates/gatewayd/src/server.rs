//! Accept loops: HTTP/1.1 connections served with a header read timeout, an optional
//! connection cap, a bound on clients that stop reading ([`WriteStallGuard`]), TLS when the
//! listener has it (the handshake runs in the connection's task, after the cap's permit is
//! taken), and graceful shutdown. They know nothing of what they serve: the composition root
//! hands each loop a service.
//!
//! The data plane's connections are served by its own HTTP/1 server ([`crate::http1`]), which
//! relays a worker's chunked body as it came and holds no buffer on a held stream; the control
//! plane's by hyper directly rather than `axum::serve`. Both need a header read timeout
//! (slow-loris protection) and to drain in-flight requests on shutdown; the data plane also a
//! connection cap with a clean 503.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::display_chain;
use crate::http1::{ChunkFramed, ConnectionOptions, RequestBody};
use crate::tls::accept::TlsAcceptance;

/// How a listener serves its connections.
#[derive(Clone)]
pub struct Listening {
    /// Time a client has to send its request headers.
    pub header_read_timeout: Duration,
    /// Cancelled on shutdown: stop accepting, let open connections finish their requests.
    pub shutdown: CancellationToken,
    /// Every connection task, so shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Which plane, for log lines.
    pub plane: &'static str,
    /// The listener's TLS; `None` = plain HTTP.
    pub tls: Option<TlsAcceptance>,
}

/// Whether a connection was failed because its client stopped reading its response for longer
/// than `client_stall_timeout_ms` ([`WriteStallGuard`]). A capped listener gives each connection's
/// service its connection's flag (no request extension, which would cost every request a map and
/// two allocations), and the service gives it to each request's exchange: the response a stall cut
/// ends after the flag is set (the failed connection drops it), so it can be recorded as what it
/// is rather than as a completed one.
///
/// It also says when the gateway itself dropped the connection unfinished: the process stopping
/// with the connection still open once the shutdown grace expired. The responses it cuts then are
/// neither the client's doing nor complete.
#[derive(Debug, Clone, Default)]
pub struct ClientStall(Arc<AtomicU8>);

/// [`ClientStall`]'s states; the first one set stays.
const STALLED: u8 = 1;
const DROPPED_BY_GATEWAY: u8 = 2;

impl ClientStall {
    /// Whether the connection's client stalled and the connection was failed for it.
    pub fn stalled(&self) -> bool {
        self.0.load(Ordering::Relaxed) == STALLED
    }

    /// Whether the gateway dropped the connection before it ended (the shutdown grace expired).
    pub fn dropped_by_gateway(&self) -> bool {
        self.0.load(Ordering::Relaxed) == DROPPED_BY_GATEWAY
    }

    fn set(&self, state: u8) {
        let _ = self
            .0
            .compare_exchange(0, state, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Marks its connection [`ClientStall::dropped_by_gateway`] when dropped before
/// [`UnfinishedConnection::finished`]: its connection task was dropped mid-way, which only the
/// runtime stopping does.
struct UnfinishedConnection(Option<ClientStall>);

impl UnfinishedConnection {
    fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for UnfinishedConnection {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.set(DROPPED_BY_GATEWAY);
        }
    }
}

/// A cap on concurrent connections: a connection over it is answered `response` (complete raw
/// HTTP bytes) and closed, and `on_reject` is called (to count it); and how long a client may
/// leave its connection's writes blocked.
pub struct ConnectionCap {
    /// Most concurrent connections.
    pub max_connections: usize,
    /// Longest time a write to the client may stay blocked (the client does not read); then the
    /// connection fails, which ends whatever it was streaming.
    pub write_stall_timeout: Duration,
    /// The whole answer written to a refused connection.
    pub response: Bytes,
    /// Called once per refused connection.
    pub on_reject: Arc<dyn Fn() + Send + Sync>,
}

impl Listening {
    fn builder(&self) -> http1::Builder {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .keep_alive(true);
        builder
    }
}

/// Serves `listener` until shutdown with a service per connection from `make_service` (given the
/// client's address and the connection's [`ClientStall`] flag), capped by `cap`, with the data plane's own HTTP/1 server
/// ([`crate::http1`]). `TCP_NODELAY` is set: a streamed response must not wait for a delayed ACK.
pub async fn serve_capped<S, F, B>(
    listener: TcpListener,
    listening: Listening,
    cap: ConnectionCap,
    make_service: impl Fn(SocketAddr, ClientStall) -> S,
) where
    S: FnMut(Request<RequestBody>) -> F + Send + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + ChunkFramed + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(cap.max_connections));
    let options = ConnectionOptions {
        header_read_timeout: listening.header_read_timeout,
        shutdown: listening.shutdown.clone(),
    };
    while let Some((stream, peer)) = next_connection(&listener, &listening).await {
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            (cap.on_reject)();
            listening.tasks.spawn(refuse(stream, cap.response.clone()));
            continue;
        };
        let stall = ClientStall::default();
        // Every request's exchange sees its connection's stall flag: the one a stall cut says so.
        let service = make_service(peer, stall.clone());
        let unfinished = UnfinishedConnection(Some(stall.clone()));
        let guard = move |tcp| WriteStallGuard::new(tcp, cap.write_stall_timeout, stall);
        let (tls, options) = (listening.tls.clone(), options.clone());
        let task = async move {
            // The handshake holds the permit (it counts against the cap) but nothing routes
            // before a request arrives.
            let Some(stream) = handshake(tls, stream, guard).await else {
                unfinished.finished();
                drop(permit);
                return;
            };
            let connection = crate::http1::serve_connection(stream, service, options);
            tokio::pin!(connection);
            // Declared after the pinned connection, so dropped before it when the task is
            // dropped unfinished: the exchanges the connection holds see the flag as they end.
            let unfinished = unfinished;
            if let Err(error) = connection.as_mut().await {
                log_served_error(&error);
            }
            unfinished.finished();
            drop(permit);
        };
        listening.tasks.spawn(task);
    }
}

/// `tcp` as served: plain, or after a completed TLS handshake (`None` when it failed), wrapped
/// by `wrap` either way. The TLS session is boxed: inline, its ~1 KiB would make every plain
/// connection's stream that size too. So is the handshake's future while it runs: inline, the
/// connection task would keep a slot its size (several KiB) for the connection's whole life.
async fn handshake<IO>(
    tls: Option<TlsAcceptance>,
    tcp: TcpStream,
    wrap: impl FnOnce(TcpStream) -> IO,
) -> Option<Either<IO, Box<tokio_rustls::server::TlsStream<IO>>>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tls {
        None => Some(Either::Left(wrap(tcp))),
        Some(tls) => Box::pin(tls.handshake(tcp, wrap))
            .await
            .map(|tls| Either::Right(Box::new(tls))),
    }
}

/// Serves `listener` until shutdown, with HTTP upgrades (websockets) allowed; `make_service` is
/// given the client's address.
pub async fn serve_upgradable<S, B>(
    listener: TcpListener,
    listening: Listening,
    make_service: impl Fn(SocketAddr) -> S,
) where
    S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = listening.builder();
    while let Some((stream, peer)) = next_connection(&listener, &listening).await {
        let service = make_service(peer);
        let (shutdown, tls, builder) = (
            listening.shutdown.clone(),
            listening.tls.clone(),
            builder.clone(),
        );
        listening.tasks.spawn(async move {
            let Some(stream) = handshake(tls, stream, |tcp| tcp).await else {
                return;
            };
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => log_connection_error(result),
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    log_connection_error(connection.await);
                }
            }
        });
    }
}

/// A client connection whose writes fail once they have been blocked for longer than a limit.
///
/// Back-pressure is not idleness: a streamed response whose client stopped reading is never
/// silent on the worker's side, so no idle timeout ends it, and the worker keeps its batch slot
/// and KV cache for a reader that may never come back. Any write that makes progress resets the
/// clock; the timer is only armed once a write blocks.
pub struct WriteStallGuard {
    io: TcpStream,
    limit: Duration,
    /// Set when the limit passes.
    stall: ClientStall,
    /// Whether the last write attempt blocked (the timer runs since then).
    blocked: bool,
    timer: Option<Pin<Box<Sleep>>>,
}

impl WriteStallGuard {
    /// `io`, whose writes may stay blocked for at most `limit`; `stall` is set when that ends
    /// the connection.
    pub fn new(io: TcpStream, limit: Duration, stall: ClientStall) -> Self {
        Self {
            io,
            limit,
            stall,
            blocked: false,
            timer: None,
        }
    }

    /// After a write returned `Pending`: `Pending` until the limit passes, then the error that
    /// fails the connection.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if !self.blocked {
            self.blocked = true;
            let deadline = tokio::time::Instant::now() + self.limit;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        match self.timer.as_mut().map(|t| t.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => {
                self.stall.set(STALLED);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client stopped reading its response",
                )))
            }
            _ => Poll::Pending,
        }
    }

    /// A write's result: bytes written are progress (the clock stops); `Pending` starts or
    /// continues it.
    fn progressed(
        &mut self,
        result: Poll<io::Result<usize>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        match result {
            Poll::Pending => self.stalled(cx),
            ready => {
                self.blocked = false;
                ready
            }
        }
    }
}

impl AsyncRead for WriteStallGuard {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteStallGuard {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progressed(result, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progressed(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    // A flush or shutdown says nothing about whether the client reads (a TCP flush is always
    // done at once), so only writes move the stall clock.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Writes the over-capacity answer and closes; bounded, so a client that does not read cannot
/// keep the task.
async fn refuse(mut stream: TcpStream, response: Bytes) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(&response).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// The next accepted connection and its peer, or `None` once shutdown starts. Accept errors
/// (EMFILE and friends) are logged and retried after a short pause instead of spinning.
async fn next_connection(
    listener: &TcpListener,
    listening: &Listening,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = listening.shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => return Some(accepted),
                Err(error) => {
                    tracing::warn!(%error, plane = listening.plane, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

fn log_served_error(error: &crate::http1::ConnectionError) {
    if error.is_timeout() {
        tracing::debug!("client too slow to send its request headers; closed");
    } else {
        tracing::debug!(error = %display_chain(error), "connection ended with an error");
    }
}

fn log_connection_error(result: Result<(), hyper::Error>) {
    if let Err(error) = result {
        if error.is_timeout() {
            tracing::debug!("client too slow to send its request headers; closed");
        } else if !error.is_incomplete_message() && !error.is_canceled() {
            tracing::debug!(%error, "connection ended with an error");
        }
    }
}
