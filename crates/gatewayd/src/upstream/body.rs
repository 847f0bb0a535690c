//! The request body on its way to a worker, with the body-size limit and the request-body
//! deadline enforced as it streams, and the client's faults told apart from the worker's.
//!
//! A request whose body fails on the client's side — the client closed the connection mid-body,
//! sent a malformed chunked encoding, went over `max_body_bytes` or uploaded too slowly — fails
//! while it is being sent to the worker, so hyper reports it like a failed exchange with the
//! worker. The body's error is a [`ClientBodyError`], found again in that error's causes by
//! [`client_fault`], so the proxy answers the client's fault with a 4xx and never counts it
//! against the worker (errors, passive health, warning logs).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::http1::{RequestBody, RequestBodyError};
use tokio::time::{Instant, Sleep};

/// Boxed error type of bodies and connects.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body on its way to a worker: the client's body, cut off with a
/// [`ClientBodyError`] once it passes `max_bytes` (for bodies without a `Content-Length`, which
/// is checked up front), once its deadline passes before its end, or when the client's side of
/// it fails.
pub struct UpstreamBody {
    inner: RequestBody,
    /// Frames already read from `inner` by [`UpstreamBody::read_ahead`], sent first.
    read_ahead: VecDeque<Frame<Bytes>>,
    /// The data bytes in `read_ahead` (the size hint adds them to `inner`'s remaining length).
    read_ahead_bytes: u64,
    remaining: u64,
    deadline: Instant,
    /// Armed the first time the body makes the request wait: a body that arrives with its head
    /// (the usual case) costs no timer.
    timer: Option<Pin<Box<Sleep>>>,
}

/// What went wrong with a client's request body: the client's fault, never the worker's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientBodyError {
    /// The body ended before its declared end: the client closed (or reset) the connection.
    #[error("the client's request body ended early (connection closed)")]
    Incomplete,
    /// The body's framing is invalid (a bad chunk size line, say); the parser's words.
    #[error("the client's request body is malformed: {0}")]
    Malformed(String),
    /// The body passed `max_body_bytes`.
    #[error("the client's request body exceeds the configured limit")]
    TooLarge,
    /// The body had not arrived in full by its deadline.
    #[error("the client's request body did not arrive in time")]
    Timeout,
}

impl ClientBodyError {
    /// What an error reading the client's body says about it: bad framing, or the connection
    /// ending before the body did.
    fn from_client(error: &RequestBodyError) -> Self {
        match error {
            RequestBodyError::Malformed(framing) => ClientBodyError::Malformed(framing.to_string()),
            RequestBodyError::Incomplete => ClientBodyError::Incomplete,
        }
    }
}

impl UpstreamBody {
    /// `inner`, allowed `max_bytes` bytes, to be complete by `deadline`.
    pub fn new(inner: RequestBody, max_bytes: u64, deadline: Instant) -> Self {
        Self {
            inner,
            read_ahead: VecDeque::new(),
            read_ahead_bytes: 0,
            remaining: max_bytes,
            deadline,
            timer: None,
        }
    }

    /// Reads the body ahead of sending it, keeping every frame read so that the worker still gets
    /// the body whole and unchanged: each data frame is shown to `enough` until it answers true or
    /// the body ends. The limits apply as when streaming (`max_bytes`, the deadline); a fault is
    /// the client's, as [`ClientBodyError`].
    pub async fn read_ahead(
        &mut self,
        mut enough: impl FnMut(&[u8]) -> bool,
    ) -> Result<(), ClientBodyError> {
        while !self.inner.is_end_stream() {
            let frame = match std::future::poll_fn(|cx| self.poll_client(cx)).await {
                None => break,
                Some(Ok(frame)) => frame,
                Some(Err(error)) => {
                    let fault = error.downcast::<ClientBodyError>().map_or_else(
                        |other| ClientBodyError::Malformed(other.to_string()),
                        |fault| *fault,
                    );
                    return Err(fault);
                }
            };
            let done = frame.data_ref().is_some_and(|data| {
                self.read_ahead_bytes += data.len() as u64;
                enough(data)
            });
            self.read_ahead.push_back(frame);
            if done {
                break;
            }
        }
        Ok(())
    }

    fn fail(error: ClientBodyError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(Some(Err(Box::new(error))))
    }

    /// The body is waiting for the client: past the deadline that is the client's fault.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let timer = match &mut self.timer {
            Some(timer) => timer,
            None if Instant::now() >= deadline => return Poll::Ready(()),
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        timer.as_mut().poll(cx)
    }
}

/// The client's fault in `error` or one of its causes, if the error is one.
pub fn client_fault<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a ClientBodyError> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(fault) = error.downcast_ref::<ClientBodyError>() {
            return Some(fault);
        }
        cause = error.source();
    }
    None
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.read_ahead.pop_front() {
            if let Some(data) = frame.data_ref() {
                this.read_ahead_bytes -= data.len() as u64;
            }
            return Poll::Ready(Some(Ok(frame)));
        }
        this.poll_client(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read_ahead.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // hyper sends an exact hint as the `Content-Length`: the frames read ahead count too.
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + self.read_ahead_bytes);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + self.read_ahead_bytes);
        }
        hint
    }
}

impl UpstreamBody {
    /// The next frame from the client, through the limits (not the frames read ahead).
    fn poll_client(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let Poll::Ready(polled) = polled else {
            ready!(this.poll_deadline(cx));
            return Self::fail(ClientBodyError::Timeout);
        };
        match polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.remaining {
                        return Self::fail(ClientBodyError::TooLarge);
                    }
                    this.remaining -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => Self::fail(ClientBodyError::from_client(&error)),
            None => Poll::Ready(None),
        }
    }
}
