//! HTTP/1 on the data plane's client side, as it looks on the wire: keep-alive and closing,
//! HTTP/1.0, pipelining, `Expect: 100-continue`, `HEAD`, heads the parser refuses, request bodies
//! split across writes, response framing and header fields, the header read timeout and graceful
//! shutdown. Each test writes raw bytes and reads raw bytes back, so whatever serves the client's
//! connection is held to the same observable behaviour. (Bodies the client breaks, the connection
//! cap and clients that stop reading are `client_faults.rs`'s; the worker's side of the framing is
//! `upstream_framing.rs`'s and `relay.rs`'s.)

use std::net::SocketAddr;
use std::time::Duration;

use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::common::*;

/// How long a test waits for bytes it expects (an answer, a close).
const WAIT: Duration = Duration::from_secs(5);

/// How a response's body was framed on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Framing {
    /// No body by the rules (`HEAD`, 1xx, 204, 304).
    Bodiless,
    /// `Content-Length`.
    Length(usize),
    /// `Transfer-Encoding: chunked`, with the payload of each chunk.
    Chunked(Vec<Vec<u8>>),
    /// Neither: the body ran until the server closed.
    UntilClose,
}

/// One response as read off the wire.
#[derive(Debug)]
struct Reply {
    /// `1` for `HTTP/1.1`, `0` for `HTTP/1.0`.
    version: u8,
    status: u16,
    reason: String,
    /// Header fields in wire order, names lower-cased.
    headers: Vec<(String, String)>,
    framing: Framing,
    /// The body's bytes (chunked framing removed).
    body: Vec<u8>,
}

impl Reply {
    /// Every value of header `name`, in order.
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The single value of header `name` (`None` when absent; panics when repeated).
    fn header(&self, name: &str) -> Option<&str> {
        let all = self.all(name);
        assert!(all.len() <= 1, "{name} repeated: {:?}", self.headers);
        all.first().copied()
    }

