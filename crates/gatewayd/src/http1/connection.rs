//! One client connection, served request after request: the head read (within the header read
//! timeout), the request handed to the service with its body, the response written, and the
//! connection kept for the next request or closed, with hyper's rules throughout.
//!
//! While the service works and while the response streams, the connection still watches its
//! client (once the request body was read): a client that closes its end is gone and the request
//! is dropped (which ends its exchange as the client's leaving), and bytes of a pipelined next
//! request are kept for it. A client that closes its sending side behind pipelined requests has
//! not left: they are all answered, then the connection closes. On shutdown an idle connection
//! closes at once; a request in progress is answered and then the connection closes.

use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use super::request_body::{READ_SIZE, RequestBody, Shared};
use super::request_head::{self, HeadError, MAX_HEAD_BYTES, ParsedHead};
use super::response::{BodyLength, ChunkFramed, Encoding, Outgoing, RequestFacts, bare_answer};

/// Boxed error of a response body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a connection is served.
#[derive(Clone)]
pub struct ConnectionOptions {
    /// Time a client has to send a request head, from when the connection starts waiting for it.
    pub header_read_timeout: Duration,
    /// Cancelled on shutdown: idle connections close, requests in progress finish first.
    pub shutdown: CancellationToken,
}

/// Why a connection ended other than by the client or the gateway closing it in order.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The request head did not arrive in time.
    #[error("client too slow to send its request headers")]
    HeaderTimeout,
    /// The request head was refused (and answered).
    #[error("invalid request head: {0:?}")]
    Refused(HeadError),
    /// Reading from or writing to the client failed.
    #[error("client connection failed")]
    Io(#[source] io::Error),
    /// The response body failed: the response was cut.
    #[error("response body failed")]
    Body(#[source] BoxError),
}

impl ConnectionError {
    /// Whether the error is the header read timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ConnectionError::HeaderTimeout)
    }
}

/// Serves HTTP/1 requests on `io` with `service` until the client or `options.shutdown` ends the
/// connection.
pub async fn serve_connection<IO, S, F, B>(
    io: IO,
    mut service: S,
    options: ConnectionOptions,
) -> Result<(), ConnectionError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: FnMut(Request<RequestBody>) -> F,
    F: Future<Output = Response<B>>,
    B: Body<Data = Bytes> + ChunkFramed + Unpin,
    B::Error: Into<BoxError>,
{
    let shared = Arc::new(Mutex::new(Shared::new(io)));
    loop {
        let head = match read_head(&shared, &options).await {
            Ok(Some(head)) => head,
            Ok(None) => return Ok(()),
            Err(ConnectionError::Refused(error)) => {
                if let Some(status_line) = error.status_line() {
                    let _ = write_all(&shared, bare_answer(status_line)).await;
                }
                close(&shared).await;
                return Err(ConnectionError::Refused(error));
            }
            Err(error) => return Err(error),
        };
        let ParsedHead {
            request,
            framing,
            keep_alive,
            expect_continue,
        } = head;
        let (method, version) = (request.method().clone(), request.version());
        let number =
            lock(&shared).start_body(framing, expect_continue && version == Version::HTTP_11);
        let body = if framing == request_head::BodyFraming::Length(0) {
            RequestBody::empty()
        } else {
            RequestBody::of(&shared, number)
        };
        let response = {
            let mut answering = pin!(service(request.map(|()| body)));
            let answered = poll_fn(|cx| match answering.as_mut().poll(cx) {
                Poll::Ready(response) => Poll::Ready(Some(response)),
                Poll::Pending if client_left(&shared, cx) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            })
            .await;
            match answered {
                Some(response) => response,
                // The client left before its answer: dropping the service's future ends it.
                None => return Ok(()),
            }
        };
        let facts = RequestFacts {
            method: &method,
            version,
            keep_alive: keep_alive && !options.shutdown.is_cancelled(),
        };
        // The head is encoded here, so the connection's future keeps neither the response's
        // head nor its encoding while the body streams: only the body and what is on its way.
        let (body, out, encoding, last) = start_response(&shared, response, facts)?;
        write_body(&shared, body, out, encoding).await?;
        let reusable = {
            let mut state = lock(&shared);
            let reusable = !last && (state.body_done() || state.drain_pending());
            state.finish_request();
            // A burst of pipelined requests may have grown it: an idle connection holds no
            // buffer.
            state.release_pending();
            reusable
        };
        if !reusable || options.shutdown.is_cancelled() {
            close(&shared).await;
            return Ok(());
        }
    }
}

