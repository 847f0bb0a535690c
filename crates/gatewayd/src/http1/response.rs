//! A response on its way to the client: the head written the way hyper's server wrote it (the same
//! status line, header order, framing headers and `date`), then the body framed by length, by
//! chunks, or by the connection's close — or, for a body that comes in chunked framing already
//! (a worker's chunked body relayed, [`ChunkFramed`]), as it comes.
//!
//! Nothing stays allocated between writes: the head is one buffer freed once written, and a body
//! frame goes out from its own `Bytes` with its chunk header beside it (one vectored write), then
//! is dropped.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, StatusCode, Version, response};
use tokio::io::AsyncWrite;

use super::request_head::has_token;

/// A response body that may come in chunked framing already: its data frames are whole chunks
/// (size line, data, CRLF), never the last chunk, which the server writes at the body's end.
pub trait ChunkFramed {
    /// Whether the body's data frames are framed chunks, to be written as they are.
    fn chunk_framed(&self) -> bool {
        false
    }
}

/// How long the body is, as the server sees it before writing the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body to poll (it ended already).
    None,
    /// Exactly this many bytes.
    Known(u64),
    /// Unknown until it ends.
    Unknown,
}

/// How the body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// No body bytes at all (HEAD, 204, 304, or an empty body).
    Nothing,
    /// As the body gives them, `Content-Length` said how many.
    Length,
    /// Chunked; `framed`: the body's frames are chunks already.
    Chunked {
        /// The body's data frames are written as they are.
        framed: bool,
    },
    /// As the body gives them, then the connection closes (an HTTP/1.0 client).
    UntilClose,
}

/// What the request said that shapes its response.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// The client's HTTP version.
    pub version: Version,
    /// Whether the connection is to stay open after this response (as far as the request goes).
    pub keep_alive: bool,
}

/// An encoded response head.
pub struct EncodedHead {
    /// The head's bytes.
    pub bytes: Vec<u8>,
    /// How the body follows.
    pub encoding: Encoding,
    /// The connection closes after this response.
    pub last: bool,
}

