//! One HTTP/1.1 exchange with a worker, written and read by the gateway itself: the request head
//! as hyper's client wrote it (same framing rules), the request body streamed, and the response
//! head parsed with `httparse` under hyper's limits (100 header fields, a 400 KiB head) and with
//! its framing rules (RFC 9112 §6.3). The response body is then relayed by
//! [`super::relay::ResponseBody`].
//!
//! Every worker response goes this way: a worker's `101` is refused (requests to workers never
//! ask for an upgrade, as `Upgrade` and `Connection` are hop-by-hop), other `1xx` heads are
//! skipped as hyper skipped them, and an HTTP/1.0 worker's responses are relayed by their
//! `Content-Length` or up to the close, as hyper read them.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::body::{BoxError, ClientBodyError, UpstreamBody};
use super::tls::WorkerStream;

/// Most header fields a worker's response head may carry (hyper's default).
pub const MAX_RESPONSE_HEADERS: usize = 100;
/// Most bytes a worker's response head may take (hyper's default read buffer limit).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// Header fields a parsed response head has room for beyond its own: the ones the proxy adds
/// (`x-bch-worker`, `x-smg-routed-worker-id`, `x-bch-branch`, `x-request-id`,
/// `x-bch-queue-wait-ms`), so adding them never grows the map.
pub const RESPONSE_HEADER_ROOM: usize = 5;
/// The first read of a response head; the buffer grows up to [`MAX_RESPONSE_HEAD_BYTES`].
const FIRST_HEAD_READ: usize = 8192;
/// Request bytes gathered before they are written (frames that are ready at once go together).
const WRITE_GATHER_LIMIT: usize = 64 * 1024;

/// A response head the gateway will not read as HTTP/1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not an HTTP/1 status line or header field; `httparse`'s words.
    #[error("invalid HTTP response: {0}")]
    Invalid(httparse::Error),
    /// More than [`MAX_RESPONSE_HEAD_BYTES`] bytes or [`MAX_RESPONSE_HEADERS`] fields.
    #[error("message head is too large")]
    TooLarge,
    /// `Content-Length` values that disagree or are not numbers.
    #[error("invalid content-length parsed")]
    ContentLength,
    /// `Transfer-Encoding` in an HTTP/1.0 response.
    #[error("unexpected transfer-encoding parsed")]
    TransferEncoding,
    /// A transfer coding besides `chunked` (`gzip, chunked`, or `gzip` alone): the gateway
    /// decodes none, and `Transfer-Encoding` is hop-by-hop, so relaying the body would hand the
    /// client coded bytes it was never told about. Envoy refuses these responses too. Also a
    /// field that names no coding at all (framing nobody can read).
    #[error("transfer-encoding other than a lone chunked")]
    TransferCoding,
    /// A `101 Switching Protocols` to a request that asked for no upgrade.
    #[error("unexpected 101 Switching Protocols")]
    Upgrade,
}

