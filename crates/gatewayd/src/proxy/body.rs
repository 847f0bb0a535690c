//! The response body the client reads: a complete gateway answer, or a worker's response streamed
//! frame by frame. A streamed body drives its worker connection and holds the request's
//! [`Exchange`] (with its load guard), so the request ends exactly when the body does.
//!
//! Frames that have already arrived are passed on together, nothing waits for more; a silence
//! longer than `stream_idle_timeout_ms` ends the stream, and a broken event stream ends with an
//! `event: error` the client can recognise. A body that is not an event stream is read up to its
//! first frame before the response head goes out ([`ProxyBody::first_frame`]), so a worker that
//! breaks it right away still gets the client a 502 instead of a response cut to nothing.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::error::{display_chain, sse_stream_error_event};
use crate::routing::Exchange;
use crate::upstream::{BoxError, RelayError, ResponseBody};

/// Response bodies: a fixed gateway answer, or a worker's stream carrying the request's exchange.
pub struct ProxyBody {
    kind: BodyKind,
}

enum BodyKind {
    Full(Option<Bytes>),
    Stream(Box<StreamState>),
}

struct StreamState {
    /// The worker's body, read from its connection here.
    inner: ResponseBody,
    /// A frame (trailers) or error met while gathering, returned by the next poll.
    deferred: Option<Result<Frame<Bytes>, RelayError>>,
    /// The first frame, read before the response head was sent; returned by the first poll.
    prefetched: Option<Frame<Bytes>>,
    /// While the response head is still held back: a broken body keeps the exchange, so the
    /// client can be answered with a status instead.
    head_pending: bool,
    exchange: Option<Exchange>,
    event_stream: bool,
    /// The worker's chunked body passes in its own framing ([`ResponseBody::keep_chunk_framing`]):
    /// every data frame is whole chunks, and so is the `event: error` appended to a broken one.
    framed: bool,
    idle_timeout: Duration,
    /// When the last frame arrived (or the stream started).
    last_frame: tokio::time::Instant,
    /// Armed the first time the worker makes the stream wait, then moved forward only when it
    /// fires: a frame costs a clock read, not a timer update.
    idle: Option<Pin<Box<Sleep>>>,
}

impl Drop for StreamState {
    /// A body dropped while it still holds its exchange was not read to its end: the client's
    /// connection went away (a body that ended, failed or timed out gave its exchange up first).
    /// An empty body the server never needed to poll is not one.
    fn drop(&mut self) {
        let unread = self.prefetched.is_some() || self.deferred.is_some();
        if let Some(exchange) = &mut self.exchange
            && (unread || !self.inner.is_end_stream())
        {
            exchange.client_left();
        }
    }
}

/// Most bytes [`StreamState::gather`] merges into one frame.
const GATHER_LIMIT: usize = 16 * 1024;

impl ProxyBody {
    /// No body.
    pub fn empty() -> Self {
        Self {
            kind: BodyKind::Full(None),
        }
    }

    /// A complete body.
    pub fn full(bytes: Bytes) -> Self {
        Self {
            kind: BodyKind::Full(Some(bytes)),
        }
    }

    /// A worker's response body, streamed: `inner` is read from here, and `exchange` ends with
    /// the body's last byte, an upstream error, the idle timeout or the client leaving. A body
    /// whose chunked framing `inner` keeps ([`ResponseBody::keep_chunk_framing`]) is handed on
    /// framed.
    pub fn stream(
        inner: ResponseBody,
        exchange: Exchange,
        event_stream: bool,
        idle_timeout: Duration,
    ) -> Self {
        let framed = inner.is_framed();
        Self {
            kind: BodyKind::Stream(Box::new(StreamState {
                inner,
                framed,
                deferred: None,
                prefetched: None,
                head_pending: false,
                exchange: Some(exchange),
                event_stream,
                idle_timeout,
                last_frame: tokio::time::Instant::now(),
                idle: None,
            })),
        }
    }
}

impl ProxyBody {
    /// Reads the first frame of a streamed body (bounded by the idle timeout) before the response
    /// head is sent; the frame is returned by the first poll. When the worker breaks the body (or
    /// stays silent) before it, the worker connection is closed and the exchange comes back, so
    /// the caller can still answer with a status.
    pub async fn first_frame(&mut self) -> Result<(), Exchange> {
        let BodyKind::Stream(state) = &mut self.kind else {
            return Ok(());
        };
        state.head_pending = true;
        let polled = std::future::poll_fn(|cx| state.poll_frame(cx)).await;
        state.head_pending = false;
        match polled {
            Some(Ok(frame)) => {
                state.prefetched = Some(frame);
                Ok(())
            }
            None => Ok(()),
            Some(Err(_)) => Err(state
                .exchange
                .take()
                .expect("a broken body keeps its exchange while the head is pending")),
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            BodyKind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            BodyKind::Stream(state) => state.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Full(bytes) => bytes.is_none(),
            BodyKind::Stream(state) => state.exchange.is_none() && state.prefetched.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            BodyKind::Full(None) => SizeHint::with_exact(0),
            BodyKind::Stream(state) => {
                // The prefetched first frame is still to come, though `inner` gave it already.
                let ahead = state
                    .prefetched
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |d| d.len() as u64);
                let inner = state.inner.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + ahead);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + ahead);
                }
                hint
            }
        }
    }
}