/// Encodes `head` for `request` with hyper's rules: the client's version caps the response's
/// (an HTTP/1.0 client gets `HTTP/1.0`, `connection: keep-alive` when it asked to keep the
/// connection, and a body of unknown length delimited by the close), a connection not kept alive
/// says `connection: close` to an HTTP/1.1 client, `content-length` or `transfer-encoding: chunked`
/// follows the headers unless a `content-length` is among them, then `date`.
pub fn encode_head(
    head: &response::Parts,
    length: BodyLength,
    request: RequestFacts<'_>,
    framed: bool,
) -> EncodedHead {
    let status = head.status;
    let mut keep_alive = request.keep_alive;
    let says_keep_alive = head
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|value| has_token(value, "keep-alive"));
    // What hyper adds to `connection` (as if appended to the header map's values).
    let mut added_connection: Option<&'static str> = None;
    let version = if request.version == Version::HTTP_10 {
        if !says_keep_alive {
            if head.version == Version::HTTP_10 {
                keep_alive = false;
            } else if keep_alive {
                added_connection = Some("keep-alive");
            }
        }
        Version::HTTP_10
    } else {
        if !keep_alive
            && !head
                .headers
                .get_all(header::CONNECTION)
                .iter()
                .any(|value| has_token(value, "close"))
        {
            added_connection = Some("close");
        }
        head.version
    };
    let mut last = !keep_alive;
    let mut bytes = Vec::with_capacity(head_capacity(&head.headers));
    // A worker's own reason phrase travels as hyper's extension, as hyper's server took it.
    let reason = head
        .extensions
        .get::<hyper::ext::ReasonPhrase>()
        .map(hyper::ext::ReasonPhrase::as_bytes);
    if version == Version::HTTP_11 && status == StatusCode::OK && reason.is_none() {
        bytes.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        bytes.extend_from_slice(if version == Version::HTTP_10 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        bytes.extend_from_slice(status.as_str().as_bytes());
        bytes.push(b' ');
        bytes.extend_from_slice(
            reason.unwrap_or_else(|| status.canonical_reason().unwrap_or("<none>").as_bytes()),
        );
        bytes.extend_from_slice(b"\r\n");
    }
    let method = request.method;
    let can_chunk = version != Version::HTTP_10 && can_have_body(method, status);
    let mut wrote_date = false;
    let mut encoding = None;
    let mut wrote_connection = false;
    let mut wrote_transfer_encoding = false;
    let mut saw_content_length = false;
    // One walk over the fields in the map's order (a name's values one after another), each
    // written as it comes: no lookup per name. Only the framing and connection fields, which
    // hyper writes joined on one line, look their other values up, once.
    for (name, value) in &head.headers {
        match *name {
            header::CONTENT_LENGTH => {
                // Only the first value goes on (the parser checked that all of them agree).
                if std::mem::replace(&mut saw_content_length, true)
                    || length == BodyLength::None && method != Method::HEAD
                {
                    continue;
                }
                encoding = Some(Encoding::Length);
                write_field(&mut bytes, b"content-length", value.as_bytes());
            }
            header::TRANSFER_ENCODING if !can_chunk => {}
            header::TRANSFER_ENCODING => {
                if std::mem::replace(&mut wrote_transfer_encoding, true) {
                    continue;
                }
                encoding = Some(Encoding::Chunked { framed });
                bytes.extend_from_slice(b"transfer-encoding: ");
                join(&mut bytes, head.headers.get_all(name).iter(), None);
            }
            header::CONNECTION => {
                if std::mem::replace(&mut wrote_connection, true) {
                    continue;
                }
                let values = head.headers.get_all(name);
                if values.iter().any(|value| has_token(value, "close")) {
                    last = true;
                }
                bytes.extend_from_slice(b"connection: ");
                join(&mut bytes, values.iter(), added_connection.take());
            }
            header::DATE => {
                wrote_date = true;
                write_field(&mut bytes, b"date", value.as_bytes());
            }
            // Each value of a repeated field on a line of its own, as hyper writes them.
            _ => write_field(&mut bytes, name.as_str().as_bytes(), value.as_bytes()),
        }
    }
    if let Some(added) = added_connection
        && !wrote_connection
    {
        write_field(&mut bytes, b"connection", added.as_bytes());
    }
    let encoding = match encoding {
        Some(encoding) => encoding,
        None => match length {
            BodyLength::Unknown if can_chunk => {
                bytes.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Encoding::Chunked { framed }
            }
            BodyLength::Unknown => Encoding::UntilClose,
            BodyLength::None | BodyLength::Known(0) => {
                if can_have_content_length(method, status) && method != Method::HEAD {
                    bytes.extend_from_slice(b"content-length: 0\r\n");
                }
                Encoding::Nothing
            }
            BodyLength::Known(length) => {
                if can_have_content_length(method, status) {
                    let mut digits = itoa_buffer();
                    write_field(
                        &mut bytes,
                        b"content-length",
                        format_u64(length, &mut digits),
                    );
                    Encoding::Length
                } else {
                    Encoding::Nothing
                }
            }
        },
    };
    let encoding = if can_have_body(method, status) && length != BodyLength::None {
        encoding
    } else {
        Encoding::Nothing
    };
    if !wrote_date {
        bytes.extend_from_slice(b"date: ");
        with_date(|date| bytes.extend_from_slice(date));
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"\r\n");
    if encoding == Encoding::UntilClose {
        last = true;
    }
    EncodedHead {
        bytes,
        encoding,
        last,
    }
}

/// The bare answer to a refused request head (`status_line` included): hyper's, then a close.
pub fn bare_answer(status_line: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(128);
    bytes.extend_from_slice(status_line);
    bytes.extend_from_slice(b"connection: close\r\ncontent-length: 0\r\ndate: ");
    with_date(|date| bytes.extend_from_slice(date));
    bytes.extend_from_slice(b"\r\n\r\n");
    bytes
}

/// Whether a response to `method` with `status` has a body (hyper's `can_chunked`).
fn can_have_body(method: &Method, status: StatusCode) -> bool {
    !(method == Method::HEAD
        || method == Method::CONNECT && status.is_success()
        || status.is_informational()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED))
}

fn can_have_content_length(method: &Method, status: StatusCode) -> bool {
    !(status.is_informational()
        || method == Method::CONNECT && status.is_success()
        || matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED))
}

/// Bytes an encoded head of `headers` takes (unless a worker's own reason phrase makes its status
/// line long), so the head's buffer is allocated once at its size instead of grown as it is
/// written.
fn head_capacity(headers: &http::HeaderMap) -> usize {
    // The status line, the framing and `connection` fields the server may add, `date`, the
    // blank line.
    const FIXED: usize = 64 + 64 + 37 + 2;
    headers.iter().fold(FIXED, |total, (name, value)| {
        total + name.as_str().len() + value.len() + 4
    })
}