/// Why an exchange with a worker failed before its response head was complete.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The worker answered with something that is not HTTP/1.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// Reading from the worker failed (reset, TLS alert, ...).
    #[error("error reading a response from the worker")]
    Read(#[source] io::Error),
    /// Writing the request failed after some of it was written (reset, TLS alert, ...).
    #[error("error writing the request to the worker")]
    Write(#[source] io::Error),
    /// The worker closed the connection before its response head was complete.
    #[error("connection closed before message completed")]
    Closed,
    /// The client's request body failed (a [`ClientBodyError`] among the causes).
    #[error("error reading the request body")]
    Body(#[source] BoxError),
}

impl ExchangeError {
    /// The worker's response was not HTTP (as hyper's `Error::is_parse`).
    pub fn is_parse(&self) -> bool {
        matches!(self, ExchangeError::Parse(_))
    }
}

/// How a request body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestFraming {
    /// Exactly this many bytes (`Content-Length`); 0 for no body.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// The request head as hyper's client writes it: `METHOD target HTTP/1.1`, the header fields in
/// the map's order (lower case), and the framing hyper would choose: the request's own
/// `Content-Length`, or the body's exact length, or (for a body of unknown length on a method
/// that carries one) `Transfer-Encoding: chunked`. `GET`, `HEAD` and `CONNECT` send no body of
/// unknown length, as with hyper.
fn encode_head(request: &Request<UpstreamBody>) -> (Vec<u8>, RequestFraming) {
    let headers = request.headers();
    let body = request.body();
    let mut extra: Option<(HeaderName, HeaderValue)> = None;
    let mut drop_length = false;
    let framing = if body.is_end_stream() {
        RequestFraming::Length(0)
    } else if let Some(length) = content_length(headers).ok().flatten() {
        RequestFraming::Length(length)
    } else if let Some(length) = body.size_hint().exact() {
        extra = Some((header::CONTENT_LENGTH, HeaderValue::from(length)));
        drop_length = true;
        RequestFraming::Length(length)
    } else if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::CONNECT
    ) {
        RequestFraming::Length(0)
    } else {
        extra = Some((
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        ));
        drop_length = true;
        RequestFraming::Chunked
    };
    // The body's first bytes join the head when they are there at once (one write): room for
    // them too, so the buffer is allocated once, not grown.
    let body_room = match framing {
        RequestFraming::Length(length) => {
            usize::try_from(length).map_or(WRITE_GATHER_LIMIT, |l| l.min(WRITE_GATHER_LIMIT))
        }
        RequestFraming::Chunked => 0,
    };
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    // The request line, the framing field, the blank line, then the fields.
    let head_size = headers.iter().fold(
        request.method().as_str().len() + target.len() + 64,
        |size, (name, value)| size + name.as_str().len() + value.len() + 4,
    );
    let mut head = Vec::with_capacity(head_size + body_room);
    head.extend_from_slice(request.method().as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if drop_length && name == header::CONTENT_LENGTH {
            continue;
        }
        write_field(&mut head, name, value);
    }
    if let Some((name, value)) = &extra {
        write_field(&mut head, name, value);
    }
    head.extend_from_slice(b"\r\n");
    (head, framing)
}

fn write_field(head: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    head.extend_from_slice(name.as_str().as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value.as_bytes());
    head.extend_from_slice(b"\r\n");
}

/// Every `Content-Length` value (comma lists too), which must agree: `Ok(None)` without one.
pub(super) fn content_length(headers: &HeaderMap) -> Result<Option<u64>, ParseError> {
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        let value = value.to_str().map_err(|_| ParseError::ContentLength)?;
        for part in value.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(ParseError::ContentLength);
            }
            let parsed: u64 = part.parse().map_err(|_| ParseError::ContentLength)?;
            if length.is_some_and(|known| known != parsed) {
                return Err(ParseError::ContentLength);
            }
            length = Some(parsed);
        }
    }
    Ok(length)
}

/// The request on its way out: the head, then the body as it arrives, framed.
pub(super) struct RequestWriter {
    /// Framed bytes not yet written (their first `written` are out); freed once written.
    pending: Vec<u8>,
    written: usize,
    /// Some of the request reached the socket.
    wrote_any: bool,
    /// The request's head, kept until its first byte is written: an untouched request can still
    /// go to another connection ([`give_back`](Self::give_back)).
    head: Option<http::request::Parts>,
    /// `None` once its end is in `pending`.
    body: Option<UpstreamBody>,
    /// Whether the body goes out at all (hyper sends none of unknown length for `GET`).
    sends_body: bool,
    /// A frame was taken from the body: the request can no longer be given back.
    body_touched: bool,
    framing: RequestFraming,
}

impl RequestWriter {
    /// A writer for `request`, its head not yet written.
    pub(super) fn new(request: Request<UpstreamBody>) -> Self {
        let (encoded, framing) = encode_head(&request);
        let (head, body) = request.into_parts();
        Self {
            pending: encoded,
            written: 0,
            wrote_any: false,
            head: Some(head),
            sends_body: framing != RequestFraming::Length(0) && !body.is_end_stream(),
            body: Some(body),
            body_touched: false,
            framing,
        }
    }

    /// The request, if nothing of it reached the socket and its body was not read.
    pub(super) fn give_back(self) -> Option<Request<UpstreamBody>> {
        if self.wrote_any || self.body_touched {
            return None;
        }
        Some(Request::from_parts(self.head?, self.body?))
    }

