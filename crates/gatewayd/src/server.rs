//! Accept loops for both listeners: connection limit, header read timeout and graceful shutdown.
//!
//! Connections are served by hyper directly (HTTP/1.1) rather than `axum::serve` because the data
//! plane needs a connection cap with a clean 503 and a header read timeout (slow-loris protection),
//! and both planes need to drain in-flight requests on shutdown.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::gateway::Gateway;

/// Per-listener connection settings.
#[derive(Debug, Clone)]
pub struct Limits {
    max_connections: usize,
    header_read_timeout: Duration,
}

impl Limits {
    /// From `[server]`.
    pub fn from_config(config: &Config) -> Self {
        Self {
            max_connections: config.server.max_connections,
            header_read_timeout: Duration::from_millis(config.server.header_read_timeout_ms),
        }
    }
}

const OVER_CAPACITY_BODY: &str = r#"{"error":{"message":"gateway connection limit reached","type":"gateway_error","code":"too_many_connections"}}"#;

/// The whole 503 answer to a connection over `max_connections`, written raw: such a connection is
/// never handed to hyper, so it costs no task beyond this write.
fn over_capacity_response() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{}",
        OVER_CAPACITY_BODY.len(),
        OVER_CAPACITY_BODY
    )
}

fn http1_builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
}

/// Serves the data plane until shutdown.
pub async fn serve_data_plane(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    limits: Limits,
    tasks: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let builder = http1_builder(&limits);
    while let Some(stream) = next_connection(&listener, &gateway, "data").await {
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            gateway.metrics.record_rejected_connection();
            tasks.spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    let _ = stream.write_all(over_capacity_response().as_bytes()).await;
                    let _ = stream.shutdown().await;
                })
                .await;
            });
            continue;
        };
        let gateway = Arc::clone(&gateway);
        let builder = builder.clone();
        tasks.spawn(async move {
            let shutdown = gateway.shutdown.clone();
            let service =
                service_fn(move |request| crate::proxy::handle(Arc::clone(&gateway), request));
            let io = CoalescingIo::new(TokioIo::new(stream));
            let connection = builder.serve_connection(io, service);
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

/// Serves the control plane (axum router, with websocket upgrades) until shutdown.
pub async fn serve_control_plane(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    limits: Limits,
    tasks: TaskTracker,
) {
    let app = crate::control::router(Arc::clone(&gateway));
    let builder = http1_builder(&limits);
    while let Some(stream) = next_connection(&listener, &gateway, "control").await {
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let shutdown = gateway.shutdown.clone();
        tasks.spawn(async move {
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

/// The next accepted connection, or `None` once shutdown starts. Accept errors (EMFILE and friends)
/// are logged and retried after a short pause instead of spinning.
async fn next_connection(
    listener: &TcpListener,
    gateway: &Gateway,
    plane: &'static str,
) -> Option<tokio::net::TcpStream> {
    loop {
        tokio::select! {
            _ = gateway.shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => return Some(stream),
                Err(error) => {
                    tracing::warn!(%error, plane, "accept failed");
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

/// Bytes a [`CoalescingIo`] gathers before it writes regardless of what else is on its way.
const COALESCE_LIMIT: usize = 16 * 1024;
/// Largest buffer a connection keeps between flushes; a bigger one is freed once written, so an
/// idle connection (a held stream) does not sit on the memory of its largest burst.
const COALESCE_KEEP: usize = 2 * 1024;

/// Write coalescing for a data plane connection.
///
/// hyper writes and flushes every body frame as soon as the next one is not ready yet. A proxied
/// response's frames come from the upstream connection's task one at a time, so without help every
/// SSE event of a burst the worker sent in one segment becomes its own `writev` (and its own wake-up of
/// the client). Here writes are copied into a buffer and a flush first yields once to the scheduler:
/// if the other tasks produced more bytes for this connection meanwhile, it yields again, otherwise
/// (or at [`COALESCE_LIMIT`] bytes) it writes everything in one system call. What is already on its
/// way goes out together; nothing waits for data that has not arrived.
pub struct CoalescingIo<T> {
    inner: T,
    buf: Vec<u8>,
    written: usize,
    /// `buf.len()` when the last flush yielded; a flush that finds no more bytes than that writes.
    yielded_at: Option<usize>,
}

impl<T> CoalescingIo<T> {
    /// Wraps a connection.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            written: 0,
            yielded_at: None,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: hyper::rt::Write + Unpin> CoalescingIo<T> {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        if self.buf.capacity() > COALESCE_KEEP {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        self.written = 0;
        self.yielded_at = None;
        Poll::Ready(Ok(()))
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for CoalescingIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for CoalescingIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.buf.len() + data.len() > COALESCE_LIMIT {
            ready!(this.poll_drain(cx))?;
            if data.len() >= COALESCE_LIMIT {
                return Pin::new(&mut this.inner).poll_write(cx, data);
            }
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.buf.len() + total > COALESCE_LIMIT {
            ready!(this.poll_drain(cx))?;
            if total >= COALESCE_LIMIT {
                return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
            }
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.written < this.buf.len() {
            if this.yielded_at != Some(this.buf.len()) {
                // Let the tasks feeding this connection run first (the wake puts this task at the
                // back of the run queue), then write whatever they added in one go.
                this.yielded_at = Some(this.buf.len());
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            ready!(this.poll_drain(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_capacity_answer_is_well_formed_http() {
        let response = over_capacity_response();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "too_many_connections");
    }
}