fn lock<IO>(shared: &Mutex<Shared<IO>>) -> MutexGuard<'_, Shared<IO>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The next request head: `None` when the client closed the connection between requests (or
/// sent part of a head and closed), or the connection was idle at shutdown.
async fn read_head<IO>(
    shared: &Mutex<Shared<IO>>,
    options: &ConnectionOptions,
) -> Result<Option<ParsedHead>, ConnectionError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = tokio::time::Instant::now() + options.header_read_timeout;
    let mut timer = None;
    let mut cancelled = pin!(options.shutdown.cancelled());
    // How many bytes of `pending` are known to hold no head's end (`None`: not parsed yet): only
    // what comes after them is searched for it, and the head is parsed again only once it came
    // (as hyper does), so a head arriving in pieces costs time linear in its length.
    let mut searched = None;
    poll_fn(|cx| {
        let mut state = lock(shared);
        loop {
            let pending = &state.pending;
            if searched.is_none_or(|searched| request_head::blank_line_seen(pending, searched)) {
                if !pending.is_empty() {
                    match request_head::parse(pending) {
                        Ok(Some((length, fields))) => {
                            let head = Bytes::copy_from_slice(&state.pending[..length]);
                            state.pending.advance(length);
                            state.release_pending();
                            return Poll::Ready(parsed(fields, &head));
                        }
                        Ok(None) => {
                            // A blank line and still no head: empty lines before the
                            // request line, which httparse skips; dropped, not skipped again.
                            let empty = request_head::leading_empty_lines(pending);
                            state.pending.advance(empty);
                            searched = Some(state.pending.len());
                        }
                        Err(error) => return Poll::Ready(Err(ConnectionError::Refused(error))),
                    }
                }
            } else if pending.len() > MAX_HEAD_BYTES {
                return Poll::Ready(Err(ConnectionError::Refused(HeadError::TooLarge)));
            } else {
                searched = Some(pending.len());
            }
            if state.client_finished_sending {
                // Nothing more comes: no head, or part of one, is left to answer.
                return Poll::Ready(Ok(None));
            }
            let mut stack = [MaybeUninit::<u8>::uninit(); READ_SIZE];
            let mut read = ReadBuf::uninit(&mut stack);
            match Pin::new(&mut state.io).poll_read(cx, &mut read) {
                Poll::Ready(Err(error)) => return Poll::Ready(Err(ConnectionError::Io(error))),
                // Closed between requests, or in the middle of a head: nothing to answer.
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(None)),
                Poll::Ready(Ok(())) if state.pending.is_empty() => {
                    // The usual case: a whole head in one read, parsed where it was read.
                    let filled = read.filled();
                    match request_head::parse(filled) {
                        Ok(Some((length, fields))) => {
                            let head = Bytes::copy_from_slice(&filled[..length]);
                            state.pending.extend_from_slice(&filled[length..]);
                            return Poll::Ready(parsed(fields, &head));
                        }
                        Ok(None) => {
                            state.pending.extend_from_slice(filled);
                            searched = Some(filled.len());
                        }
                        Err(error) => return Poll::Ready(Err(ConnectionError::Refused(error))),
                    }
                }
                Poll::Ready(Ok(())) => state.pending.extend_from_slice(read.filled()),
                Poll::Pending => {
                    if state.pending.is_empty() && cancelled.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Ok(None));
                    }
                    let timer =
                        timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                    if timer.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(ConnectionError::HeaderTimeout));
                    }
                    return Poll::Pending;
                }
            }
        }
    })
    .await
}

fn parsed(
    fields: request_head::HeadFields,
    head: &Bytes,
) -> Result<Option<ParsedHead>, ConnectionError> {
    fields
        .into_head(head)
        .map(Some)
        .map_err(ConnectionError::Refused)
}

