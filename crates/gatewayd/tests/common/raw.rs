//! Raw HTTP/1.1 exchanges: bytes written verbatim to a TCP connection and whatever comes back read
//! until the server closes it, for the tests that need what no HTTP client sends (bad framing,
//! hostile headers, path tricks) or want the response exactly as it went over the wire. One async
//! form for tests on a tokio runtime, one blocking form for `#[test]`s and proptest bodies.

use std::io::{Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long an exchange waits for the server to finish its answer and close.
pub const LIMIT: Duration = Duration::from_secs(5);

/// What a raw exchange got back.
#[derive(Debug)]
pub struct RawReply {
    /// Status of the first response, if one arrived (`HTTP/1.1 NNN`).
    pub status: Option<u16>,
    /// Everything read (lossy text).
    pub text: String,
    /// The server closed the connection (EOF or reset) within the time limit.
    pub closed: bool,
    /// The reading ended in an error (a reset) rather than a clean EOF.
    pub reset: bool,
    /// The whole request was written; `false` when the server closed before taking all of it.
    pub written: bool,
}

impl RawReply {
    fn new(seen: &[u8], closed: bool, reset: bool, written: bool) -> Self {
        let text = String::from_utf8_lossy(seen).into_owned();
        let status = text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok());
        Self {
            status,
            text,
            closed,
            reset,
            written,
        }
    }

    /// What follows the first blank line (empty if there is none).
    pub fn body(&self) -> &str {
        self.text.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    /// The status and the body of a complete answer: the request was written, the server answered
    /// and closed cleanly in time. Panics (failing the test) otherwise.
    pub fn complete(&self) -> (u16, String) {
        assert!(self.written, "request not written: {:?}", self.text);
        assert!(self.closed, "no complete response in time: {:?}", self.text);
        assert!(!self.reset, "connection reset: {:?}", self.text);
        let status = self
            .status
            .unwrap_or_else(|| panic!("not an HTTP response: {:?}", self.text));
        let (_, body) = self
            .text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no end of head: {:?}", self.text));
        (status, body.to_owned())
    }
}

/// `head` (request line and headers, each ending in CRLF) with `host: localhost`,
/// `connection: close` and the `content-length` of `body` added, then `body`.
pub fn closing_request(head: &str, body: &str) -> String {
    format!(
        "{head}host: localhost\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Sends `request` verbatim while reading the reply (so a server that answers before taking the
/// whole request is seen), until the server closes or [`LIMIT`].
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> RawReply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.split();
    let write = async { writer.write_all(request).await.is_ok() };
    let mut seen = Vec::new();
    let read = read_until_closed(&mut reader, &mut seen, LIMIT);
    let (written, (closed, reset)) = tokio::join!(write, read);
    RawReply::new(&seen, closed, reset, written)
}

/// Reads whatever the server sends on `stream` until it closes (or `limit`); tolerant of a reset
/// after data.
pub async fn read_reply(stream: &mut TcpStream, limit: Duration) -> RawReply {
    let mut seen = Vec::new();
    let (closed, reset) = read_until_closed(stream, &mut seen, limit).await;
    RawReply::new(&seen, closed, reset, true)
}

/// Appends to `seen` until EOF, a read error or `limit`: (closed in time, ended by an error).
async fn read_until_closed(
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
    seen: &mut Vec<u8>,
    limit: Duration,
) -> (bool, bool) {
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(limit, async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => return false,
                Err(_) => return true,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .map_or((false, false), |reset| (true, reset))
}

/// [`exchange`] with blocking std I/O, for tests without a runtime: writes `request`, then reads
/// until the server closes (or [`LIMIT`] passes between two reads).
pub fn exchange_blocking(addr: impl ToSocketAddrs, request: &[u8]) -> RawReply {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let written = stream.write_all(request).is_ok();
    let mut seen = Vec::new();
    let ending = stream.read_to_end(&mut seen);
    let timed_out = ending.as_ref().is_err_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    });
    RawReply::new(&seen, !timed_out, ending.is_err() && !timed_out, written)
}
