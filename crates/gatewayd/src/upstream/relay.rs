//! A worker's response body, relayed from its socket as it arrives: what one read returned becomes
//! one frame. A `Content-Length` body passes as read; a chunked body is validated as it passes
//! ([`ChunkedDecoder`]), so a burst of SSE events (a chunk each) is one frame, not one frame,
//! `Bytes` split and channel hand-off per chunk as with hyper's client. For a client that takes
//! the body chunked too (HTTP/1.1), the frame is the chunks as they came
//! ([`ResponseBody::keep_chunk_framing`]): the client's connection writes them without decoding
//! and chunk-encoding them again. Otherwise only the data goes on. The chunks that came with the
//! head (a slice of the head's buffer, not a copy) go out in one frame with the first read's.
//!
//! Nothing is buffered between reads: a read goes into the polling task's stack and only the
//! data that came is copied out, so a held stream whose worker is thinking holds no read buffer
//! (its kernel socket buffers are not the process's memory). The request body, if the worker
//! answered before it was all sent, keeps being written from here, as hyper's connection did.
//! When the body ends the connection goes back to its worker's pool, if the exchange was
//! complete, the worker allows it and nothing followed the body.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};

use super::exchange::ResponseFraming;
use super::pool::UpstreamConnection;
use crate::chunked::{ChunkedDecoder, ChunkedError, Malformed};

/// Most bytes one read takes from a worker's socket (on the stack of the task that reads).
const READ_SIZE: usize = 16 * 1024;

