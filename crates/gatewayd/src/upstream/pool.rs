//! Per-worker pools of HTTP/1.1 keep-alive connections, each connection driven by the task of the
//! request that uses it (see the parent module for why).

use std::pin::Pin;
use std::sync::{Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;

use super::body::UpstreamBody;

/// Idle connections kept per worker; beyond this a finished connection is closed. Sized for the
/// 1,024 concurrent requests a busy worker may see, so a burst's connections are reused by the next.
pub const MAX_IDLE_PER_WORKER: usize = 1024;

/// The socket type of a worker connection: TCP, or TLS over TCP for an `https://` worker.
pub type UpstreamIo = TokioIo<super::tls::WorkerStream>;

/// One keep-alive HTTP/1.1 connection to a worker. It makes progress only while someone calls
/// [`drive`](Self::drive) (or awaits [`Upstreams::send`](super::Upstreams::send)); dropping it closes the socket, which is
/// how a cancelled request tells the worker to stop.
pub struct UpstreamConnection {
    pub(super) sender: SendRequest<UpstreamBody>,
    /// `None` once hyper's connection future has finished (the socket is closed).
    pub(super) connection: Option<Connection<UpstreamIo, UpstreamBody>>,
    /// Weak: the pool holds its idle connections, so a strong reference would keep a pool whose
    /// worker left the membership (and its sockets) alive forever. A connection that finishes
    /// after its pool is gone is closed.
    pub(super) pool: Weak<WorkerPool>,
}

impl UpstreamConnection {
    /// Does the connection's pending I/O: writes the request, reads the response into its body
    /// channel. Registers `cx` for wake-ups from the socket.
    pub fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(connection) = &mut self.connection
            && let Poll::Ready(result) = Pin::new(connection).poll(cx)
        {
            if let Err(error) = result {
                tracing::debug!(%error, "worker connection ended with an error");
            }
            self.connection = None;
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
        if self.reusable()
            && let Some(pool) = self.pool.upgrade()
        {
            pool.check_in(self);
        }
    }
}

struct IdleConnection {
    connection: UpstreamConnection,
    since: Instant,
}

/// A worker's idle connections, most recently used last. The lock is held only to push or pop
/// (never across I/O or an await); closing expired connections happens after it is released.
pub struct WorkerPool {
    idle: Mutex<Vec<IdleConnection>>,
    /// How long a connection may sit idle before it is closed instead of reused.
    idle_timeout: Duration,
}

impl WorkerPool {
    /// An empty pool whose connections are retired after `idle_timeout` unused.
    pub fn new(idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::default(),
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IdleConnection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used idle connection that is still open, if any.
    pub(super) fn check_out(&self) -> Option<UpstreamConnection> {
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            let idle = self.lock().pop()?;
            if idle.since.elapsed() >= self.idle_timeout {
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
            let expired = take_expired(&mut idle, now, self.idle_timeout);
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

    /// Closes connections idle for longer than the pool's idle timeout.
    pub(super) fn sweep(&self) {
        let expired = take_expired(&mut self.lock(), Instant::now(), self.idle_timeout);
        drop(expired);
    }
}

/// Removes the connections idle for `timeout` or longer (a prefix: the vector is in check-in
/// order) and returns them, to be closed once the lock is released.
fn take_expired(
    idle: &mut Vec<IdleConnection>,
    now: Instant,
    timeout: Duration,
) -> Vec<IdleConnection> {
    let fresh_from = idle.partition_point(|c| now.duration_since(c.since) >= timeout);
    if fresh_from == 0 {
        Vec::new()
    } else {
        idle.drain(..fresh_from).collect()
    }
}