    /// Whether the body is chunked by its head.
    fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    }

    /// The body as the fake worker's echo JSON (method, uri, headers and body it received).
    fn echo(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not an echo ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// A raw client connection: bytes out verbatim, responses parsed as they come back.
struct Wire {
    stream: TcpStream,
    /// Read but not yet consumed.
    buffer: Vec<u8>,
}

impl Wire {
    async fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        // Each `send` leaves at once, so a body written in pieces arrives in pieces.
        stream.set_nodelay(true).unwrap();
        Self {
            stream,
            buffer: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.stream.write_all(bytes.as_ref()).await.unwrap();
    }

    /// Reads more into the buffer; `false` at EOF or on a reset. Panics if nothing comes in time.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(WAIT, self.stream.read(&mut chunk)).await {
            Err(_) => panic!(
                "nothing more within {WAIT:?}; have {:?}",
                String::from_utf8_lossy(&self.buffer)
            ),
            Ok(Ok(0) | Err(_)) => false,
            Ok(Ok(n)) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Reads the next response head; its body is left for [`Self::body`] or
    /// [`Self::next_chunk`].
    async fn head(&mut self) -> Reply {
        loop {
            let mut fields = [httparse::EMPTY_HEADER; 128];
            let mut parsed = httparse::Response::new(&mut fields);
            match parsed.parse(&self.buffer) {
                Ok(httparse::Status::Complete(consumed)) => {
                    let reply = Reply {
                        version: parsed.version.unwrap(),
                        status: parsed.code.unwrap(),
                        reason: parsed.reason.unwrap_or_default().to_owned(),
                        headers: parsed
                            .headers
                            .iter()
                            .map(|h| {
                                let value = String::from_utf8_lossy(h.value).into_owned();
                                (h.name.to_ascii_lowercase(), value)
                            })
                            .collect(),
                        framing: Framing::Bodiless,
                        body: Vec::new(),
                    };
                    self.buffer.drain(..consumed);
                    return reply;
                }
                Ok(httparse::Status::Partial) => {
                    let have = String::from_utf8_lossy(&self.buffer).into_owned();
                    assert!(self.fill().await, "closed before a whole head: {have:?}");
                }
                Err(e) => panic!(
                    "not a response head ({e}): {:?}",
                    String::from_utf8_lossy(&self.buffer)
                ),
            }
        }
    }

    /// The next chunk's payload of a chunked body; `None` at the last chunk (its trailer section
    /// consumed, which must be empty).
    async fn next_chunk(&mut self) -> Option<Vec<u8>> {
        let (line, size) = loop {
            match httparse::parse_chunk_size(&self.buffer) {
                Ok(httparse::Status::Complete(parsed)) => break parsed,
                Ok(httparse::Status::Partial) => {
                    assert!(self.fill().await, "closed inside a chunk size line");
                }
                Err(e) => panic!(
                    "bad chunk size line ({e:?}): {:?}",
                    String::from_utf8_lossy(&self.buffer)
                ),
            }
        };
        let size = usize::try_from(size).unwrap();
        while self.buffer.len() < line + size + 2 {
            assert!(self.fill().await, "closed inside a chunk");
        }
        assert_eq!(
            &self.buffer[line + size..line + size + 2],
            b"\r\n",
            "a chunk (or the trailer section) not ended by CRLF: {:?}",
            String::from_utf8_lossy(&self.buffer)
        );
        let payload = self.buffer[line..line + size].to_vec();
        self.buffer.drain(..line + size + 2);
        (size > 0).then_some(payload)
    }

    /// Reads the body that follows `reply`'s head (of a response to a `HEAD` when `head`).
    async fn body(&mut self, reply: &mut Reply, head: bool) {
        let status = reply.status;
        if head || status < 200 || status == 204 || status == 304 {
            reply.framing = Framing::Bodiless;
        } else if reply.chunked() {
            let mut chunks = Vec::new();
            while let Some(chunk) = self.next_chunk().await {
                chunks.push(chunk);
            }
            reply.body = chunks.concat();
            reply.framing = Framing::Chunked(chunks);
        } else if let Some(length) = reply.header("content-length") {
            let length: usize = length.parse().unwrap();
            while self.buffer.len() < length {
                assert!(self.fill().await, "closed inside a content-length body");
            }
            reply.body = self.buffer.drain(..length).collect();
            reply.framing = Framing::Length(length);
        } else {
            while self.fill().await {}
            reply.body = std::mem::take(&mut self.buffer);
            reply.framing = Framing::UntilClose;
        }
    }

    /// The next whole response (to a `HEAD` when `head`).
    async fn response(&mut self, head: bool) -> Reply {
        let mut reply = self.head().await;
        self.body(&mut reply, head).await;
        reply
    }

    /// Everything the server still sends until it closes; panics if it keeps the connection
    /// open past [`WAIT`].
    async fn rest(&mut self) -> String {
        let mut chunk = [0u8; 4096];
        loop {
            match tokio::time::timeout(WAIT, self.stream.read(&mut chunk)).await {
                Err(_) => panic!(
                    "still open after {WAIT:?}, having sent {:?}",
                    String::from_utf8_lossy(&self.buffer)
                ),
                Ok(Ok(0) | Err(_)) => {
                    return String::from_utf8_lossy(&std::mem::take(&mut self.buffer)).into_owned();
                }
                Ok(Ok(n)) => self.buffer.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Waits (bounded) for the server to close the connection without sending anything more.
    async fn closes(&mut self) {
        assert_eq!(self.rest().await, "", "bytes before the close");
    }
}

/// `GET path` on HTTP/1.1 with a `host` and the header lines `extra` (each ending in CRLF).
fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n{extra}\r\n")
}

/// What the fake worker's `/sse?n=N` sends: `n` events, then `[DONE]`.
fn sse_events(n: usize) -> Vec<u8> {
    let mut events: String = (0..n)
        .map(|i| format!("data: {{\"chunk\":{i}}}\n\n"))
        .collect();
    events.push_str("data: [DONE]\n\n");
    events.into_bytes()
}

/// Requests the fake worker has answered (health probes excluded).
fn requests(worker: &FakeWorker) -> u64 {
    worker
        .state
        .requests
        .load(std::sync::atomic::Ordering::SeqCst)
}

/// A gateway in front of one fake worker (`w`), `tune`d.
async fn gateway(tune: impl FnOnce(&mut Config)) -> (FakeWorker, RunningGateway) {
    let worker = fake_worker("w").await;
    let mut config = test_config(&[&worker]);
    tune(&mut config);
    let gateway = start(config).await;
    (worker, gateway)
}

/// A gateway in front of a worker that answers each request (by its request line) with the bytes
/// `answer` gives, as they are; health probes get an empty 200. Requests carry no body; each
/// connection is kept for the next request.
async fn scripted(answer: fn(&str) -> &'static [u8]) -> RunningGateway {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).into_owned();
                    seen.drain(..end + 4);
                    let line = head.lines().next().unwrap_or_default();
                    let out: &[u8] = if line.starts_with("GET /health ") {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                    } else {
                        answer(line)
                    };
                    if stream.write_all(out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut config = test_config(&[]);
    config.workers = vec![WorkerConfig {
        name: Some("scripted".into()),
        ..WorkerConfig::from_url(&url)
    }];
    start(config).await
}

/// HTTP/1.1 keeps the connection for the next request without saying so; `Connection: close`
/// (any case) ends it after the answer, which says `connection: close`.
#[tokio::test]
async fn keep_alive_and_connection_close() {
    let (_worker, gateway) = gateway(|_| {}).await;
    let mut wire = Wire::open(gateway.data_addr).await;
    for n in 1..=2 {
        wire.send(get(&format!("/echo?n={n}"), "")).await;
        let reply = wire.response(false).await;
        assert_eq!((reply.version, reply.status), (1, 200));
        assert_eq!(reply.header("connection"), None);
        assert_eq!(reply.framing, Framing::Length(reply.body.len()));
        assert_eq!(reply.echo()["uri"], format!("/echo?n={n}"));
    }
    wire.send(get("/echo?n=3", "Connection: Close\r\n")).await;
    let reply = wire.response(false).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connection"), Some("close"));
    assert_eq!(reply.echo()["uri"], "/echo?n=3");
    wire.closes().await;
    gateway.shutdown().await;
}

/// HTTP/1.0 is answered in HTTP/1.0 and never chunked: a streamed body runs until the close. The
/// connection closes after the answer unless the client asked for `Connection: keep-alive` and
/// the answer has a length; then the answer says `connection: keep-alive` and the next request
/// is served.
#[tokio::test]
async fn http_1_0_clients() {
    let (_worker, gateway) = gateway(|_| {}).await;
    let data = gateway.data_addr;
    let mut wire = Wire::open(data).await;
    wire.send("GET /echo HTTP/1.0\r\n\r\n").await;
    let reply = wire.response(false).await;
    assert_eq!((reply.version, reply.status), (0, 200));
    assert_eq!(reply.header("connection"), None);
    assert_eq!(reply.framing, Framing::Length(reply.body.len()));
    assert_eq!(reply.echo()["method"], "GET");
    wire.closes().await;

    // The worker's chunked stream, with and without keep-alive: close-delimited either way. (The
    // `connection` field of the keep-alive one is not pinned: it says `keep-alive`, then closes.)
    for keep_alive in ["", "connection: keep-alive\r\n"] {
        let mut wire = Wire::open(data).await;
        wire.send(format!(
            "GET /sse?n=3&gap_ms=1 HTTP/1.0\r\n{keep_alive}\r\n"
        ))
        .await;
        let reply = wire.response(false).await;
        assert_eq!((reply.version, reply.status), (0, 200), "{keep_alive}");
        assert_eq!(reply.header("transfer-encoding"), None, "{keep_alive}");
        assert_eq!(reply.header("content-length"), None, "{keep_alive}");
        assert_eq!(reply.framing, Framing::UntilClose, "{keep_alive}");
        assert_eq!(
            String::from_utf8_lossy(&reply.body),
            String::from_utf8_lossy(&sse_events(3)),
            "{keep_alive}"
        );
    }

    let mut wire = Wire::open(data).await;
    for n in 1..=2 {
        wire.send(format!(
            "GET /echo?n={n} HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"
        ))
        .await;
        let reply = wire.response(false).await;
        assert_eq!((reply.version, reply.status), (0, 200));
        assert_eq!(reply.header("connection"), Some("keep-alive"));
        assert_eq!(reply.framing, Framing::Length(reply.body.len()));
        assert_eq!(reply.echo()["uri"], format!("/echo?n={n}"));
    }
    wire.send("GET /echo?n=3 HTTP/1.0\r\n\r\n").await;
    let reply = wire.response(false).await;
    assert_eq!((reply.version, reply.status), (0, 200));
    assert_eq!(reply.header("connection"), None);
    wire.closes().await;
    gateway.shutdown().await;
}

/// Requests written together (two, then three: a stream first, a body in the middle) are
/// answered one after the other, in order, each body whole.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (_worker, gateway) = gateway(|_| {}).await;
    let mut wire = Wire::open(gateway.data_addr).await;
    wire.send(format!("{}{}", get("/echo?n=1", ""), get("/echo?n=2", "")))
        .await;
    for n in 1..=2 {
        let reply = wire.response(false).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.echo()["uri"], format!("/echo?n={n}"));
    }

    let post = "POST /echo?n=4 HTTP/1.1\r\nhost: localhost\r\ncontent-length: 5\r\n\r\nhello";
    let last = get("/echo?n=5", "connection: close\r\n");
    wire.send(format!("{}{post}{last}", get("/sse?n=4&gap_ms=5", "")))
        .await;
    let stream = wire.response(false).await;
    assert_eq!(stream.status, 200);
    assert!(stream.chunked(), "{:?}", stream.headers);
    assert_eq!(stream.body, sse_events(4));
    let posted = wire.response(false).await;
    assert_eq!(posted.status, 200);
    assert_eq!(posted.echo()["uri"], "/echo?n=4");
    assert_eq!(posted.echo()["body"], "hello");
    let reply = wire.response(false).await;
    assert_eq!(reply.echo()["uri"], "/echo?n=5");
    assert_eq!(reply.header("connection"), Some("close"));
    wire.closes().await;
    gateway.shutdown().await;
}

/// `Expect: 100-continue`: the client gets a bare `HTTP/1.1 100 Continue` while it holds its body
/// back, then, once it sent the body, the worker's answer (one: the worker's own `100` is not
/// passed on); the connection stays open.
#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let (_worker, gateway) = gateway(|_| {}).await;
    let mut wire = Wire::open(gateway.data_addr).await;
    wire.send(
        "POST /echo HTTP/1.1\r\nhost: localhost\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n",
    )
    .await;
    let interim = wire.response(false).await;
    assert_eq!(
        (interim.version, interim.status, interim.reason.as_str()),
        (1, 100, "Continue")
    );
    assert_eq!(interim.headers, Vec::<(String, String)>::new());
    wire.send("hello").await;
    let reply = wire.response(false).await;
    assert_eq!(reply.status, 200);
    let echo = reply.echo();
    assert_eq!(echo["body"], "hello");
    assert_eq!(echo["headers"]["content-length"], "5");
    // The expectation is forwarded as it came (the worker's own `100` is the gateway's to read).
    assert_eq!(echo["headers"]["expect"], "100-continue");
    wire.send(get("/echo?after=continue", "")).await;
    assert_eq!(
        wire.response(false).await.echo()["uri"],
        "/echo?after=continue"
    );
    gateway.shutdown().await;
}

/// `HEAD` goes through to the worker: its headers (a JSON answer's `content-length`; a stream's
/// answer carries no framing header) and no body byte; the connection serves the next request.
#[tokio::test]
async fn head_requests_get_the_workers_headers_and_no_body() {
    let (worker, gateway) = gateway(|_| {}).await;
    let mut wire = Wire::open(gateway.data_addr).await;
    wire.send("HEAD /echo HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await;
    let reply = wire.response(true).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert!(
        reply.header("content-length").is_some_and(|l| l != "0"),
        "{:?}",
        reply.headers
    );
    assert_eq!(reply.header("x-worker-name"), Some("w"));
    wire.send("HEAD /sse HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await;
    let reply = wire.response(true).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    assert_eq!(reply.header("transfer-encoding"), None);
    assert_eq!(reply.header("content-length"), None);
    // Had either answer carried a body byte, this would not parse as the next answer.
    wire.send(get("/echo?after=head", "")).await;
    assert_eq!(wire.response(false).await.echo()["uri"], "/echo?after=head");
    assert_eq!(requests(&worker), 3);
    gateway.shutdown().await;
}

/// Heads the parser refuses are answered with a bare `400`, `414`, `431` or `501` (`connection:
/// close`, no body) and the connection closed; no worker sees them.
#[tokio::test]
async fn unparsable_heads_get_a_bare_refusal_and_the_close() {
    let (worker, gateway) = gateway(|_| {}).await;
    let data = gateway.data_addr;
    let many_fields: String = (0..100).map(|i| format!("x-pad-{i}: {i}\r\n")).collect();
    let cases = [
        (
            "a request line without a version",
            "GET /echo\r\nhost: x\r\n\r\n".to_owned(),
            400,
        ),
        ("no request line", "GARBAGE\r\n\r\n".to_owned(), 400),
        (
            "a header line without a colon",
            "GET /echo HTTP/1.1\r\nhost: x\r\nno-colon\r\n\r\n".to_owned(),
            400,
        ),
        (
            "101 header fields",
            format!("GET /echo HTTP/1.1\r\nhost: x\r\n{many_fields}\r\n"),
            431,
        ),
        (
            "a head over 400 KiB",
            format!(
                "GET /echo HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
                "a".repeat(500_000)
            ),
            431,
        ),
        (
            "two different content-lengths",
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd"
                .to_owned(),
            400,
        ),
        (
            "a content-length that is no number",
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3a\r\n\r\nabc".to_owned(),
            400,
        ),
        (
            "a transfer-encoding not ending in chunked",
            "POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\nabc".to_owned(),
            400,
        ),
        (
            "a coding before chunked",
            "POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".to_owned(),
            501,
        ),
        (
            "a coding before chunked, in two fields",
            "POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".to_owned(),
            501,
        ),
        (
            "two host fields",
            "GET /echo HTTP/1.1\r\nhost: x\r\nhost: y\r\n\r\n".to_owned(),
            400,
        ),
        (
            "a content-length list",
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3, 3\r\n\r\nabc".to_owned(),
            400,
        ),
        (
            "a signed content-length",
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: +3\r\n\r\nabc".to_owned(),
            400,
        ),
        (
            "transfer-encoding in HTTP/1.0",
            "POST /echo HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                .to_owned(),
            400,
        ),
        (
            "a folded header line",
            "GET /echo HTTP/1.1\r\nhost: x\r\nx-a: b\r\n  c\r\n\r\n".to_owned(),
            400,
        ),
        (
            "white space before a colon",
            "GET /echo HTTP/1.1\r\nhost : x\r\n\r\n".to_owned(),
            400,
        ),
        (
            "a NUL in a value",
            "GET /echo HTTP/1.1\r\nhost: x\r\nx-a: b\0c\r\n\r\n".to_owned(),
            400,
        ),
        (
            "a space in the target",
            "GET /e cho HTTP/1.1\r\nhost: x\r\n\r\n".to_owned(),
            400,
        ),
        (
            "HTTP/1.2",
            "GET /echo HTTP/1.2\r\nhost: x\r\n\r\n".to_owned(),
            400,
        ),
        (
            "HTTP/2.0",
            "GET /echo HTTP/2.0\r\nhost: x\r\n\r\n".to_owned(),
            400,
        ),
        (
            "a target over 64 KiB",
            format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)),
            414,
        ),
    ];
    for (case, request, status) in cases {
        let reply = raw::exchange(data, request.as_bytes()).await;
        assert_eq!(reply.status, Some(status), "{case}: {:?}", reply.text);
        assert!(reply.closed, "{case}: not closed");
        let head = reply.text.split_once("\r\n\r\n").map_or("", |(h, _)| h);
        let mut fields: Vec<&str> = head.lines().skip(1).collect();
        fields.sort_unstable();
        assert_eq!(fields.len(), 3, "{case}: {head:?}");
        assert_eq!(fields[0], "connection: close", "{case}");
        assert_eq!(fields[1], "content-length: 0", "{case}");
        assert!(fields[2].starts_with("date: "), "{case}: {head:?}");
        assert_eq!(reply.body(), "", "{case}");
    }
    // The HTTP/2 preface gets no answer at all.
    let reply = raw::exchange(data, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    assert!(reply.closed && reply.text.is_empty(), "{reply:?}");
    assert_eq!(requests(&worker), 0);
    gateway.shutdown().await;
}

/// Framing headers the parser takes: `Content-Length` beside `Transfer-Encoding: chunked` (the
/// chunked body is read, the length dropped, and the connection closed after the answer, so
/// nothing smuggled behind it is served), and the same `Content-Length` twice (one value).
#[tokio::test]
async fn conflicting_framing_headers_the_parser_takes() {
    let (worker, gateway) = gateway(|_| {}).await;
    let mut wire = Wire::open(gateway.data_addr).await;
    wire.send(format!(
        "POST /echo HTTP/1.1\r\nhost: localhost\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n{}",
        get("/echo?smuggled", "")
    ))
    .await;
    let reply = wire.response(false).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connection"), Some("close"));
    let echo = reply.echo();
    assert_eq!(echo["body"], "abc");
    assert_eq!(echo["headers"]["transfer-encoding"], "chunked");
    assert_eq!(echo["headers"].get("content-length"), None, "{echo}");
    wire.closes().await;

    let mut wire = Wire::open(gateway.data_addr).await;
    wire.send("POST /echo HTTP/1.1\r\nhost: localhost\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc")
        .await;
    let reply = wire.response(false).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connection"), None);
    assert_eq!(reply.echo()["body"], "abc");
    assert_eq!(reply.echo()["headers"]["content-length"], "3");
    wire.send(get("/echo?after=lengths", "")).await;
    assert_eq!(
        wire.response(false).await.echo()["uri"],
        "/echo?after=lengths"
    );
    assert_eq!(requests(&worker), 3);
    gateway.shutdown().await;
}

/// Request bodies reach the worker whole however the client frames and paces them: chunked with
/// extensions and a trailer (the worker gets the payload, chunked; the trailer is not forwarded
/// and never becomes a header), chunked one byte per write, content-length in pieces. The
/// connection serves the next request after each.
#[tokio::test]
async fn request_bodies_reach_the_worker_whole() {
    let (_worker, gateway) = gateway(|_| {}).await;
    let mut wire = Wire::open(gateway.data_addr).await;
    let head = |path: &str, framing: &str| {
        format!("POST {path} HTTP/1.1\r\nhost: localhost\r\n{framing}\r\n")
    };
    wire.send(head("/echo?n=1", "transfer-encoding: chunked\r\n"))
        .await;
    wire.send("3;ext=1\r\nabc\r\n2;a=b;c=\"d e\"\r\nde\r\n0\r\nx-trailer: t\r\n\r\n")
        .await;
    let echo = wire.response(false).await.echo();
    assert_eq!(
        (echo["uri"].as_str(), echo["body"].as_str()),
        (Some("/echo?n=1"), Some("abcde"))
    );
    assert_eq!(echo["headers"]["transfer-encoding"], "chunked");
    assert_eq!(echo["headers"].get("content-length"), None, "{echo}");
    assert_eq!(echo["headers"].get("x-trailer"), None, "{echo}");

    // Chunk sizes in hex, upper and lower case, the payload 300 bytes; one byte per write.
    let payload: String = (0..300)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut framed = String::new();
    for piece in [&payload[..26], &payload[26..200], &payload[200..]] {
        framed.push_str(&format!("{:X}\r\n{piece}\r\n", piece.len()));
    }
    framed.push_str("0\r\n\r\n");
    wire.send(head("/echo?n=2", "transfer-encoding: chunked\r\n"))
        .await;
    for byte in framed.as_bytes() {
        wire.send([*byte]).await;
    }
    let echo = wire.response(false).await.echo();
    assert_eq!(echo["uri"], "/echo?n=2");
    assert_eq!(echo["body"], payload);

    wire.send(head("/echo?n=3", "content-length: 300\r\n"))
        .await;
    for piece in payload.as_bytes().chunks(7) {
        wire.send(piece).await;
    }
    let echo = wire.response(false).await.echo();
    assert_eq!(echo["uri"], "/echo?n=3");
    assert_eq!(echo["body"], payload);
    assert_eq!(echo["headers"]["content-length"], "300");
    assert_eq!(echo["headers"].get("transfer-encoding"), None, "{echo}");
    gateway.shutdown().await;
}

/// The worker's framing reaches the client: its chunked event stream as chunked (the same event
/// bytes once the framing is removed, no empty chunk before the last), a `Content-Length` answer
/// with its length, a `204` with neither and no body; the connection serves the next request.
#[tokio::test]
async fn worker_answers_keep_their_framing() {
    let (_worker, gateway) = gateway(|_| {}).await;
    let mut wire = Wire::open(gateway.data_addr).await;
    wire.send(get("/sse?n=5&gap_ms=2", "")).await;
    let reply = wire.response(false).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    assert_eq!(reply.header("content-length"), None);
    let Framing::Chunked(chunks) = &reply.framing else {
        panic!("not chunked: {:?}", reply.headers);
    };
    assert!(chunks.iter().all(|c| !c.is_empty()));
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        String::from_utf8_lossy(&sse_events(5))
    );

    wire.send(get("/echo", "")).await;
    let reply = wire.response(false).await;
    assert_eq!(reply.header("transfer-encoding"), None);
    assert_eq!(reply.framing, Framing::Length(reply.body.len()));
    assert_eq!(reply.echo()["uri"], "/echo");

    wire.send(get("/status/204", "")).await;
    let reply = wire.response(false).await;
    assert_eq!((reply.status, reply.reason.as_str()), (204, "No Content"));
    assert_eq!(reply.header("content-length"), None);
    assert_eq!(reply.header("transfer-encoding"), None);
    wire.send(get("/echo?after=204", "")).await;
    assert_eq!(wire.response(false).await.echo()["uri"], "/echo?after=204");
    gateway.shutdown().await;
}

/// The worker's status line and header fields arrive as it sent them (its reason phrase too),
/// repeated ones (`set-cookie`) each on its own line in order, but not its `connection` and
/// `keep-alive`. `date`: the worker's passes through; without one, the answer gets one.
#[tokio::test]
async fn worker_header_fields_arrive_as_sent() {
    let gateway = scripted(|line| {
        if line.starts_with("GET /dated ") {
            b"HTTP/1.1 200 OK\r\ndate: Sat, 01 Jan 2000 00:00:00 GMT\r\ncontent-length: 2\r\n\r\nok"
        } else if line.starts_with("GET /reason ") {
            b"HTTP/1.1 200 Fine\r\ncontent-length: 2\r\n\r\nok"
        } else if line.starts_with("GET /closing ") {
            b"HTTP/1.1 200 OK\r\nconnection: close\r\nkeep-alive: timeout=5\r\ncontent-length: 2\r\n\r\nok"
        } else {
            b"HTTP/1.1 201 Created\r\nset-cookie: a=1; Path=/\r\nx-multi: one\r\nset-cookie: b=2\r\nx-multi: two\r\ncontent-length: 2\r\n\r\nok"
        }
    })
    .await;
    let mut wire = Wire::open(gateway.data_addr).await;
    wire.send(get("/cookies", "")).await;
    let reply = wire.response(false).await;
    assert_eq!((reply.status, reply.reason.as_str()), (201, "Created"));
    assert_eq!(reply.all("set-cookie"), ["a=1; Path=/", "b=2"]);
    assert_eq!(reply.all("x-multi"), ["one", "two"]);
    assert_eq!(reply.body, b"ok");
    let date = reply.header("date").expect("a date");
    assert!(
        date.ends_with(" GMT") && date != "Sat, 01 Jan 2000 00:00:00 GMT",
        "{date}"
    );

    wire.send(get("/dated", "")).await;
    let reply = wire.response(false).await;
    assert_eq!(reply.header("date"), Some("Sat, 01 Jan 2000 00:00:00 GMT"));
    wire.send(get("/reason", "")).await;
    assert_eq!(wire.response(false).await.reason, "Fine");
    // The worker's hop-by-hop fields are its connection's, not the client's.
    wire.send(get("/closing", "")).await;
    let reply = wire.response(false).await;
    assert_eq!(reply.header("connection"), None);
    assert_eq!(reply.header("keep-alive"), None);
    assert_eq!(reply.body, b"ok");
    wire.send(get("/cookies", "")).await;
    assert_eq!(wire.response(false).await.status, 201);
    gateway.shutdown().await;
}

/// A client that sends half a head and stops, or nothing, or nothing more after an answer, is
/// closed once `header_read_timeout_ms` passes.
#[tokio::test]
async fn the_header_read_timeout_closes_slow_and_silent_clients() {
    let timeout = Duration::from_millis(300);
    let (worker, gateway) = gateway(|config| config.server.timeouts.header_read = timeout).await;
    let data = gateway.data_addr;
    for (case, bytes) in [
        ("half a head", "GET /echo HTTP/1.1\r\nhost: localhost\r\n"),
        ("nothing", ""),
    ] {
        let started = Instant::now();
        let mut wire = Wire::open(data).await;
        wire.send(bytes).await;
        // Closed without an answer (no `408`).
        assert_eq!(wire.rest().await, "", "{case}");
        let waited = started.elapsed();
        assert!(waited >= timeout, "{case}: closed after {waited:?}");
    }
    assert_eq!(requests(&worker), 0);
    // An idle keep-alive connection's clock starts after its answer, so after the request.
    let started = Instant::now();
    let mut wire = Wire::open(data).await;
    wire.send(get("/echo", "")).await;
    assert_eq!(wire.response(false).await.status, 200);
    wire.closes().await;
    let waited = started.elapsed();
    assert!(waited >= timeout, "idle: closed after {waited:?}");
    gateway.shutdown().await;
}

/// Shutdown closes an idle keep-alive connection and stops accepting, while a stream in flight
/// runs to its end (its last chunk sent) before its connection is closed.
#[tokio::test]
async fn shutdown_closes_idle_connections_and_lets_streams_finish() {
    let (worker, gateway) = gateway(|_| {}).await;
    let data = gateway.data_addr;
    let mut idle = Wire::open(data).await;
    idle.send(get("/echo", "")).await;
    assert_eq!(idle.response(false).await.status, 200);
    let mut streaming = Wire::open(data).await;
    streaming.send(get("/hold", "")).await;
    let reply = streaming.head().await;
    assert!(reply.chunked(), "{:?}", reply.headers);
    assert_eq!(
        streaming.next_chunk().await.as_deref(),
        Some(&b"data: {\"first\":true}\n\n"[..])
    );

    let stopping = tokio::spawn(gateway.shutdown());
    idle.closes().await;
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(data).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        worker.state.held.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    worker.release_all();
    assert_eq!(
        streaming.next_chunk().await.as_deref(),
        Some(&b"data: [DONE]\n\n"[..])
    );
    assert_eq!(streaming.next_chunk().await, None);
    streaming.closes().await;
    tokio::time::timeout(WAIT, stopping)
        .await
        .expect("shutdown ends once the stream ended")
        .unwrap();
}

/// The gateway's own answers (`400 missing_host`, `431 too_many_headers`, `503`, `405`, its
/// `/health`) carry a `date` and keep the connection for the next request; a `413` for a
/// declared body it will not read ends the connection after the answer.
#[tokio::test]
async fn the_gateways_own_answers_keep_the_connection_unless_a_body_is_left_unread() {
    let (worker, gateway) = gateway(|_| {}).await;
    let many_fields: String = (0..98).map(|i| format!("x-pad-{i}: {i}\r\n")).collect();
    let mut wire = Wire::open(gateway.data_addr).await;
    for (request, status) in [
        ("GET /echo HTTP/1.1\r\n\r\n".to_owned(), 400),
        (get("/echo", &many_fields), 431),
        (get("/echo", "x-smg-target-worker: nope\r\n"), 503),
        (
            "CONNECT 127.0.0.1:80 HTTP/1.1\r\nhost: 127.0.0.1:80\r\n\r\n".to_owned(),
            405,
        ),
        (get("/health", ""), 200),
    ] {
        wire.send(&request).await;
        let reply = wire.response(false).await;
        assert_eq!(reply.status, status, "{:?}", request.lines().next());
        assert_eq!(
            reply.header("connection"),
            None,
            "{:?}",
            request.lines().next()
        );
        assert!(reply.header("date").is_some(), "{:?}", reply.headers);
        assert_eq!(reply.framing, Framing::Length(reply.body.len()));
    }
    assert_eq!(requests(&worker), 0);
    wire.send("POST /echo HTTP/1.1\r\nhost: localhost\r\ncontent-length: 100000000\r\n\r\n")
        .await;
    let reply = wire.response(false).await;
    assert_eq!(reply.status, 413);
    wire.closes().await;
    gateway.shutdown().await;
}

/// Unusual heads the parser takes, as the worker gets them: bare LF line ends, an empty line
/// before the request line, the absolute form (sent on in origin form), a lower-case method (a
/// method of its own), `OPTIONS *`, `Transfer-Encoding: Chunked`, chunk sizes and a
/// `Content-Length` with leading zeros, and an `Upgrade` (answered as a plain request, the
/// upgrade not passed on).
#[tokio::test]
async fn unusual_heads_the_parser_takes() {
    let (_worker, gateway) = gateway(|_| {}).await;
    let chunked = "transfer-encoding: Chunked\r\n\r\n0003\r\nabc\r\n0\r\n\r\n";
    let cases = [
        (
            "GET /echo HTTP/1.1\nhost: x\n\n".to_owned(),
            "GET",
            "/echo",
            "",
        ),
        (
            "\r\nGET /echo HTTP/1.1\r\nhost: x\r\n\r\n".to_owned(),
            "GET",
            "/echo",
            "",
        ),
        (
            "GET http://example.com/echo?q=1 HTTP/1.1\r\nhost: example.com\r\n\r\n".to_owned(),
            "GET",
            "/echo?q=1",
            "",
        ),
        (
            "get /echo HTTP/1.1\r\nhost: x\r\n\r\n".to_owned(),
            "get",
            "/echo",
            "",
        ),
        (
            "OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n".to_owned(),
            "OPTIONS",
            "*",
            "",
        ),
        (
            format!("POST /echo HTTP/1.1\r\nhost: x\r\n{chunked}"),
            "POST",
            "/echo",
            "abc",
        ),
        (
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 003\r\n\r\nabc".to_owned(),
            "POST",
            "/echo",
            "abc",
        ),
        (
            "GET /echo HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
                .to_owned(),
            "GET",
            "/echo",
            "",
        ),
    ];
    for (request, method, uri, body) in cases {
        let mut wire = Wire::open(gateway.data_addr).await;
        wire.send(&request).await;
        let reply = wire.response(false).await;
        assert_eq!(reply.status, 200, "{request:?}");
        let echo = reply.echo();
        assert_eq!(
            (
                echo["method"].as_str(),
                echo["uri"].as_str(),
                echo["body"].as_str()
            ),
            (Some(method), Some(uri), Some(body)),
            "{request:?}"
        );
        assert_eq!(echo["headers"].get("upgrade"), None, "{echo}");
    }
    gateway.shutdown().await;
}
