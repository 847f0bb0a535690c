//! Per-worker pools of HTTP/1.1 keep-alive connections, each connection driven by the task of the
//! request that uses it (see the parent module for why).

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, ReadBuf};

use super::exchange::{RequestWriter, WriteError};
use super::tls::WorkerStream;

/// Idle connections kept per worker; beyond this a finished connection is closed. Sized for the
/// 1,024 concurrent requests a busy worker may see, so a burst's connections are reused by the next.
pub const MAX_IDLE_PER_WORKER: usize = 1024;

/// One keep-alive HTTP/1.1 connection to a worker: its socket and, while a request is still
/// being written, the request. It makes progress only while its request's task polls it (in
/// [`Upstreams::send`](super::Upstreams::send), then in the response body); dropping it closes the
/// socket, which is how a cancelled request tells the worker to stop.
pub struct UpstreamConnection {
    pub(super) io: WorkerStream,
    /// The request still being written; `None` once it is all out (boxed: a held stream or an
    /// idle connection keeps only the pointer's room).
    pub(super) writer: Option<Box<RequestWriter>>,
    /// Cleared when something makes the connection unfit for another request (the request could
    /// not be written in full).
    pub(super) reusable: bool,
    /// Weak: the pool holds its idle connections, so a strong reference would keep a pool whose
    /// worker left the membership (and its sockets) alive forever. A connection that finishes
    /// after its pool is gone is closed.
    pub(super) pool: Weak<WorkerPool>,
}

impl UpstreamConnection {
    /// The socket, for the response body's reads.
    pub(super) fn io(&mut self) -> &mut WorkerStream {
        &mut self.io
    }

    /// Writes more of a request the worker answered before it was all sent. A request that
    /// cannot be finished (the client's body failed, the socket refused it) is given up and the
    /// connection will not be reused; the response goes on, the worker decides what it is worth.
    pub(super) fn keep_writing(&mut self, cx: &mut Context<'_>) {
        if let Some(writer) = &mut self.writer {
            match writer.poll_write(cx, &mut self.io) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => self.writer = None,
                Poll::Ready(Err(error)) => {
                    if let WriteError::Io(error) = &error {
                        tracing::debug!(%error, "writing the request to the worker failed");
                    }
                    self.writer = None;
                    self.reusable = false;
                }
            }
        }
    }

    /// Whether the worker closed the idle connection (or sent something unasked): a read that
    /// does not wait. A TLS session may consume records here (a late session ticket) and wait.
    fn closed_while_idle(&mut self) -> bool {
        let mut byte = [MaybeUninit::<u8>::uninit(); 1];
        let mut read = ReadBuf::uninit(&mut byte);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut read),
            Poll::Ready(_)
        )
    }

    /// Returns the connection to its worker's pool if it can take another request (the request
    /// was all written and the response read to its end, which the caller vouches for);
    /// otherwise closes it.
    pub fn release(self) {
        if self.reusable
            && self.writer.is_none()
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
            // A close (or stray bytes) the worker sent while the connection sat idle.
            if !connection.closed_while_idle() {
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