impl StreamState {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.prefetched.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.exchange.is_none() {
            return Poll::Ready(None);
        }
        let polled = match self.deferred.take() {
            Some(frame) => Poll::Ready(Some(frame)),
            None => self.poll_worker(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => {
                        if let Some(exchange) = &mut self.exchange {
                            exchange.first_chunk(self.event_stream);
                        }
                        Frame::data(self.gather(data, cx))
                    }
                    Err(other) => other,
                };
                if frame.is_trailers() || (self.inner.is_end_stream() && self.deferred.is_none()) {
                    // The last byte of a body, or trailers (always last): the server drops a
                    // body once it says it ended, without polling it again, so the request ends
                    // here, and the worker connection, read to its
                    // end, can serve the next one.
                    self.finish();
                } else if self.idle.is_some() {
                    self.last_frame = tokio::time::Instant::now();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                self.record_error();
                tracing::warn!(error = %display_chain(&error), "worker stream broke");
                Poll::Ready(self.end_abnormally(error.into()))
            }
            Poll::Pending => {
                let idle_timeout = self.idle_timeout;
                if self.idle.is_none() {
                    // First wait: every frame so far came at once, so the silence starts now.
                    self.last_frame = tokio::time::Instant::now();
                }
                let deadline = self.last_frame + idle_timeout;
                let idle = self
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                loop {
                    ready!(idle.as_mut().poll(cx));
                    // Fired: a frame may have come since it was armed.
                    let deadline = self.last_frame + idle_timeout;
                    if deadline <= tokio::time::Instant::now() {
                        break;
                    }
                    idle.as_mut().reset(deadline);
                }
                self.record_error();
                tracing::warn!(
                    idle_ms = self.idle_timeout.as_millis() as u64,
                    "worker stream idle too long; ending it"
                );
                Poll::Ready(self.end_abnormally("worker stream idle timeout".into()))
            }
        }
    }

    fn record_error(&mut self) {
        if let Some(exchange) = &mut self.exchange {
            exchange.record_error();
        }
    }

    /// The worker's next frame: what the next read from its socket brought.
    fn poll_worker(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    /// `first` plus the data frames the worker has already delivered behind it, up to
    /// [`GATHER_LIMIT`] bytes: a burst of SSE events (one chunk each) becomes one frame for the
    /// client's connection instead of one chunk header, queue entry and poll round each. Nothing
    /// waits: gathering stops at the first frame that is not there yet. A trailer frame or error
    /// met on the way is kept for the next poll; the end of the body finishes the response.
    fn gather(&mut self, first: Bytes, cx: &mut Context<'_>) -> Bytes {
        let mut merged: Option<BytesMut> = None;
        while !self.inner.is_end_stream()
            && merged.as_ref().map_or(first.len(), BytesMut::len) < GATHER_LIMIT
        {
            match self.poll_worker(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => merged
                        .get_or_insert_with(|| {
                            let mut merged =
                                BytesMut::with_capacity(2 * (first.len() + data.len()));
                            merged.extend_from_slice(&first);
                            merged
                        })
                        .extend_from_slice(&data),
                    Err(other) => {
                        self.deferred = Some(Ok(other));
                        break;
                    }
                },
                Poll::Ready(Some(Err(error))) => {
                    self.deferred = Some(Err(error));
                    break;
                }
                Poll::Ready(None) => {
                    self.finish();
                    break;
                }
                Poll::Pending => break,
            }
        }
        merged.map_or(first, BytesMut::freeze)
    }

    /// Ends a complete response (its worker connection went back to the pool at the body's end,
    /// if it can serve another request): the exchange ends.
    fn finish(&mut self) {
        self.exchange = None;
    }

    /// Ends a broken stream. For SSE the client gets a final `event: error` so it can tell a cut
    /// stream from a finished one; other bodies end with an error, which aborts the connection.
    fn end_abnormally(&mut self, error: BoxError) -> Option<Result<Frame<Bytes>, BoxError>> {
        // Closes the worker connection: the worker sees the client is gone.
        self.inner.close();
        if self.head_pending {
            // `first_frame` takes the exchange to answer with a status.
            return Some(Err(error));
        }
        self.exchange = None;
        if self.event_stream && self.framed {
            let mut framed = BytesMut::new();
            crate::chunked::frame_chunk(&mut framed, &sse_stream_error_event());
            Some(Ok(Frame::data(framed.freeze())))
        } else if self.event_stream {
            Some(Ok(Frame::data(sse_stream_error_event())))
        } else {
            Some(Err(error))
        }
    }
}

impl crate::http1::ChunkFramed for ProxyBody {
    fn chunk_framed(&self) -> bool {
        matches!(&self.kind, BodyKind::Stream(state) if state.framed)
    }
}