/// Why a relayed body broke.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The chunked framing is malformed, or the worker closed before the body's end.
    #[error("invalid response body from the worker: {0}")]
    Chunked(#[from] ChunkedError),
    /// The worker closed before `Content-Length` bytes.
    #[error("end of file before message length reached")]
    Truncated,
    /// Reading from the worker failed.
    #[error("error reading the response body from the worker")]
    Read(#[source] io::Error),
}

enum Framing {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// The body of a worker's response, read from its connection by whoever polls it.
pub struct ResponseBody {
    /// `None` once the body ended (the connection was released) or was closed.
    connection: Option<UpstreamConnection>,
    framing: Framing,
    /// Body bytes read together with the head (a slice of the head's buffer); handed on by the
    /// first poll.
    head_rest: Option<Bytes>,
    /// The worker lets the connection serve another request after this response.
    keep_alive: bool,
    /// A malformation found behind data that was handed on first; returned by the next poll.
    broken: Option<RelayError>,
    /// A chunked body is handed on in its chunked framing ([`ResponseBody::keep_chunk_framing`]).
    framed: bool,
}

impl ResponseBody {
    pub(super) fn new(
        connection: UpstreamConnection,
        framing: ResponseFraming,
        keep_alive: bool,
        head_rest: Bytes,
    ) -> Self {
        let mut body = Self {
            connection: Some(connection),
            framing: match framing {
                ResponseFraming::Empty => Framing::Length(0),
                ResponseFraming::Length(length) => Framing::Length(length),
                ResponseFraming::Chunked => Framing::Chunked(ChunkedDecoder::new()),
                ResponseFraming::UntilClose => Framing::UntilClose,
            },
            head_rest: (!head_rest.is_empty()).then_some(head_rest),
            keep_alive,
            broken: None,
            framed: false,
        };
        if matches!(body.framing, Framing::Length(0)) {
            // Bytes after an empty body are not the next response's: no reuse.
            let clean = body.head_rest.take().is_none();
            body.end(clean);
        }
        body
    }

    /// Makes a chunked body's frames whole chunks in the framing they came in (validated as they
    /// pass, [`ChunkedDecoder::relay`]) instead of their data: for a client that takes the body
    /// chunked, so its bytes are relayed rather than decoded and chunk-encoded again. The last
    /// chunk is not among them (whoever writes the body ends it). Returns whether the body is
    /// chunked, and so now framed; call it before the first poll.
    pub fn keep_chunk_framing(&mut self) -> bool {
        self.framed = matches!(self.framing, Framing::Chunked(_));
        self.framed
    }

    /// Whether the body's frames are chunks in their chunked framing.
    pub fn is_framed(&self) -> bool {
        self.framed
    }

    /// Whether the body has ended (or was closed).
    pub fn is_done(&self) -> bool {
        self.connection.is_none()
    }

    /// Closes the worker connection of an unfinished body (the worker sees the client is gone).
    pub fn close(&mut self) {
        self.connection = None;
    }

    /// Ends the body: the connection goes back to its pool if `clean` and reuse is allowed.
    fn end(&mut self, clean: bool) {
        if let Some(connection) = self.connection.take()
            && clean
            && self.keep_alive
        {
            connection.release();
        }
    }

    /// Decodes `bytes` (a read, or the bytes behind the head) in place: the data, and whether
    /// the body ended in them.
    fn take<'a>(&mut self, bytes: &'a mut [u8]) -> Result<(&'a [u8], bool), RelayError> {
        let Framing::Chunked(decoder) = &mut self.framing else {
            let (take, ended) = self.take_delimited(bytes.len());
            return Ok((&bytes[..take], ended));
        };
        let (data, ended) = match decoder.decode_in_place(bytes) {
            // Trailers are checked, then dropped: hyper's server never forwarded them
            // (`Trailer` is hop-by-hop, so no response announces any).
            Ok(decoded) if decoder.is_done() => match decoder.take_trailers() {
                Ok(_) => {
                    self.end(decoded.consumed == bytes.len());
                    (decoded.data, true)
                }
                Err(error) => (decoded.data, self.fail_behind(decoded.data, error)?),
            },
            Ok(decoded) => (decoded.data, false),
            Err(Malformed { error, data }) => (data, self.fail_behind(data, error)?),
        };
        Ok((&bytes[..data], ended))
    }

    /// [`ResponseBody::take`] for a body delimited by its length or the close, which needs no
    /// decoding: how many of `available` bytes are the body's, and whether it ended in them.
    fn take_delimited(&mut self, available: usize) -> (usize, bool) {
        let Framing::Length(left) = &mut self.framing else {
            return (available, false);
        };
        let take = usize::try_from(*left).map_or(available, |l| l.min(available));
        *left -= take as u64;
        let ended = *left == 0;
        if ended {
            // Bytes after the body: not the start of another response.
            self.end(take == available);
        }
        (take, ended)
    }

    /// [`ResponseBody::take`] for a body relayed in its chunked framing: the whole chunks of
    /// `bytes` appended to `out`, and whether the body ended in them.
    fn relay(&mut self, bytes: &[u8], out: &mut BytesMut) -> Result<bool, RelayError> {
        let Framing::Chunked(decoder) = &mut self.framing else {
            unreachable!("only a chunked body is framed");
        };
        let before = out.len();
        match decoder.relay(bytes, out) {
            Ok(consumed) if decoder.is_done() => match decoder.take_trailers() {
                Ok(_) => {
                    self.end(consumed == bytes.len());
                    Ok(true)
                }
                Err(error) => self.fail_behind(out.len() - before, error),
            },
            Ok(_) => Ok(false),
            Err(Malformed { error, data }) => {
                out.truncate(before + data);
                self.fail_behind(data, error)
            }
        }
    }

    /// A malformation (a bad byte, a bad trailer section) found behind `good` bytes of data
    /// that are as good as ever: they go on first and the failure with the next poll (`Ok`:
    /// the body did not end); with none, the body fails now.
    fn fail_behind(&mut self, good: usize, error: ChunkedError) -> Result<bool, RelayError> {
        if good == 0 {
            return Err(error.into());
        }
        self.broken = Some(error.into());
        Ok(false)
    }

    /// A frame of `out`'s chunks, or, when `out` holds none, `error` (the body fails): chunks
    /// that came before a failure go on first, and the failure is returned by the next poll.
    fn chunks_or_fail(
        &mut self,
        out: BytesMut,
        error: RelayError,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        if out.is_empty() {
            return Poll::Ready(Some(Err(self.fail(error))));
        }
        self.broken = Some(error);
        Poll::Ready(Some(Ok(Frame::data(out.freeze()))))
    }

    /// The end of the connection: the end of a body delimited by it, else a truncation.
    fn at_close(&mut self) -> Result<(), RelayError> {
        let result = match &self.framing {
            Framing::Length(_) => Err(RelayError::Truncated),
            Framing::Chunked(decoder) => {
                decoder.at_end_of_input().map_or(Ok(()), |e| Err(e.into()))
            }
            Framing::UntilClose => Ok(()),
        };
        self.end(false);
        result
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self.get_mut();
        if let Some(error) = this.broken.take() {
            return Poll::Ready(Some(Err(this.fail(error))));
        }
        // For a framed body, the chunks behind the head, which go out with whatever the worker
        // sent since (one frame, one buffer).
        let mut ahead: Option<BytesMut> = None;
        if this.framed
            && let Some(rest) = this.head_rest.take()
        {
            let mut out = BytesMut::with_capacity(rest.len() + 32);
            let ended = match this.relay(&rest, &mut out) {
                Ok(ended) => ended,
                Err(error) => return Poll::Ready(Some(Err(this.fail(error)))),
            };
            if ended || this.broken.is_some() {
                if out.is_empty() && !ended {
                    let error = this.broken.take().expect("checked above");
                    return Poll::Ready(Some(Err(this.fail(error))));
                }
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
            ahead = (!out.is_empty()).then_some(out);
        }
        if let Some(rest) = this.head_rest.take() {
            let data = if matches!(this.framing, Framing::Chunked(_)) {
                // Decoded in place, so in a buffer of its own (copied only while the head that
                // shares its allocation is alive).
                let mut rest = BytesMut::from(rest);
                match this.take(&mut rest) {
                    Ok((data, _)) => {
                        let data = data.len();
                        rest.truncate(data);
                        rest.freeze()
                    }
                    Err(error) => return Poll::Ready(Some(Err(this.fail(error)))),
                }
            } else {
                let (take, _) = this.take_delimited(rest.len());
                rest.slice(..take)
            };
            if !data.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if let Some(error) = this.broken.take() {
                return Poll::Ready(Some(Err(this.fail(error))));
            }
        }
        loop {
            let Some(connection) = &mut this.connection else {
                return Poll::Ready(ahead.map(|out| Ok(Frame::data(out.freeze()))));
            };
            connection.keep_writing(cx);
            let limit = match this.framing {
                Framing::Length(left) => {
                    usize::try_from(left).map_or(READ_SIZE, |l| l.min(READ_SIZE))
                }
                _ => READ_SIZE,
            };
            let mut stack = [MaybeUninit::<u8>::uninit(); READ_SIZE];
            let mut read = ReadBuf::uninit(&mut stack[..limit]);
            match Pin::new(connection.io()).poll_read(cx, &mut read) {
                Poll::Pending => {
                    return match ahead {
                        Some(out) => Poll::Ready(Some(Ok(Frame::data(out.freeze())))),
                        None => Poll::Pending,
                    };
                }
                Poll::Ready(Err(error)) => {
                    let error = RelayError::Read(error);
                    return this.chunks_or_fail(ahead.unwrap_or_default(), error);
                }
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The chunks ahead go on first, then the end or the truncation.
                    return match (this.at_close(), ahead) {
                        (Ok(()), Some(out)) => Poll::Ready(Some(Ok(Frame::data(out.freeze())))),
                        (Ok(()), None) => Poll::Ready(None),
                        (Err(error), ahead) => {
                            this.chunks_or_fail(ahead.unwrap_or_default(), error)
                        }
                    };
                }
                Poll::Ready(Ok(())) => {}
            }
            if this.framed {
                let filled = read.filled();
                let mut out = ahead.take().unwrap_or_default();
                out.reserve(filled.len() + 32);
                match this.relay(filled, &mut out) {
                    Err(error) => return this.chunks_or_fail(out, error),
                    Ok(ended) if !out.is_empty() || ended => {
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                    Ok(_) => continue,
                }
            }
            match this.take(read.filled_mut()) {
                Err(error) => return Poll::Ready(Some(Err(this.fail(error)))),
                Ok((data, ended)) if !data.is_empty() || ended => {
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(data)))));
                }
                // Only framing came (a size line, the CRLF after a chunk): read on.
                Ok(_) => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // A failure found behind the last data is still to come.
        self.is_done() && self.head_rest.is_none() && self.broken.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            // The bytes behind the head are still counted in `left`.
            Framing::Length(left) => SizeHint::with_exact(left),
            _ => SizeHint::default(),
        }
    }
}

impl ResponseBody {
    /// A broken body: its connection is closed, never reused.
    fn fail(&mut self, error: RelayError) -> RelayError {
        self.connection = None;
        self.head_rest = None;
        error
    }
}
