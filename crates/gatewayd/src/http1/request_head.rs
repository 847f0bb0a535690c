//! A client's request head, parsed with `httparse` under hyper's server rules and limits, so every
//! request hyper's server took is taken the same way and every one it refused is refused with the
//! same bare answer (`400`, `414`, `431`, then the connection closes).
//!
//! The head's bytes are one exact-size allocation: the target and the header values are slices of
//! it, so nothing of the read they came in stays alive with the request.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};

/// Most header fields in a request head (hyper's default).
pub const MAX_HEADERS: usize = 100;
/// Most bytes of a request head still incomplete (hyper's default read-buffer limit, 8 KiB plus
/// 4 KiB per allowed header): a head that needs more is answered 431.
pub const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// Longest request target (hyper's): a longer one is answered 414.
const MAX_TARGET_BYTES: usize = (u16::MAX - 1) as usize;
/// What an HTTP/2 client sends first.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Why a request head was refused; each is answered with a bare status and a close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Not an HTTP/1.0 or 1.1 request head, or one with invalid framing headers: 400.
    BadRequest,
    /// More than [`MAX_HEADERS`] fields, or more than [`MAX_HEAD_BYTES`] bytes: 431.
    TooLarge,
    /// A target longer than hyper allows: 414.
    TargetTooLong,
    /// A transfer coding besides a lone `chunked` (`gzip, chunked`): gatewayd decodes none, so it
    /// cannot pass the body on as sent: 501 (RFC 9112 §6.1).
    NotImplemented,
    /// The HTTP/2 connection preface: closed without an answer, as hyper closes it.
    Http2Preface,
}

impl HeadError {
    /// The answer's status line, as hyper writes it; `None`: no answer.
    pub fn status_line(self) -> Option<&'static [u8]> {
        Some(match self {
            HeadError::BadRequest => b"HTTP/1.1 400 Bad Request\r\n",
            HeadError::TooLarge => b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
            HeadError::TargetTooLong => b"HTTP/1.1 414 URI Too Long\r\n",
            HeadError::NotImplemented => b"HTTP/1.1 501 Not Implemented\r\n",
            HeadError::Http2Preface => return None,
        })
    }
}

/// How the request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// `Content-Length` bytes (0: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub struct ParsedHead {
    /// The request, without its body.
    pub request: Request<()>,
    /// How its body is delimited.
    pub framing: BodyFraming,
    /// The client lets the connection carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for `100 Continue` before its body.
    pub expect_continue: bool,
}

#[cfg(test)]
thread_local! {
    /// How many times [`parse`] ran on this thread: tests check that a head arriving in pieces
    /// is parsed once it is whole, not once per piece.
    pub static PARSE_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// How many bytes [`blank_line_seen`] looked through on this thread: tests check that each
    /// piece of a head is searched once.
    pub static SEARCHED_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Parses the head at the start of `bytes`: `Ok(None)` while it is incomplete, else the head and
/// how many bytes it took. Leading empty lines are skipped, as hyper skips them.
pub fn parse(bytes: &[u8]) -> Result<Option<(usize, HeadFields)>, HeadError> {
    #[cfg(test)]
    PARSE_CALLS.with(|calls| calls.set(calls.get() + 1));
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    let length = match request.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => {
            return if bytes.len() > MAX_HEAD_BYTES {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) if bytes.starts_with(HTTP2_PREFACE) => return Err(HeadError::Http2Preface),
        Err(_) => return Err(HeadError::BadRequest),
    };
    if length > MAX_HEAD_BYTES {
        return Err(HeadError::TooLarge);
    }
    let target = request.path.expect("a complete head has a target");
    if target.len() > MAX_TARGET_BYTES {
        return Err(HeadError::TargetTooLong);
    }
    let base = bytes.as_ptr() as usize;
    let range = |slice: &[u8]| {
        let start = slice.as_ptr() as usize - base;
        start..start + slice.len()
    };
    let method = request.method.expect("a complete head has a method");
    let fields = request
        .headers
        .iter()
        .map(|field| (range(field.name.as_bytes()), range(field.value)))
        .collect();
    Ok(Some((
        length,
        HeadFields {
            method: range(method.as_bytes()),
            target: range(target.as_bytes()),
            http_11: request.version == Some(1),
            fields,
        },
    )))
}

/// Whether `bytes` hold a blank line (LF LF or LF CR LF: how every head httparse takes ends),
/// searching only from where an earlier search that found none stopped (`searched`: how many
/// bytes it saw), as hyper does: a head arriving in pieces is searched through once and parsed
/// once it is whole, not parsed from its first byte again per piece.
pub fn blank_line_seen(bytes: &[u8], searched: usize) -> bool {
    // The LF of a blank line the earlier search saw only part of lies at most two bytes before
    // where it stopped.
    let rest = &bytes[searched.saturating_sub(2).min(bytes.len())..];
    #[cfg(test)]
    SEARCHED_BYTES.with(|total| total.set(total.get() + rest.len()));
    memchr::memchr_iter(b'\n', rest)
        .any(|at| matches!(rest[at + 1..], [b'\n', ..] | [b'\r', b'\n', ..]))
}

/// How many bytes of empty lines (CRLF or LF) `bytes` start with: httparse skips them before a
/// request line, so they can be dropped from a head still incomplete rather than skipped again
/// at every parse.
pub fn leading_empty_lines(bytes: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match bytes[at..] {
            [b'\n', ..] => at += 1,
            [b'\r', b'\n', ..] => at += 2,
            _ => return at,
        }
    }
}

