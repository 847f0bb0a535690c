//! A client's request body, decoded from its connection by whoever polls it (the proxy, on its
//! way to the worker): `Content-Length` bytes, or a chunked body decoded in place by
//! [`ChunkedDecoder`] (chunk extensions skipped and trailers dropped, as the worker side never
//! forwarded them). `Expect: 100-continue` is answered when the body is first polled, as hyper
//! answers it.
//!
//! The connection's socket and the bytes read past a head live in one [`Shared`] state that the
//! connection loop and the body both lock, each only for the length of one poll (the body is
//! polled from inside the connection's own task, so the lock is never contended). Reads go into
//! the poll's stack and only the bytes that came are copied out: nothing is buffered between
//! reads but bytes that arrived before they were asked for.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::request_head::BodyFraming;
use crate::chunked::{ChunkedDecoder, ChunkedError, Malformed};

/// Most bytes one read takes from a client's socket (on the stack of the task that reads).
pub const READ_SIZE: usize = 16 * 1024;

/// What a client answers `Expect: 100-continue` with.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Why a request body could not be read: the client's doing, every time.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    /// The connection ended (or failed) before the body's end.
    #[error("the connection ended before the request body did")]
    Incomplete,
    /// The chunked framing is invalid.
    #[error("invalid chunked request body: {0}")]
    Malformed(#[from] ChunkedError),
}

/// Where the body of the request in progress stands.
#[derive(Debug)]
enum Decoding {
    /// Bytes of a `Content-Length` body still to come.
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Read to its end.
    Done,
    /// Failed; the connection cannot carry another request.
    Failed,
}

/// The connection's socket and read state, shared by its loop and its request's body.
pub struct Shared<IO> {
    /// The client's connection.
    pub io: IO,
    /// Bytes read and not yet used: the rest of a read that ended a head or a body (the start of
    /// a body, or pipelined requests), or a head still incomplete.
    pub pending: BytesMut,
    decoding: Decoding,
    /// Which request the body being decoded belongs to: a body handle of an earlier request
    /// reads nothing.
    request: u64,
    /// Bytes of `100 Continue` written, while it is owed.
    continue_written: Option<usize>,
    /// The client closed its sending side with requests of it still in `pending` (pipelined,
    /// then a half-close): those are answered, then the connection closes.
    pub client_finished_sending: bool,
}

impl<IO> Shared<IO> {
    /// A fresh connection's state.
    pub fn new(io: IO) -> Self {
        Self {
            io,
            pending: BytesMut::new(),
            decoding: Decoding::Done,
            request: 0,
            continue_written: None,
            client_finished_sending: false,
        }
    }

    /// Starts the body of the next request: its handle reads it.
    pub fn start_body(&mut self, framing: BodyFraming, expect_continue: bool) -> u64 {
        self.request += 1;
        self.decoding = match framing {
            BodyFraming::Length(0) => Decoding::Done,
            BodyFraming::Length(length) => Decoding::Length(length),
            BodyFraming::Chunked => Decoding::Chunked(ChunkedDecoder::new()),
        };
        self.continue_written = (expect_continue && !self.body_done()).then_some(0);
        self.request
    }

    /// Whether the request body was read to its end.
    pub fn body_done(&self) -> bool {
        matches!(self.decoding, Decoding::Done)
    }

    /// The response is on its way: a `100 Continue` not yet begun is no longer owed (the client
    /// sends its body anyway or the connection closes, as with hyper).
    pub fn skip_continue(&mut self) {
        if self.continue_written == Some(0) {
            self.continue_written = None;
        }
    }

    /// Lets go of the read-ahead buffer once it is used up: an empty `BytesMut` split from a
    /// buffer still shares (and keeps) that buffer's allocation.
    pub fn release_pending(&mut self) {
        if self.pending.is_empty() {
            self.pending = BytesMut::new();
        }
    }