/// Whether the client closed its end (or its connection failed): checked only once the request
/// body was read, so nothing is taken from a body still on its way. Bytes that came instead (a
/// pipelined request) are kept for the next head, up to the head size limit; the end of the
/// client's bytes behind them is a client that sent all it will (a half-close), not one that
/// left: its requests are answered first (hyper, too, looked for no end while bytes waited).
fn client_left<IO>(shared: &Mutex<Shared<IO>>, cx: &mut Context<'_>) -> bool
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut state = lock(shared);
    if !state.body_done() || state.client_finished_sending {
        return false;
    }
    while state.pending.len() < MAX_HEAD_BYTES {
        let mut stack = [MaybeUninit::<u8>::uninit(); 4096];
        let mut read = ReadBuf::uninit(&mut stack);
        match Pin::new(&mut state.io).poll_read(cx, &mut read) {
            Poll::Pending => return false,
            Poll::Ready(Err(_)) => return true,
            Poll::Ready(Ok(())) if read.filled().is_empty() => {
                if state.pending.is_empty() {
                    return true;
                }
                state.client_finished_sending = true;
                return false;
            }
            Poll::Ready(Ok(())) => state.pending.extend_from_slice(read.filled()),
        }
    }
    false
}

/// Encodes `response`'s head and stages it: the body, the head on its way, how the body is
/// framed, and whether the connection closes after it.
fn start_response<IO, B>(
    shared: &Mutex<Shared<IO>>,
    response: Response<B>,
    request: RequestFacts<'_>,
) -> Result<(B, Outgoing, Encoding, bool), ConnectionError>
where
    B: Body<Data = Bytes> + ChunkFramed,
{
    let (parts, body) = response.into_parts();
    let length = if body.is_end_stream() {
        BodyLength::None
    } else {
        body.size_hint()
            .exact()
            .map_or(BodyLength::Unknown, BodyLength::Known)
    };
    let framed = body.chunk_framed();
    let head = super::response::encode_head(&parts, length, request, framed);
    lock(shared).skip_continue();
    if framed && !matches!(head.encoding, Encoding::Chunked { .. } | Encoding::Nothing) {
        return Err(ConnectionError::Body(
            "a body in chunked framing on a response that is not chunked".into(),
        ));
    }
    let mut out = Outgoing::default();
    out.head(head.bytes);
    Ok((body, out, head.encoding, head.last))
}

/// Writes the staged head and then `body` as it comes, framed by `encoding`; a body of
/// [`Encoding::Nothing`] (HEAD, 204, 304, or empty) is never polled.
async fn write_body<IO, B>(
    shared: &Mutex<Shared<IO>>,
    mut body: B,
    mut out: Outgoing,
    encoding: Encoding,
) -> Result<(), ConnectionError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut open = encoding != Encoding::Nothing;
    poll_fn(|cx| {
        loop {
            if open && !out.has_data() {
                match Pin::new(&mut body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            let end = body.is_end_stream();
                            open = !end;
                            if !data.is_empty() || end {
                                out.data(data, encoding, end);
                            }
                        }
                    }
                    Poll::Ready(None) => {
                        open = false;
                        out.data(Bytes::new(), encoding, true);
                    }
                    Poll::Ready(Some(Err(error))) => {
                        return Poll::Ready(Err(ConnectionError::Body(error.into())));
                    }
                    Poll::Pending => {}
                }
            }
            if !out.is_empty() {
                match out.poll_write(&mut lock(shared).io, cx) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(ConnectionError::Io(error))),
                    Poll::Pending => {}
                }
            } else if !open {
                return Poll::Ready(Ok(()));
            }
            if client_left(shared, cx) {
                return Poll::Ready(Err(ConnectionError::Io(
                    io::ErrorKind::ConnectionAborted.into(),
                )));
            }
            return Poll::Pending;
        }
    })
    .await
}

/// Writes all of `bytes`.
async fn write_all<IO>(shared: &Mutex<Shared<IO>>, bytes: Vec<u8>) -> io::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Outgoing::default();
    out.head(bytes);
    poll_fn(|cx| out.poll_write(&mut lock(shared).io, cx)).await
}

/// Closes the connection's writing side (for TLS: `close_notify`); errors change nothing.
async fn close<IO>(shared: &Mutex<Shared<IO>>)
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let _ = poll_fn(|cx| Pin::new(&mut lock(shared).io).poll_shutdown(cx)).await;
}

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;