/// Where a complete head's parts lie in its bytes (what [`parse`] found, before the head is
/// copied out of the read it came in).
#[derive(Debug)]
pub struct HeadFields {
    method: std::ops::Range<usize>,
    target: std::ops::Range<usize>,
    http_11: bool,
    fields: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

impl HeadFields {
    /// The request `head` (the bytes [`parse`] was given, from their start) holds, with hyper's
    /// framing rules: `Transfer-Encoding` only in HTTP/1.1 and only ending in `chunked`, then it
    /// wins over `Content-Length` (and the connection closes after the response); every
    /// `Content-Length` all digits and all the same. Stricter than hyper, as RFC 9112 asks: a
    /// coding listed besides `chunked` is [`HeadError::NotImplemented`] (hyper dropped it toward
    /// the worker), and a second `Host` field is a bad request (§3.2).
    pub fn into_head(self, head: &Bytes) -> Result<ParsedHead, HeadError> {
        let method =
            Method::from_bytes(&head[self.method.clone()]).map_err(|_| HeadError::BadRequest)?;
        let uri = Uri::from_maybe_shared(head.slice(self.target.clone()))
            .map_err(|_| HeadError::BadRequest)?;
        let mut keep_alive = self.http_11;
        let mut framing = BodyFraming::Length(0);
        let (mut chunked, mut saw_encoding, mut saw_length) = (false, false, false);
        // Transfer codings named in all `Transfer-Encoding` fields together.
        let mut codings = 0;
        let mut saw_host = false;
        let mut length = None;
        let mut saw_close = false;
        let mut expect_continue = false;
        let mut headers = HeaderMap::with_capacity(self.fields.len());
        for (name, value) in self.fields {
            let name = HeaderName::from_bytes(&head[name]).map_err(|_| HeadError::BadRequest)?;
            // httparse checked the value's bytes; a shared slice costs no copy.
            let value = HeaderValue::from_maybe_shared(head.slice(value))
                .map_err(|_| HeadError::BadRequest)?;
            match name {
                header::TRANSFER_ENCODING => {
                    if !self.http_11 {
                        return Err(HeadError::BadRequest);
                    }
                    saw_encoding = true;
                    if saw_length && length.take().is_some() {
                        headers.remove(header::CONTENT_LENGTH);
                    }
                    chunked = last_coding_is_chunked(&value);
                    codings += value
                        .as_bytes()
                        .split(|&byte| byte == b',')
                        .filter(|coding| !coding.trim_ascii().is_empty())
                        .count();
                    if chunked {
                        framing = BodyFraming::Chunked;
                    }
                }
                header::CONTENT_LENGTH => {
                    saw_length = true;
                    if saw_encoding {
                        continue;
                    }
                    let parsed = digits(value.as_bytes()).ok_or(HeadError::BadRequest)?;
                    match length {
                        Some(previous) if previous != parsed => return Err(HeadError::BadRequest),
                        Some(_) => continue,
                        None => {
                            length = Some(parsed);
                            framing = BodyFraming::Length(parsed);
                        }
                    }
                }
                header::CONNECTION => {
                    if saw_close || has_token(&value, "close") {
                        saw_close = true;
                        keep_alive = false;
                    } else if !keep_alive {
                        keep_alive = has_token(&value, "keep-alive");
                    }
                }
                header::EXPECT => {
                    expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
                }
                header::HOST if saw_host => return Err(HeadError::BadRequest),
                header::HOST => saw_host = true,
                _ => {}
            }
            headers.append(name, value);
        }
        if saw_encoding && !chunked {
            return Err(HeadError::BadRequest);
        }
        if codings > 1 {
            return Err(HeadError::NotImplemented);
        }
        if saw_encoding && saw_length {
            keep_alive = false;
        }
        let mut request = Request::new(());
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.version_mut() = if self.http_11 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        *request.headers_mut() = headers;
        Ok(ParsedHead {
            request,
            framing,
            keep_alive,
            expect_continue,
        })
    }
}

/// A `Content-Length` value: digits only (no sign, no list), no overflow.
fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |total, &byte| {
        if !byte.is_ascii_digit() {
            return None;
        }
        total.checked_mul(10)?.checked_add(u64::from(byte - b'0'))
    })
}

/// Whether the last transfer coding named is `chunked` (it must be last in a request).
fn last_coding_is_chunked(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(|text| {
        text.rsplit(',')
            .next()
            .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked"))
    })
}

/// Whether a comma-separated header value names `token` (case-insensitive).
pub fn has_token(value: &HeaderValue, token: &str) -> bool {
    value.to_str().is_ok_and(|text| {
        text.split(',')
            .any(|item| item.trim().eq_ignore_ascii_case(token))
    })
}

#[cfg(test)]
#[path = "request_head_tests.rs"]
mod tests;