    /// Writes what can be written: `Ready(Ok)` once the whole request is out.
    pub(super) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut WorkerStream,
    ) -> Poll<Result<(), WriteError>> {
        loop {
            let mut body_waits = false;
            while self.sends_body
                && let Some(body) = &mut self.body
                && self.pending.len() < WRITE_GATHER_LIMIT
            {
                let polled = Pin::new(body).poll_frame(cx);
                if polled.is_ready() {
                    self.body_touched = true;
                }
                match polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            self.append(&data).map_err(WriteError::Body)?;
                        }
                    }
                    Poll::Ready(Some(Err(error))) => {
                        return Poll::Ready(Err(WriteError::Body(error)));
                    }
                    Poll::Ready(None) => {
                        self.body = None;
                        match self.framing {
                            RequestFraming::Chunked => self.pending.extend_from_slice(b"0\r\n\r\n"),
                            RequestFraming::Length(0) => {}
                            RequestFraming::Length(_) => {
                                return Poll::Ready(Err(WriteError::Body(Box::new(
                                    ClientBodyError::Incomplete,
                                ))));
                            }
                        }
                    }
                    Poll::Pending => {
                        body_waits = true;
                        break;
                    }
                }
            }
            while self.written < self.pending.len() {
                let wrote =
                    ready!(Pin::new(&mut *io).poll_write(cx, &self.pending[self.written..]))
                        .map_err(WriteError::Io)?;
                if wrote == 0 {
                    return Poll::Ready(Err(WriteError::Io(io::ErrorKind::WriteZero.into())));
                }
                self.written += wrote;
                self.wrote_any = true;
            }
            self.pending = Vec::new();
            self.written = 0;
            self.head = None;
            ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(WriteError::Io)?;
            if !self.sends_body || self.body.is_none() {
                self.body = None;
                return Poll::Ready(Ok(()));
            }
            if body_waits {
                return Poll::Pending;
            }
        }
    }

    /// Frames `data` behind what is pending.
    fn append(&mut self, data: &Bytes) -> Result<(), BoxError> {
        if data.is_empty() {
            return Ok(());
        }
        match &mut self.framing {
            RequestFraming::Length(left) => {
                let len = data.len() as u64;
                if len > *left {
                    return Err("request body longer than its content-length".into());
                }
                *left -= len;
                self.pending.extend_from_slice(data);
            }
            RequestFraming::Chunked => {
                let mut digits = [0u8; 16];
                self.pending
                    .extend_from_slice(crate::chunked::chunk_size_digits(data.len(), &mut digits));
                self.pending.extend_from_slice(b"\r\n");
                self.pending.extend_from_slice(data);
                self.pending.extend_from_slice(b"\r\n");
            }
        }
        Ok(())
    }
}

/// Why a request could not be written.
pub(super) enum WriteError {
    /// The client's body failed.
    Body(BoxError),
    /// The socket failed.
    Io(io::Error),
}

/// A parsed response head and what follows it.
pub(super) struct ParsedHead {
    /// The head, as hyper's client gave it (a non-standard reason phrase in its extensions).
    pub response: Response<()>,
    /// How the body is framed.
    pub framing: ResponseFraming,
    /// Whether the worker lets the connection serve another request after this response.
    pub keep_alive: bool,
    /// The bytes read past the head: the body's start (a slice of the head's buffer).
    pub rest: Bytes,
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body (`HEAD`, 204, 304, `Content-Length: 0`).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Up to the connection's close.
    UntilClose,
}

/// Reads a response head from `io` into `buffer`: `Ready(Ok)` with the head, once complete.
pub(super) fn poll_head(
    cx: &mut Context<'_>,
    io: &mut WorkerStream,
    buffer: &mut BytesMut,
    method: &Method,
) -> Poll<Result<ParsedHead, ExchangeError>> {
    loop {
        if !buffer.is_empty()
            && let Some(head) = parse_head(buffer, method)?
        {
            return Poll::Ready(Ok(head));
        }
        if buffer.len() >= MAX_RESPONSE_HEAD_BYTES {
            return Poll::Ready(Err(ParseError::TooLarge.into()));
        }
        if buffer.is_empty() {
            // A request waiting for its worker's answer holds no read buffer: the first read
            // goes into the stack, and only the bytes that came are kept.
            let mut stack = [MaybeUninit::<u8>::uninit(); FIRST_HEAD_READ];
            let mut read = ReadBuf::uninit(&mut stack);
            ready!(Pin::new(&mut *io).poll_read(cx, &mut read)).map_err(ExchangeError::Read)?;
            if read.filled().is_empty() {
                return Poll::Ready(Err(ExchangeError::Closed));
            }
            buffer.extend_from_slice(read.filled());
            continue;
        }
        if buffer.capacity() == buffer.len() {
            let more = if buffer.is_empty() {
                FIRST_HEAD_READ
            } else {
                buffer.len().min(MAX_RESPONSE_HEAD_BYTES - buffer.len())
            };
            buffer.reserve(more);
        }
        let read = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut *io),
            cx,
            buffer
        ))
        .map_err(ExchangeError::Read)?;
        if read == 0 {
            return Poll::Ready(Err(ExchangeError::Closed));
        }
    }
}

