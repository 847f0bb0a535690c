//! Accept loops: HTTP/1.1 connections served by hyper with a header read timeout, an optional
//! connection cap, and graceful shutdown. They know nothing of what they serve: the composition
//! root hands each loop a service.
//!
//! Connections are served by hyper directly rather than `axum::serve` because the data plane needs
//! a connection cap with a clean 503 and a header read timeout (slow-loris protection), and both
//! planes need to drain in-flight requests on shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
}

/// A cap on concurrent connections: a connection over it is answered `response` (complete raw
/// HTTP bytes) and closed, and `on_reject` is called (to count it).
pub struct ConnectionCap {
    /// Most concurrent connections.
    pub max_connections: usize,
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

/// Serves `listener` until shutdown with a service per connection from `make_service`, capped by
/// `cap`. `TCP_NODELAY` is set: a streamed response must not wait for a delayed ACK.
pub async fn serve_capped<S, B>(
    listener: TcpListener,
    listening: Listening,
    cap: ConnectionCap,
    make_service: impl Fn() -> S,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(cap.max_connections));
    let builder = listening.builder();
    while let Some(stream) = next_connection(&listener, &listening).await {
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            (cap.on_reject)();
            listening.tasks.spawn(refuse(stream, cap.response.clone()));
            continue;
        };
        let connection = builder.serve_connection(TokioIo::new(stream), make_service());
        let shutdown = listening.shutdown.clone();
        listening.tasks.spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => log_connection_error(result),
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    log_connection_error(connection.await);
                }
            }
            drop(permit);
        });
    }
}

/// Serves `listener` until shutdown, with HTTP upgrades (websockets) allowed.
pub async fn serve_upgradable<S, B>(
    listener: TcpListener,
    listening: Listening,
    make_service: impl Fn() -> S,
) where
    S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = listening.builder();
    while let Some(stream) = next_connection(&listener, &listening).await {
        let connection = builder
            .serve_connection(TokioIo::new(stream), make_service())
            .with_upgrades();
        let shutdown = listening.shutdown.clone();
        listening.tasks.spawn(async move {
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

/// Writes the over-capacity answer and closes; bounded, so a client that does not read cannot
/// keep the task.
async fn refuse(mut stream: TcpStream, response: Bytes) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(&response).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// The next accepted connection, or `None` once shutdown starts. Accept errors (EMFILE and friends)
/// are logged and retried after a short pause instead of spinning.
async fn next_connection(listener: &TcpListener, listening: &Listening) -> Option<TcpStream> {
    loop {
        tokio::select! {
            _ = listening.shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => return Some(stream),
                Err(error) => {
                    tracing::warn!(%error, plane = listening.plane, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
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
