//! The response relay seen from both ends: a scripted raw worker writes literal bytes (pausing
//! where the test says), and a raw client reads the gateway's literal answer, so each test sees
//! what one read from the worker became on the client's wire.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use gatewayd::config::{Config, WorkerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// What the scripted worker does for one request.
#[derive(Clone)]
pub(super) enum Step {
    /// Writes these bytes (one `write_all`: they leave together).
    Write(&'static [u8]),
    /// Waits for the test's [`ScriptedWorker::go`].
    Wait,
    /// Closes the connection.
    Close,
}

/// A worker that answers each data-plane request with its script, then reads the next request
/// on the same connection; health probes get an empty 200.
pub(super) struct ScriptedWorker {
    addr: SocketAddr,
    /// Connections that carried a data-plane request.
    pub(super) data_connections: Arc<AtomicUsize>,
    /// Data-plane request targets, in arrival order.
    targets: Arc<Mutex<Vec<String>>>,
    go: Arc<Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedWorker {
    pub(super) async fn start(script: fn(&str) -> Vec<Step>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let data_connections = Arc::new(AtomicUsize::new(0));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let go = Arc::new(Semaphore::new(0));
        let (connections, seen, released) = (
            Arc::clone(&data_connections),
            Arc::clone(&targets),
            Arc::clone(&go),
        );
        let task = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (connections, seen, released) = (
                    Arc::clone(&connections),
                    Arc::clone(&seen),
                    Arc::clone(&released),
                );
                tokio::spawn(async move {
                    serve(stream, script, connections, seen, released).await;
                });
            }
        });
        Self {
            addr,
            data_connections,
            targets,
            go,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Lets one [`Step::Wait`] pass.
    pub(super) fn go(&self) {
        self.go.add_permits(1);
    }
}

async fn serve(
    mut stream: TcpStream,
    script: fn(&str) -> Vec<Step>,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<String>>>,
    go: Arc<Semaphore>,
) {
    let mut counted = false;
    let mut buffer = Vec::new();
    loop {
        let Some(head) = read_head(&mut stream, &mut buffer).await else {
            return;
        };
        let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
        if target == "/health" || target == "/metrics" {
            let empty = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
            if stream.write_all(empty).await.is_err() {
                return;
            }
            continue;
        }
        if !counted {
            counted = true;
            connections.fetch_add(1, Ordering::SeqCst);
        }
        seen.lock().unwrap().push(target.clone());
        for step in script(&target) {
            match step {
                Step::Write(bytes) => {
                    if stream.write_all(bytes).await.is_err() {
                        return;
                    }
                }
                Step::Wait => go.acquire().await.unwrap().forget(),
                Step::Close => return,
            }
        }
    }
}

/// Reads up to the end of a head (`\r\n\r\n`) and returns it, keeping what follows in `buffer`.
async fn read_head(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            buffer.drain(..end + 4);
            return Some(head);
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// A raw client's view of a chunked response: reads the next chunk's data (`None` at the last
/// chunk or when the gateway closed the connection).
pub(super) async fn read_chunk(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = buffer.windows(2).position(|w| w == b"\r\n") {
            let size_line = std::str::from_utf8(&buffer[..end]).unwrap();
            let size = usize::from_str_radix(size_line, 16).unwrap();
            if buffer.len() >= end + 2 + size + 2 {
                let data = buffer[end + 2..end + 2 + size].to_vec();
                buffer.drain(..end + 2 + size + 2);
                return (size > 0).then_some(data);
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

pub(super) fn config_for(worker: &ScriptedWorker) -> Config {
    let mut config = test_config(&[]);
    config.workers = vec![WorkerConfig {
        name: Some("w".to_owned()),
        url: worker.url(),
        ring_id: None,
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    }];
    config
}

/// Opens a raw connection to the gateway, sends a GET for `path` and reads the response head.
pub(super) async fn raw_get(
    gateway: &gatewayd::RunningGateway,
    path: &str,
) -> (TcpStream, String, Vec<u8>) {
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: gateway\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buffer = Vec::new();
    let head = read_head(&mut stream, &mut buffer).await.expect("a head");
    (stream, head, buffer)
}

pub(super) const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// Three SSE events the worker wrote at once (a chunk each) reach the client byte for byte as the
/// worker framed them: the chunked body is relayed, not decoded and chunk-encoded again. A
/// malformed chunk size later in the stream is found as it passes: the client gets the
/// `event: error` ending, the error counts against the worker, the load is released and the
/// broken connection is not reused.
#[tokio::test]
async fn a_burst_of_chunks_passes_as_the_worker_framed_it_and_a_malformed_chunk_ends_the_stream() {
    let worker = ScriptedWorker::start(|target| match target {
        "/burst" => vec![
            Step::Write(SSE_HEAD),
            Step::Write(b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n"),
            Step::Wait,
            Step::Write(b"9\r\ndata: 4\n\n\r\nzz\r\n"),
            Step::Wait,
        ],
        _ => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        )],
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let (mut stream, head, mut buffer) = raw_get(&gateway, "/burst").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let burst: &[u8] = b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n";
    while buffer.len() < burst.len() {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the burst before the end");
        buffer.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(
        String::from_utf8_lossy(&buffer[..burst.len()]),
        String::from_utf8_lossy(burst)
    );
    buffer.drain(..burst.len());
    worker.go();
    let mut rest = Vec::new();
    while let Some(chunk) = read_chunk(&mut stream, &mut buffer).await {
        rest.extend_from_slice(&chunk);
    }
    let rest = String::from_utf8(rest).unwrap();
    // The good chunk before the malformation in the same read still goes on; the error event
    // starts with blank lines, so it is an event of its own even after a cut one.
    assert!(rest.starts_with("data: 4\n\n\n\nevent: error\n"), "{rest}");
    assert!(
        rest.ends_with("\"code\":\"upstream_stream_error\"}}\n\n"),
        "{rest}"
    );
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 1);
    worker.go();
    let answer = client()
        .get(format!("http://{}/next", gateway.data_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.text().await.unwrap(), "ok");
    assert_eq!(worker.data_connections.load(Ordering::SeqCst), 2);
    gateway.shutdown().await;
}

/// Chunked framing the relay must read exactly (extensions, white space after the size,
/// upper-case hex, trailers, a body split across reads inside a size line and inside the final
/// CRLF) arrives whole, and the connection, read to its end, carries every next request; bytes
/// after a complete response (the next response's? a broken worker's) keep it from being reused.
#[tokio::test]
async fn odd_but_valid_framing_is_relayed_exactly_and_stray_bytes_prevent_reuse() {
    let worker = ScriptedWorker::start(|target| match target {
        "/odd" => vec![
            Step::Write(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0",
            ),
            Step::Write(b"B \t;x\r\n worldworld\r\n0\r\nx-trailer: t\r\n\r"),
            Step::Write(b"\n"),
        ],
        "/split" => vec![
            Step::Write(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhel"),
            Step::Write(b"lo wor"),
            Step::Write(b"ld"),
        ],
        "/stray" => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n",
        )],
        _ => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        )],
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let get = |path: &'static str| {
        let url = format!("http://{}{path}", gateway.data_addr);
        async move {
            let response = client().get(url).send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            response.bytes().await.unwrap().to_vec()
        }
    };
    for _ in 0..2 {
        assert_eq!(get("/odd").await, b"hello worldworld");
        assert_eq!(get("/split").await, b"hello world");
    }
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(
        worker.data_connections.load(Ordering::SeqCst),
        1,
        "one keep-alive connection"
    );
    assert_eq!(get("/stray").await, b"ok");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(get("/next").await, b"ok");
    assert_eq!(
        worker.data_connections.load(Ordering::SeqCst),
        2,
        "not after stray bytes"
    );
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 0);
    assert_eq!(worker.targets.lock().unwrap().len(), 6);
    gateway.shutdown().await;
}

/// An idle held stream (the worker thinking between tokens) keeps the exchange open and its load
/// counted; the worker's next bytes arrive at once, and its close after the last chunk ends it.
#[tokio::test]
async fn a_held_stream_waits_for_the_worker_and_ends_with_it() {
    let worker = ScriptedWorker::start(|_| {
        vec![
            Step::Write(SSE_HEAD),
            Step::Write(b"9\r\ndata: 1\n\n\r\n"),
            Step::Wait,
            Step::Write(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"),
            Step::Close,
        ]
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let (mut stream, _, mut buffer) = raw_get(&gateway, "/held").await;
    assert_eq!(
        read_chunk(&mut stream, &mut buffer).await.unwrap(),
        b"data: 1\n\n"
    );
    assert_eq!(active_loads(&gateway).await, vec![("w".to_owned(), 1)]);
    worker.go();
    let second = tokio::time::timeout(Duration::from_secs(5), read_chunk(&mut stream, &mut buffer));
    assert_eq!(second.await.unwrap().unwrap(), b"data: 2\n\n");
    assert_eq!(read_chunk(&mut stream, &mut buffer).await, None);
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 0);
    gateway.shutdown().await;
}

/// Valid size lines that strict clients refuse (white space after the size, extensions, a
/// control byte in one: Node's llhttp answers them with `HPE_INVALID_CHUNK_SIZE` or
/// `HPE_STRICT`) reach the client as plain `HEX CRLF` lines, extensions dropped; the plain
/// chunks around them pass as they came.
#[tokio::test]
async fn odd_size_lines_reach_the_client_plain() {
    let worker = ScriptedWorker::start(|_| {
        vec![
            Step::Write(SSE_HEAD),
            Step::Write(
                b"b \t\r\ndata: one\n\n\r\nb \r\ndata: two\n\n\r\nB\r\ndata: thr\n\n\r\n\
                  b ;x\r\ndata: fou\n\n\r\nb;x=\x01\r\ndata: fiv\n\n\r\nb;n=v\r\ndata: six\n\n\r\n\
                  0\r\n\r\n",
            ),
        ]
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let (mut stream, head, mut buffer) = raw_get(&gateway, "/odd").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let read_to_end = async {
        while !buffer.ends_with(b"0\r\n\r\n") {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the body's end before the connection's");
            buffer.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_to_end)
        .await
        .expect("the whole body");
    assert_eq!(
        String::from_utf8_lossy(&buffer),
        "b\r\ndata: one\n\n\r\nb\r\ndata: two\n\n\r\nB\r\ndata: thr\n\n\r\n\
         b\r\ndata: fou\n\n\r\nb\r\ndata: fiv\n\n\r\nb\r\ndata: six\n\n\r\n0\r\n\r\n"
    );
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    gateway.shutdown().await;
}

/// The events an SSE client dispatches from `stream`, as the HTML standard's event stream
/// interpretation reads it (LF line ends): a blank line dispatches the fields before it as one
/// event (`message` unless an `event` field named it), and dispatches nothing when no `data`
/// field came; a line without a blank one after it is never dispatched.
pub(super) fn sse_events(stream: &str) -> Vec<(String, String)> {
    let mut events = Vec::new();
    let (mut event_type, mut data) = (String::new(), None::<String>);
    for line in stream
        .split_inclusive('\n')
        .filter(|line| line.ends_with('\n'))
    {
        let line = line.trim_end_matches('\n');
        if line.is_empty() {
            if let Some(data) = data.take() {
                let name = if event_type.is_empty() {
                    "message"
                } else {
                    &event_type
                };
                events.push((name.to_owned(), data));
            }
            event_type.clear();
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event_type = value.to_owned(),
            "data" => match &mut data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    events
}

/// A worker that breaks its stream inside an event (a chunk of 100 bytes cut after `data: par`):
/// the appended `event: error` is an event of its own for an SSE client, not fields glued onto
/// the cut line. The cut event's part is dispatched too (a line end cannot be taken back), but
/// the error event after it tells the client the stream broke.
#[tokio::test]
async fn an_error_event_after_a_cut_event_is_its_own_event() {
    let worker = ScriptedWorker::start(|_| {
        vec![
            Step::Write(SSE_HEAD),
            Step::Write(b"b\r\ndata: one\n\n\r\n"),
            Step::Write(b"64\r\ndata: par"),
            Step::Close,
        ]
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let response = client()
        .get(format!("http://{}/cut", gateway.data_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    let error = r#"{"error":{"message":"the worker's stream ended abnormally","type":"gateway_error","code":"upstream_stream_error"}}"#;
    assert_eq!(
        sse_events(&body),
        [
            ("message".to_owned(), "one".to_owned()),
            ("message".to_owned(), "par".to_owned()),
            ("error".to_owned(), error.to_owned()),
        ],
        "{body:?}"
    );
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 1);
    gateway.shutdown().await;
}