/// Parses the complete head at `buffer`'s start, skipping informational (`1xx`) heads; `None`
/// while it is incomplete (`buffer` then holds what it held, but the skipped heads).
///
/// The head is parsed in the buffer made shared: its header values and the body bytes behind it
/// become slices of the one allocation instead of copies. Nothing of it outlives the response's
/// start: the server drops the head once it is encoded for the client, and the body's first poll
/// takes the bytes behind it.
fn parse_head(buffer: &mut BytesMut, method: &Method) -> Result<Option<ParsedHead>, ParseError> {
    let mut bytes = std::mem::take(buffer).freeze();
    loop {
        let mut fields =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let length = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            &bytes,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) => {
                // Unshared still: back to the buffer without a copy.
                *buffer = BytesMut::from(bytes);
                return Ok(None);
            }
            Err(httparse::Error::TooManyHeaders) => return Err(ParseError::TooLarge),
            Err(error) => return Err(ParseError::Invalid(error)),
        };
        let code = parsed.code.unwrap_or_default();
        let status =
            StatusCode::from_u16(code).map_err(|_| ParseError::Invalid(httparse::Error::Status))?;
        if code == 101 {
            return Err(ParseError::Upgrade);
        }
        if status.is_informational() {
            bytes.advance(length);
            if bytes.is_empty() {
                return Ok(None);
            }
            continue;
        }
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        let mut keep_alive = version == Version::HTTP_11;
        let mut saw_close = false;
        // Room for the fields the gateway adds to the response, so adding them never grows it.
        let mut headers = HeaderMap::with_capacity(parsed.headers.len() + RESPONSE_HEADER_ROOM);
        for field in parsed.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes())
                .map_err(|_| ParseError::Invalid(httparse::Error::HeaderName))?;
            let value = HeaderValue::from_maybe_shared(bytes.slice_ref(field.value))
                .map_err(|_| ParseError::Invalid(httparse::Error::HeaderValue))?;
            if name == header::CONNECTION {
                if saw_close || has_token(&value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(&value, "keep-alive");
                }
            }
            headers.append(name, value);
        }
        let reason = parsed
            .reason
            .filter(|reason| Some(*reason) != status.canonical_reason())
            .and_then(|reason| hyper::ext::ReasonPhrase::try_from(reason.as_bytes()).ok());
        let framing = response_framing(status, version, &headers, method)?;
        let rest = bytes.slice(length..);
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = version;
        *response.headers_mut() = headers;
        if let Some(reason) = reason {
            response.extensions_mut().insert(reason);
        }
        return Ok(Some(ParsedHead {
            response,
            keep_alive: keep_alive && framing != ResponseFraming::UntilClose,
            framing,
            rest,
        }));
    }
}

/// The body's framing by hyper's rules: none for `HEAD`, 204 and 304; chunked when
/// `Transfer-Encoding` names `chunked` and nothing else (never in HTTP/1.0; any other coding is
/// refused, where hyper read the body up to the close and left the coding to the client, which
/// the hop-by-hop field no longer named); else `Content-Length` (all values agreeing), else up
/// to the close.
fn response_framing(
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
    method: &Method,
) -> Result<ResponseFraming, ParseError> {
    if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(ResponseFraming::Empty);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            return Err(ParseError::TransferEncoding);
        }
        // Every coding of every field, in order: exactly one, `chunked`.
        let mut codings = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|value| value.as_bytes().split(|&byte| byte == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|coding| !coding.is_empty());
        let only_chunked = codings
            .next()
            .is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked"))
            && codings.next().is_none();
        return if only_chunked {
            Ok(ResponseFraming::Chunked)
        } else {
            Err(ParseError::TransferCoding)
        };
    }
    Ok(match content_length(headers)? {
        Some(0) => ResponseFraming::Empty,
        Some(length) => ResponseFraming::Length(length),
        None => ResponseFraming::UntilClose,
    })
}

/// Whether the comma-separated `value` holds `token` (ASCII case-insensitive).
fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
