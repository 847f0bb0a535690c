//! Worker connection reuse against odd framing: a raw TCP fake worker writes literal HTTP bytes,
//! so each test controls exactly what the gateway's pooled connection sees, and can tell whether
//! the gateway put a second request on a connection that could not carry it.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use gatewayd::config::{Config, WorkerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the raw worker parsed it.
#[derive(Debug, Clone)]
struct RawRequest {
    /// Which TCP connection (0-based, in accept order) carried it.
    connection: usize,
    method: String,
    target: String,
    /// Lower-cased header lines, `name: value`.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the raw worker does after writing its answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    /// Reads the next request from the same connection.
    KeepAlive,
    /// Closes the socket.
    Close,
    /// Neither reads nor closes: a request put on this connection would never be answered.
    Linger,
    /// Waits, idle, until [`RawWorker::close_idle`], then closes the socket (a worker's keep-alive
    /// timeout), without having said it would.
    CloseWhenTold,
    /// Keeps the connection, but a request that arrives after it sat idle this long is not
    /// answered: the socket closes (a worker's keep-alive timer firing just as the request comes
    /// in — the race no check before sending can see).
    ExpireIdle(Duration),
}

struct Reply {
    bytes: Vec<u8>,
    after: After,
    /// Read the request body (by its framing) before answering; `false` answers right after the
    /// head, leaving the body unread on the socket.
    read_body: bool,
}

impl Reply {
    fn keep_alive(bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            bytes: bytes.into(),
            after: After::KeepAlive,
            read_body: true,
        }
    }
}

type Responder = Arc<dyn Fn(&RawRequest) -> Reply + Send + Sync>;