fn write_field(bytes: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(b": ");
    bytes.extend_from_slice(value);
    bytes.extend_from_slice(b"\r\n");
}

/// A field's values joined by `, ` (hyper writes a repeated field on one line), then CRLF.
fn join<'a>(
    bytes: &mut Vec<u8>,
    values: impl Iterator<Item = &'a HeaderValue>,
    added: Option<&'a str>,
) {
    let mut first = true;
    for value in values
        .map(HeaderValue::as_bytes)
        .chain(added.map(str::as_bytes))
    {
        if !first {
            bytes.extend_from_slice(b", ");
        }
        first = false;
        bytes.extend_from_slice(value);
    }
    bytes.extend_from_slice(b"\r\n");
}

fn itoa_buffer() -> [u8; 20] {
    [0; 20]
}

/// `value` in decimal, written at the end of `buffer`.
fn format_u64(mut value: u64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut start = buffer.len();
    loop {
        start -= 1;
        buffer[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buffer[start..];
        }
    }
}

thread_local! {
    /// The `date` value of the current second (formatting one costs more than a response's
    /// other headers together, so each thread formats it once a second, as hyper does).
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Calls `f` with the current `date` header value (IMF-fixdate, 29 bytes).
fn with_date<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != second {
            let text = httpdate::fmt_http_date(now);
            let length = text.len().min(29);
            cached.1[..length].copy_from_slice(&text.as_bytes()[..length]);
            cached.0 = second;
        }
        f(&cached.1)
    })
}

/// Bytes on their way to the client: a head, a chunk header, a frame's data and what closes the
/// chunk (or the body), written together with one vectored write where the socket allows.
#[derive(Default)]
pub struct Outgoing {
    head: Vec<u8>,
    chunk_header: [u8; 18],
    chunk_header_length: u8,
    data: Bytes,
    tail: &'static [u8],
    /// Bytes of the four pieces above already written.
    written: usize,
}

impl Outgoing {
    /// Stages a response head.
    pub fn head(&mut self, head: Vec<u8>) {
        self.head = head;
    }

    /// Whether a frame's data is staged (a head alone may be).
    pub fn has_data(&self) -> bool {
        !self.data.is_empty() || !self.tail.is_empty()
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && !self.has_data()
    }

    /// Stages a data frame, framed by `encoding`; `last` when the body ends with it.
    pub fn data(&mut self, data: Bytes, encoding: Encoding, last: bool) {
        debug_assert!(!self.has_data());
        if let Encoding::Chunked { framed: false } = encoding
            && !data.is_empty()
        {
            let mut digits = [0u8; 16];
            let header = crate::chunked::chunk_size_digits(data.len(), &mut digits);
            self.chunk_header[..header.len()].copy_from_slice(header);
            self.chunk_header[header.len()..header.len() + 2].copy_from_slice(b"\r\n");
            self.chunk_header_length = (header.len() + 2) as u8;
            self.tail = if last { b"\r\n0\r\n\r\n" } else { b"\r\n" };
        } else if matches!(encoding, Encoding::Chunked { .. }) && last {
            self.tail = b"0\r\n\r\n";
        }
        self.data = data;
    }

    /// Writes everything staged, then flushes; `Ready(Ok)` once all of it is out (and nothing
    /// stays allocated).
    pub fn poll_write<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let pieces: [&[u8]; 4] = [
                &self.head,
                &self.chunk_header[..usize::from(self.chunk_header_length)],
                &self.data,
                self.tail,
            ];
            let total: usize = pieces.iter().map(|piece| piece.len()).sum();
            if self.written >= total {
                break;
            }
            let mut skip = self.written;
            let mut slices = [IoSlice::new(&[]); 4];
            let mut count = 0;
            for piece in pieces {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                slices[count] = IoSlice::new(&piece[skip..]);
                skip = 0;
                count += 1;
            }
            let wrote = if io.is_write_vectored() {
                ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?
            } else {
                ready!(Pin::new(&mut *io).poll_write(cx, &slices[0]))?
            };
            if wrote == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += wrote;
        }
        ready!(Pin::new(&mut *io).poll_flush(cx))?;
        *self = Outgoing::default();
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