    /// Ends the request: no earlier body handle reads from the connection any more.
    pub fn finish_request(&mut self) {
        self.request += 1;
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Shared<IO> {
    /// The body's next data, for the request numbered `request`.
    fn poll_body(
        &mut self,
        request: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, RequestBodyError>>> {
        if request != self.request {
            return Poll::Ready(Some(Err(RequestBodyError::Incomplete)));
        }
        if let Err(error) = std::task::ready!(self.poll_continue(cx)) {
            self.decoding = Decoding::Failed;
            return Poll::Ready(Some(Err(error)));
        }
        let polled = self.poll_decode(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            self.decoding = Decoding::Failed;
        }
        polled
    }

    /// Writes the owed `100 Continue`, if any.
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), RequestBodyError>> {
        while let Some(written) = self.continue_written {
            if written < CONTINUE.len() {
                match std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &CONTINUE[written..]))
                {
                    Ok(0) | Err(_) => return Poll::Ready(Err(RequestBodyError::Incomplete)),
                    Ok(wrote) => self.continue_written = Some(written + wrote),
                }
            } else {
                std::task::ready!(Pin::new(&mut self.io).poll_flush(cx))
                    .map_err(|_| RequestBodyError::Incomplete)?;
                self.continue_written = None;
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_decode(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, RequestBodyError>>> {
        loop {
            match &mut self.decoding {
                Decoding::Done => return Poll::Ready(None),
                Decoding::Failed => return Poll::Ready(Some(Err(RequestBodyError::Incomplete))),
                Decoding::Length(left) if !self.pending.is_empty() => {
                    let take = usize::try_from(*left)
                        .map_or(self.pending.len(), |left| left.min(self.pending.len()));
                    *left -= take as u64;
                    if *left == 0 {
                        self.decoding = Decoding::Done;
                    }
                    // The usual case, a body read whole with its head, takes the buffer as it
                    // is: splitting it would make it shared (an allocation) for nothing.
                    let data = if take == self.pending.len() {
                        std::mem::take(&mut self.pending).freeze()
                    } else {
                        self.pending.split_to(take).freeze()
                    };
                    self.release_pending();
                    return Poll::Ready(Some(Ok(data)));
                }
                Decoding::Chunked(decoder) if !self.pending.is_empty() => {
                    let decoded = decoder
                        .decode_in_place(&mut self.pending)
                        .map_err(|Malformed { error, .. }| error)?;
                    let mut data = self.pending.split_to(decoded.consumed);
                    data.truncate(decoded.data);
                    if self.pending.is_empty() {
                        self.pending = BytesMut::new();
                    }
                    if decoder.is_done() {
                        decoder.take_trailers()?;
                        self.decoding = Decoding::Done;
                        if data.is_empty() {
                            return Poll::Ready(None);
                        }
                    }
                    if !data.is_empty() {
                        return Poll::Ready(Some(Ok(data.freeze())));
                    }
                }
                _ => {}
            }
            // Nothing pending: read what the client sent since.
            let limit = match self.decoding {
                Decoding::Length(left) => {
                    usize::try_from(left).map_or(READ_SIZE, |left| left.min(READ_SIZE))
                }
                _ => READ_SIZE,
            };
            let mut stack = [MaybeUninit::<u8>::uninit(); READ_SIZE];
            let mut read = ReadBuf::uninit(&mut stack[..limit]);
            match std::task::ready!(Pin::new(&mut self.io).poll_read(cx, &mut read)) {
                Err(_) => return Poll::Ready(Some(Err(RequestBodyError::Incomplete))),
                Ok(()) if read.filled().is_empty() => {
                    return Poll::Ready(Some(Err(RequestBodyError::Incomplete)));
                }
                Ok(()) => {}
            }
            let filled = read.filled_mut();
            match &mut self.decoding {
                Decoding::Length(left) => {
                    *left -= filled.len() as u64;
                    if *left == 0 {
                        self.decoding = Decoding::Done;
                    }
                    return Poll::Ready(Some(Ok(Bytes::copy_from_slice(filled))));
                }
                Decoding::Chunked(decoder) => {
                    let decoded = decoder
                        .decode_in_place(filled)
                        .map_err(|Malformed { error, .. }| error)?;
                    // Whatever followed the body is the next request's.
                    self.pending.extend_from_slice(&filled[decoded.consumed..]);
                    let done = decoder.is_done();
                    if done {
                        decoder.take_trailers()?;
                        self.decoding = Decoding::Done;
                    }
                    if decoded.data > 0 {
                        return Poll::Ready(Some(Ok(Bytes::copy_from_slice(
                            &filled[..decoded.data],
                        ))));
                    }
                    if done {
                        return Poll::Ready(None);
                    }
                }
                Decoding::Done | Decoding::Failed => {}
            }
        }
    }

    /// Whether the request's body is known to be empty or finished, and its size hint.
    fn hint(&self, request: u64) -> (bool, SizeHint) {
        if request != self.request {
            return (true, SizeHint::with_exact(0));
        }
        match &self.decoding {
            Decoding::Done | Decoding::Failed => (true, SizeHint::with_exact(0)),
            Decoding::Length(left) => (false, SizeHint::with_exact(*left)),
            Decoding::Chunked(_) => (false, SizeHint::default()),
        }
    }

    /// Decodes what is already pending, without reading: whether that ends the body (so the
    /// connection can carry the next request although nobody read this one's body).
    pub fn drain_pending(&mut self) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        while !self.pending.is_empty() {
            match self.poll_decode_pending(&mut cx) {
                Some(true) => continue,
                _ => break,
            }
        }
        self.body_done()
    }

    /// One step of [`Shared::drain_pending`]: `Some(true)` while data was dropped.
    fn poll_decode_pending(&mut self, cx: &mut Context<'_>) -> Option<bool> {
        match self.decoding {
            Decoding::Length(_) | Decoding::Chunked(_) => {}
            _ => return None,
        }
        match self.poll_decode(cx) {
            Poll::Ready(Some(Ok(_))) => Some(true),
            _ => None,
        }
    }
}

/// A request's body as the connection's shared state gives it.
trait BodySource: Send + Sync {
    fn poll_body(
        &self,
        request: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, RequestBodyError>>>;
    fn hint(&self, request: u64) -> (bool, SizeHint);
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send> BodySource for Mutex<Shared<IO>> {
    fn poll_body(
        &self,
        request: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, RequestBodyError>>> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .poll_body(request, cx)
    }

    fn hint(&self, request: u64) -> (bool, SizeHint) {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .hint(request)
    }
}

/// The body of a request served by the data plane's HTTP/1 server: its data frames, decoded from
/// the client's connection as they are polled. Ends with `None` after the last byte; an error is
/// the client's fault ([`RequestBodyError`]).
pub struct RequestBody {
    /// `None`: the request has no body.
    source: Option<Arc<dyn BodySource>>,
    request: u64,
}

impl RequestBody {
    /// A body that is empty.
    pub fn empty() -> Self {
        Self {
            source: None,
            request: 0,
        }
    }

    /// The body of request number `request` on `shared`'s connection.
    pub fn of<IO>(shared: &Arc<Mutex<Shared<IO>>>, request: u64) -> Self
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let source: Arc<dyn BodySource> = shared.clone();
        Self {
            source: Some(source),
            request,
        }
    }
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let this = self.get_mut();
        let Some(source) = &this.source else {
            return Poll::Ready(None);
        };
        let polled = source.poll_body(this.request, cx);
        if let Poll::Ready(None | Some(Err(_))) = &polled {
            this.source = None;
        }
        polled.map(|frame| frame.map(|data| data.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.source
            .as_ref()
            .is_none_or(|source| source.hint(self.request).0)
    }

    fn size_hint(&self) -> SizeHint {
        self.source
            .as_ref()
            .map_or(SizeHint::with_exact(0), |source| {
                source.hint(self.request).1
            })
    }
}

impl From<io::Error> for RequestBodyError {
    fn from(_: io::Error) -> Self {
        RequestBodyError::Incomplete
    }
}

#[cfg(test)]
#[path = "request_body_tests.rs"]
mod tests;