struct RawWorker {
    addr: SocketAddr,
    /// Data-plane requests (health probes excluded), in arrival order.
    requests: Arc<Mutex<Vec<RawRequest>>>,
    /// Bytes that arrived where a request head should start but did not parse as one: the
    /// gateway reused a connection that still carried the rest of an earlier exchange.
    garbage: Arc<AtomicUsize>,
    /// Connections the gateway closed (EOF where a request head should start).
    closed: Arc<AtomicUsize>,
    /// Idle connections this worker closed ([`After::CloseWhenTold`]).
    closed_by_worker: Arc<AtomicUsize>,
    close_idle: tokio::sync::watch::Sender<u64>,
    notify: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawWorker {
    async fn start(
        name: &str,
        respond: impl Fn(&RawRequest) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let _ = name;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let garbage = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let closed_by_worker = Arc::new(AtomicUsize::new(0));
        let (close_idle, close_rx) = tokio::sync::watch::channel(0);
        let notify = Arc::new(tokio::sync::Notify::new());
        let respond: Responder = Arc::new(respond);
        let (r, g, c, w, n) = (
            Arc::clone(&requests),
            Arc::clone(&garbage),
            Arc::clone(&closed),
            Arc::clone(&closed_by_worker),
            Arc::clone(&notify),
        );
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            let mut index = 0;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let counters = Counters {
                    requests: Arc::clone(&r),
                    garbage: Arc::clone(&g),
                    closed: Arc::clone(&c),
                    closed_by_worker: Arc::clone(&w),
                    close_idle: close_rx.clone(),
                    notify: Arc::clone(&n),
                };
                connections.spawn(serve(stream, index, Arc::clone(&respond), counters));
                index += 1;
            }
        });
        Self {
            addr,
            requests,
            garbage,
            closed,
            closed_by_worker,
            close_idle,
            notify,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Makes every connection waiting in [`After::CloseWhenTold`] close, and waits until `n`
    /// have been closed so.
    async fn close_idle(&self, n: usize) {
        self.close_idle.send_modify(|v| *v += 1);
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let notified = self.notify.notified();
                if self.closed_by_worker.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("the worker closed its idle connections");
    }

    /// Waits (bounded) until the gateway has closed `n` connections to this worker.
    async fn wait_closed(&self, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let notified = self.notify.notified();
                if self.closed.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the gateway closed {} of {n} connections",
                self.closed.load(Ordering::SeqCst)
            )
        });
    }

    fn requests(&self) -> Vec<RawRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// Distinct TCP connections that carried a data-plane request.
    fn data_connections(&self) -> usize {
        let mut seen: Vec<usize> = self.requests().iter().map(|r| r.connection).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads until `buf` holds `want` bytes; `false` on EOF.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>, want: usize) -> bool {
    while buf.len() < want {
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// Reads until `buf` contains `needle`; its end offset, or `None` on EOF.
async fn fill_until(stream: &mut TcpStream, buf: &mut Vec<u8>, needle: &[u8]) -> Option<usize> {
    loop {
        if let Some(at) = find(buf, needle) {
            return Some(at + needle.len());
        }
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

struct Counters {
    requests: Arc<Mutex<Vec<RawRequest>>>,
    garbage: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    closed_by_worker: Arc<AtomicUsize>,
    close_idle: tokio::sync::watch::Receiver<u64>,
    notify: Arc<tokio::sync::Notify>,
}

async fn serve(mut stream: TcpStream, connection: usize, respond: Responder, counters: Counters) {
    let Counters {
        requests,
        garbage,
        closed,
        closed_by_worker,
        mut close_idle,
        notify,
    } = counters;
    close_idle.mark_unchanged();
    let mut buf = Vec::new();
    let mut expires: Option<(std::time::Instant, Duration)> = None;
    loop {
        let Some(head_end) = fill_until(&mut stream, &mut buf, b"\r\n\r\n").await else {
            closed.fetch_add(1, Ordering::SeqCst);
            notify.notify_waiters();
            return;
        };
        if let Some((since, limit)) = expires
            && since.elapsed() >= limit
        {
            drop(stream);
            closed_by_worker.fetch_add(1, Ordering::SeqCst);
            notify.notify_waiters();
            return;
        }
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.split(' ');
        let (method, target, version) = (
            parts.next().unwrap_or_default().to_owned(),
            parts.next().unwrap_or_default().to_owned(),
            parts.next().unwrap_or_default(),
        );
        let known = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"];
        if !known.contains(&method.as_str()) || !version.starts_with("HTTP/1.") {
            garbage.fetch_add(1, Ordering::SeqCst);
            notify.notify_waiters();
            let _ = stream
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            return;
        }
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let mut request = RawRequest {
            connection,
            method,
            target,
            headers,
            body: Vec::new(),
        };
        if request.target == "/health" {
            if stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            continue;
        }
        let reply = respond(&request);
        if reply.read_body {
            if let Some(length) = request.header("content-length") {
                let length: usize = length.parse().unwrap();
                if !fill(&mut stream, &mut buf, length).await {
                    return;
                }
                request.body = buf.drain(..length).collect();
            } else if request
                .header("transfer-encoding")
                .is_some_and(|te| te.contains("chunked"))
            {
                // Good enough for the gateway's chunked encoding: no extensions, no trailers.
                loop {
                    let Some(line_end) = fill_until(&mut stream, &mut buf, b"\r\n").await else {
                        return;
                    };
                    let size = usize::from_str_radix(
                        String::from_utf8_lossy(&buf[..line_end - 2]).trim(),
                        16,
                    )
                    .unwrap();
                    buf.drain(..line_end);
                    if !fill(&mut stream, &mut buf, size + 2).await {
                        return;
                    }
                    request.body.extend_from_slice(&buf[..size]);
                    buf.drain(..size + 2);
                    if size == 0 {
                        break;
                    }
                }
            }
        }
        requests.lock().unwrap().push(request);
        notify.notify_waiters();
        if stream.write_all(&reply.bytes).await.is_err() {
            return;
        }
        match reply.after {
            After::KeepAlive => {}
            After::ExpireIdle(limit) => expires = Some((std::time::Instant::now(), limit)),
            After::Close => return,
            After::Linger => {
                std::future::pending::<()>().await;
            }
            After::CloseWhenTold => {
                let _ = close_idle.changed().await;
                drop(stream);
                closed_by_worker.fetch_add(1, Ordering::SeqCst);
                notify.notify_waiters();
                return;
            }
        }
    }
}

fn config_for(urls: &[(&str, String)]) -> Config {
    let mut config = test_config(&[]);
    config.workers = urls
        .iter()
        .map(|(name, url)| WorkerConfig {
            name: Some((*name).to_owned()),
            url: url.clone(),
            ring_id: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            server_name: None,
            models: Vec::new(),
        })
        .collect();
    // A request put on a connection that can never answer shows up as a 504, quickly.
    config.server.timeouts.first_byte = Duration::from_millis(3_000);
    config
}

/// GETs `path` through the gateway and returns status and body, failing if the whole exchange
/// takes longer than 5 s (a response that never ends).
async fn get(gateway: &gatewayd::RunningGateway, path: &str) -> (u16, Vec<u8>) {
    let url = format!("http://{}{path}", gateway.data_addr);
    tokio::time::timeout(Duration::from_secs(5), async {
        let response = client().get(url).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.bytes().await.unwrap().to_vec())
    })
    .await
    .unwrap_or_else(|_| panic!("GET {path}: the response did not complete within 5 s"))
}

/// A chunked response with trailers completes for a client that did not ask for trailers (the
/// gateway never forwards `TE`), and the connection that carried it, read to its end, serves the
/// next request.
#[tokio::test]
async fn chunked_response_with_trailers_completes_and_its_connection_is_reused() {
    let worker = RawWorker::start("w", |_| {
        Reply::keep_alive(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\
             trailer: x-checksum\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: 42\r\n\r\n",
        )
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    for _ in 0..3 {
        let (status, body) = get(&gateway, "/v1/trailers").await;
        assert_eq!(status, 200);
        assert_eq!(body, b"hello world");
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    }
    assert_eq!(worker.requests().len(), 3);
    assert_eq!(worker.garbage.load(Ordering::SeqCst), 0);
    assert_eq!(worker.data_connections(), 1, "one keep-alive connection");
    gateway.shutdown().await;
}

/// Whatever the worker answers, a connection it asked to close (`Connection: close`, or an
/// HTTP/1.0 answer without keep-alive) is never handed to the next request, even while the worker
/// keeps the socket open: the next request goes out on a fresh connection and is answered.
#[tokio::test]
async fn connections_the_worker_asked_to_close_are_not_reused() {
    let worker = RawWorker::start("w", |request| match request.target.as_str() {
        "/close" => Reply {
            bytes: b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 5\r\n\r\nclose".to_vec(),
            after: After::Linger,
            read_body: true,
        },
        "/http10" => Reply {
            bytes: b"HTTP/1.0 200 OK\r\ncontent-length: 6\r\n\r\nhttp10".to_vec(),
            after: After::Linger,
            read_body: true,
        },
        "/chunked-close" => Reply {
            bytes: b"HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                .to_vec(),
            after: After::Linger,
            read_body: true,
        },
        _ => Reply::keep_alive("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"),
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    for (path, expected) in [
        ("/close", &b"close"[..]),
        ("/http10", b"http10"),
        ("/chunked-close", b"abc"),
    ] {
        assert_eq!(
            get(&gateway, path).await,
            (200, expected.to_vec()),
            "{path}"
        );
        assert_eq!(
            get(&gateway, "/next").await,
            (200, b"ok".to_vec()),
            "after {path}"
        );
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    }
    // Each closing answer cost its connection; each `/next` took a new one and kept it.
    assert_eq!(worker.requests().len(), 6);
    assert_eq!(worker.data_connections(), 4);
    gateway.shutdown().await;
}

/// Answers without a body (a `HEAD`, a `304`, a `204`, `Content-Length: 0`) end the exchange at
/// the head, and the connection carries the next request.
#[tokio::test]
async fn bodiless_answers_keep_the_connection() {
    let worker = RawWorker::start("w", |request| {
        let bytes: &[u8] = match (request.method.as_str(), request.target.as_str()) {
            ("HEAD", _) => {
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 11\r\n\r\n"
            }
            (_, "/304") => {
                b"HTTP/1.1 304 Not Modified\r\netag: \"x\"\r\ncontent-length: 11\r\n\r\n"
            }
            (_, "/204") => b"HTTP/1.1 204 No Content\r\n\r\n",
            (_, "/empty") => b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world",
        };
        Reply::keep_alive(bytes)
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    let base = format!("http://{}", gateway.data_addr);
    for _ in 0..2 {
        let head = client().head(format!("{base}/doc")).send().await.unwrap();
        assert_eq!(head.status(), 200);
        assert_eq!(head.headers()["content-length"], "11");
        assert!(head.bytes().await.unwrap().is_empty());
        assert_eq!(get(&gateway, "/doc").await, (200, b"hello world".to_vec()));
        assert_eq!(get(&gateway, "/304").await, (304, Vec::new()));
        assert_eq!(get(&gateway, "/204").await, (204, Vec::new()));
        assert_eq!(get(&gateway, "/empty").await, (200, Vec::new()));
        assert_eq!(get(&gateway, "/doc").await, (200, b"hello world".to_vec()));
    }
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(worker.requests().len(), 12);
    assert_eq!(worker.garbage.load(Ordering::SeqCst), 0);
    assert_eq!(worker.data_connections(), 1);
    gateway.shutdown().await;
}

/// A worker that answers before reading the request body (and then stops reading): its
/// connection still has request bytes to carry, so it is closed, not reused; the next request is
/// answered on a new connection.
#[tokio::test]
async fn a_connection_answered_before_its_request_body_was_sent_is_not_reused() {
    let worker = RawWorker::start("w", |request| {
        if request.target == "/early" {
            Reply {
                bytes: b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly".to_vec(),
                after: After::Linger,
                read_body: false,
            }
        } else {
            Reply::keep_alive("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        }
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    let base = format!("http://{}", gateway.data_addr);
    // Warm one connection, so the early answer travels on a pooled one.
    assert_eq!(get(&gateway, "/warm").await, (200, b"ok".to_vec()));
    wait_all_idle(&gateway).await;

    // The body's first part goes out; the rest waits until the answer is in.
    let (more, rest) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    more.send(Ok(vec![b'a'; 1000])).await.unwrap();
    let body = reqwest::Body::wrap_stream(futures_util::stream::unfold(rest, |mut rest| async {
        rest.recv().await.map(|chunk| (chunk, rest))
    }));
    let early = tokio::time::timeout(Duration::from_secs(5), async {
        let response = client()
            .post(format!("{base}/early"))
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.bytes().await)
    })
    .await
    .expect("the early answer arrives");
    assert_eq!(early.0, 200);
    if let Ok(bytes) = early.1 {
        assert_eq!(&bytes[..], b"early");
    }
    drop(more);
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    for _ in 0..2 {
        assert_eq!(get(&gateway, "/next").await, (200, b"ok".to_vec()));
    }
    assert_eq!(worker.garbage.load(Ordering::SeqCst), 0);
    // warm + early on the first connection, both `/next` on a second one.
    assert_eq!(worker.data_connections(), 2);
    gateway.shutdown().await;
}

/// A worker that closes keep-alive connections once they sit idle (its keep-alive timeout, without
/// saying so in advance): the gateway notices the close when it takes the connection from its pool
/// and sends the next request on a new connection instead of failing it.
#[tokio::test]
async fn connections_closed_by_the_worker_while_idle_are_replaced() {
    let worker = RawWorker::start("w", |_| Reply {
        bytes: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
        after: After::CloseWhenTold,
        read_body: true,
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    for round in 1..=10 {
        assert_eq!(
            get(&gateway, "/v1/x").await,
            (200, b"ok".to_vec()),
            "round {round}"
        );
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
        // The connection sits in the gateway's pool; the worker's keep-alive timeout closes it.
        worker.close_idle(round).await;
    }
    assert_eq!(worker.data_connections(), 10);
    gateway.shutdown().await;
}

/// The one retry after a failed connect carries the request unchanged to the next worker, under
/// that worker's path prefix and `Host`.
#[tokio::test]
async fn a_retried_request_keeps_method_path_headers_and_body_under_the_next_workers_prefix() {
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let mut config = test_config(&[&a, &b]);
    config.workers[0].url = format!("{}/prefix-a", a.url());
    config.workers[1].url = format!("{}/prefix-b/", b.url());
    let gateway = start(config).await;
    let home = preferred_worker(&gateway, "retry-me").await;
    let (dead, alive, prefix) = if home == "a" {
        (a, b, "/prefix-b")
    } else {
        (b, a, "/prefix-a")
    };
    dead.stop().await;
    let response = client()
        .put(format!(
            "http://{}/v1/chat/completions?stream=false&x=1",
            gateway.data_addr
        ))
        .header("x-smg-routing-key", "retry-me")
        .header("x-custom", "kept")
        .body("payload survives the retry")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-bch-worker"],
        alive.state.name.as_str()
    );
    let echoed: serde_json::Value = response.json().await.unwrap();
    assert_eq!(echoed["worker"], alive.state.name.as_str());
    assert_eq!(echoed["method"], "PUT");
    assert_eq!(
        echoed["uri"],
        format!("{prefix}/v1/chat/completions?stream=false&x=1")
    );
    assert_eq!(echoed["headers"]["host"], alive.addr.to_string());
    assert_eq!(echoed["headers"]["x-custom"], "kept");
    assert_eq!(echoed["headers"]["x-smg-routing-key"], "retry-me");
    assert_eq!(echoed["body"], "payload survives the retry");
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    gateway.shutdown().await;
}

/// Removing a worker closes the connections its pool kept (once the gateway moves to the new
/// membership), instead of leaving them open for the life of the process.
#[tokio::test]
async fn removing_a_worker_closes_its_pooled_connections() {
    let removed = RawWorker::start("r", |_| {
        Reply::keep_alive("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    })
    .await;
    let other = fake_worker("b").await;
    let mut config = config_for(&[("r", removed.url())]);
    config
        .workers
        .push(test_config(&[&other]).workers.remove(0));
    let gateway = start(config).await;
    let data = format!("http://{}", gateway.data_addr);
    let answer = client()
        .get(format!("{data}/v1/models"))
        .header("x-smg-target-worker", "r")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    assert_eq!(removed.data_connections(), 1);
    assert_eq!(
        removed.closed.load(Ordering::SeqCst),
        0,
        "pooled, still open"
    );

    let deleted = client()
        .delete(format!("http://{}/admin/workers/r", gateway.control_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    // A request under the new membership retires the old one's targets.
    let answer = client().get(format!("{data}/echo")).send().await.unwrap();
    assert_eq!(answer.headers()["x-bch-worker"], "b");
    answer.bytes().await.unwrap();
    removed.wait_closed(1).await;
    gateway.shutdown().await;
}

/// An event stream the worker cuts (the connection closes before the chunked body's end, or
/// before its `Content-Length`) reaches the client byte for byte, then ends with `event: error`;
/// the load is released and the broken connection is not reused.
#[tokio::test]
async fn a_cut_event_stream_ends_with_an_error_event() {
    let worker = RawWorker::start("w", |request| {
        let bytes: &[u8] = match request.target.as_str() {
            "/cut-chunked" => {
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
                  9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n"
            }
            "/cut-length" => {
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 100\r\n\r\n\
                  data: 1\n\ndata: 2\n\n"
            }
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        };
        Reply {
            bytes: bytes.to_vec(),
            after: if request.target.starts_with("/cut") {
                After::Close
            } else {
                After::KeepAlive
            },
            read_body: true,
        }
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    // Blank lines first: the event is one of its own even where a cut left one open.
    let error_event = "\n\nevent: error\ndata: {\"error\":{\"message\":\"the worker's stream ended abnormally\",\"type\":\"gateway_error\",\"code\":\"upstream_stream_error\"}}\n\n";
    let (status, body) = get(&gateway, "/cut-chunked").await;
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!("data: 1\n\ndata: 2\n\n{error_event}")
    );
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(get(&gateway, "/next").await, (200, b"ok".to_vec()));

    // With a `Content-Length` an appended event cannot fit the framing: the client must see an
    // incomplete body, not one that looks whole with a cut event inside.
    let url = format!("http://{}/cut-length", gateway.data_addr);
    let cut = tokio::time::timeout(Duration::from_secs(5), async {
        // The abort may even overtake the head (hyper closes without flushing).
        let Ok(mut response) = client().get(url).send().await else {
            return Err(Vec::new());
        };
        assert_eq!(response.status(), 200);
        let mut received = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => received.extend_from_slice(&chunk),
                Ok(None) => return Ok(received),
                Err(_) => return Err(received),
            }
        }
    })
    .await
    .expect("the cut stream ends");
    let received = cut.expect_err("an incomplete body is reported as such");
    assert!(b"data: 1\n\ndata: 2\n\n".starts_with(&received));
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(get(&gateway, "/next").await, (200, b"ok".to_vec()));
    assert_eq!(worker.garbage.load(Ordering::SeqCst), 0);
    gateway.shutdown().await;
}

/// A worker that answers with something that is not HTTP gets the client a 502 that says so, not
/// "could not be reached"; the error counts against the worker.
#[tokio::test]
async fn malformed_worker_responses_say_what_happened() {
    let worker = RawWorker::start("w", |request| {
        let bytes: Vec<u8> = match request.target.as_str() {
            "/garbage" => b"NOT HTTP AT ALL\r\n\r\n".to_vec(),
            "/huge-head" => format!(
                "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 2\r\n\r\nok",
                "a".repeat(1 << 20)
            )
            .into_bytes(),
            "/two-lengths" => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 5\r\n\r\nhello".to_vec()
            }
            // Gzip-coded bytes the client would get without a word saying so.
            "/gzip-chunked" => {
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                    .to_vec()
            }
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
        };
        Reply {
            bytes,
            after: if request.target == "/fine" {
                After::KeepAlive
            } else {
                After::Close
            },
            read_body: true,
        }
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    for (path, needle) in [
        ("/garbage", "invalid"),
        ("/huge-head", "too large"),
        ("/two-lengths", "content-length"),
        (
            "/gzip-chunked",
            "transfer-encoding other than a lone chunked",
        ),
    ] {
        let (status, body) = get(&gateway, path).await;
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 502, "{path}: {json}");
        assert_eq!(json["error"]["code"], "invalid_worker_response", "{path}");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("worker w sent an invalid response: "),
            "{message}"
        );
        assert!(message.contains(needle), "{path}: {message}");
    }
    assert_eq!(get(&gateway, "/fine").await, (200, b"ok".to_vec()));
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 4);
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    gateway.shutdown().await;
}

/// A response framed by `Transfer-Encoding: chunked` that also says `Content-Length: 3`: the body
/// is the chunked one, and the `Content-Length` is dropped (RFC 9112 §6.3), so the client gets
/// "hello", not "hel". The connection, read to its end, is reused.
#[tokio::test]
async fn content_length_beside_chunked_is_dropped() {
    let worker = RawWorker::start("w", |_| {
        Reply::keep_alive(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    for _ in 0..2 {
        let response = client()
            .get(format!("http://{}/both", gateway.data_addr))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_ne!(
            response
                .headers()
                .get("content-length")
                .map(|v| v.as_bytes()),
            Some(&b"3"[..])
        );
        assert_eq!(&response.bytes().await.unwrap()[..], b"hello");
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    }
    assert_eq!(worker.garbage.load(Ordering::SeqCst), 0);
    assert_eq!(worker.data_connections(), 1);
    gateway.shutdown().await;
}

/// A body that is not an event stream and breaks before its first byte (the worker sent a head,
/// then closed): the head was never sent on, so the client gets a 502 instead of a connection cut
/// to nothing. A body that breaks after some bytes is still cut (its status is out by then).
#[tokio::test]
async fn a_body_that_breaks_before_its_first_byte_gets_a_502() {
    let worker = RawWorker::start("w", |request| {
        let bytes: &[u8] = match request.target.as_str() {
            "/no-body" => b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n",
            "/no-chunk" => b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        };
        Reply {
            bytes: bytes.to_vec(),
            after: if request.target.starts_with("/no-") {
                After::Close
            } else {
                After::KeepAlive
            },
            read_body: true,
        }
    })
    .await;
    let gateway = start(config_for(&[("w", worker.url())])).await;
    for path in ["/no-body", "/no-chunk"] {
        let (status, body) = get(&gateway, path).await;
        let json: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{path}: {e}: {:?}", String::from_utf8_lossy(&body)));
        assert_eq!(status, 502, "{path}");
        assert_eq!(json["error"]["code"], "upstream_stream_error", "{path}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("worker w")
        );
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    }
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 2);
    assert_eq!(get(&gateway, "/next").await, (200, b"ok".to_vec()));
    gateway.shutdown().await;
}

/// A worker that closes keep-alive connections idle for 300 ms, at the moment the next request
/// arrives on one (its keep-alive timer firing as the request comes in: nothing the gateway checks
/// before sending can see it, and the request, once written, cannot be proven unsent). With
/// pooled connections retired after 200 ms the gateway never sends on such a connection.
#[tokio::test]
async fn pooled_connections_are_retired_before_the_workers_idle_timeout() {
    let worker = RawWorker::start("w", |_| Reply {
        bytes: b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
        after: After::ExpireIdle(Duration::from_millis(300)),
        read_body: true,
    })
    .await;
    let mut config = config_for(&[("w", worker.url())]);
    config.server.timeouts.upstream_idle = Duration::from_millis(200);
    let gateway = start(config).await;
    for round in 1..=5 {
        assert_eq!(
            get(&gateway, "/v1/x").await,
            (200, b"ok".to_vec()),
            "round {round}"
        );
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
        // Idle time is what this test is about: the connection must sit longer than both limits.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Quick requests still share one connection.
    for _ in 0..5 {
        assert_eq!(get(&gateway, "/v1/y").await, (200, b"ok".to_vec()));
    }
    assert_eq!(
        worker.closed_by_worker.load(Ordering::SeqCst),
        0,
        "never sent on an expiring connection"
    );
    // One per round (each found the previous one retired), one shared by the quick requests.
    assert_eq!(worker.data_connections(), 6);
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 0);
    assert!(config_default_idle() < Duration::from_secs(5));
    gateway.shutdown().await;
}

fn config_default_idle() -> Duration {
    Config::default().server.timeouts.upstream_idle
}
