//! The client's faults are the client's (docs/reliability.md, "Client faults"): a request body that
//! the client abandons, malforms, makes too large or sends too slowly is answered 4xx, counted in
//! `bch_client_body_errors_total`, logged with the request — and never raises the worker's error
//! counter, marks it unhealthy or logs a warning naming it. Also the requests the data plane
//! refuses before routing (CONNECT, HTTP/1.1 without Host, a loop through this gateway, repeated
//! routing headers) and the bounds on clients that stop reading or half-close.
//!
//! This binary owns the global tracing subscriber, so tests can check what was logged.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use common::*;
use gatewayd::RunningGateway;
use gatewayd::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything logged by this test binary (INFO and above), as text.
fn logs() -> String {
    static LOGS: OnceLock<Buffer> = OnceLock::new();
    let buffer = LOGS.get_or_init(|| {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .init();
        buffer
    });
    String::from_utf8_lossy(&buffer.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
}

/// A gateway in front of `workers` whose health only passive marking could change (probes are
/// an hour apart), so a worker still healthy at the end was never marked down by a request.
async fn gateway(workers: &[&FakeWorker], tune: impl FnOnce(&mut Config)) -> RunningGateway {
    logs();
    let mut config = test_config(workers);
    config.health.interval = Duration::from_millis(3_600_000);
    assert!(config.health.passive);
    tune(&mut config);
    start(config).await
}

/// Sends `request` and reads the answer until the gateway closes the connection: status and body.
async fn answer(stream: &mut TcpStream) -> (u16, String) {
    let mut response = Vec::new();
    let done =
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    assert!(
        done.is_ok(),
        "an answer in time; got {:?}",
        String::from_utf8_lossy(&response)
    );
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

async fn send(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(request).await;
    answer(&mut stream).await
}

fn code_of(body: &str) -> String {
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
    assert_eq!(json["error"]["type"], "gateway_error", "{json}");
    json["error"]["code"].as_str().unwrap().to_owned()
}

/// `bch_client_body_errors_total{reason=…}` now.
fn client_body_errors(gateway: &RunningGateway, reason: &str) -> u64 {
    let needle = format!("bch_client_body_errors_total{{reason=\"{reason}\"}} ");
    gateway
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&needle)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {needle} in the metrics"))
}

/// Waits (bounded) until the gateway holds no load and counted `n` client faults of `reason`.
async fn settled(gateway: &RunningGateway, reason: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let idle = gateway
            .routing_table()
            .workers()
            .iter()
            .all(|w| w.stats.active() == 0);
        if idle && client_body_errors(gateway, reason) >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{reason}: {} of {n}",
            client_body_errors(gateway, reason)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The worker's record: errors counted against it, and whether it is healthy.
fn worker_record(gateway: &RunningGateway, name: &str) -> (u64, bool) {
    let table = gateway.routing_table();
    let index = table
        .workers()
        .iter()
        .position(|w| w.spec.name == name)
        .unwrap();
    (
        table.workers()[index].stats.errors_total(),
        table.healthy_flags()[index],
    )
}

fn warnings_naming(worker: &str) -> Vec<String> {
    logs()
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains(&format!("worker={worker}")))
        .map(str::to_owned)
        .collect()
}

/// A client that sends part of its body and leaves, a malformed chunked body, a chunked body
/// over `max_body_bytes`, and an upload slower than the request-body timeout (and than the
/// first-byte timeout): each is the client's fault.
#[tokio::test]
async fn client_body_faults_are_not_worker_faults() {
    let worker = fake_worker("victim").await;
    let gateway = gateway(&[&worker], |config| {
        config.server.limits.max_body_bytes = 1024;
        config.server.timeouts.request_body = Duration::from_millis(400);
    })
    .await;
    let data = gateway.data_addr;
    let head = |extra: &str| {
        format!(
            "POST /echo HTTP/1.1\r\nhost: {data}\r\nx-smg-routing-key: k\r\nconnection: close\r\n{extra}\r\n"
        )
    };

    // Part of a declared body, then the client leaves once the worker has the request.
    let mut stream = TcpStream::connect(data).await.unwrap();
    stream
        .write_all(format!("{}{}", head("content-length: 1000\r\n"), "x".repeat(100)).as_bytes())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while worker
        .state
        .requests
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker got the request head"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(stream);
    settled(&gateway, "incomplete", 1).await;

    // A chunk size line that is not hex, after a good chunk: 400, not 502.
    let malformed = format!(
        "{}5\r\nhello\r\nZZZ\r\nmore\r\n0\r\n\r\n",
        head("transfer-encoding: chunked\r\n")
    );
    let (status, body) = send(data, malformed.as_bytes()).await;
    assert_eq!(
        (status, code_of(&body)),
        (400, "invalid_request_body".into()),
        "{body}"
    );
    settled(&gateway, "malformed", 1).await;

    // Chunked, so only counting finds it over the limit: 413.
    let chunk = format!("400\r\n{}\r\n", "y".repeat(1024));
    let big = format!(
        "{}{chunk}{chunk}0\r\n\r\n",
        head("transfer-encoding: chunked\r\n")
    );
    let (status, body) = send(data, big.as_bytes()).await;
    assert_eq!(
        (status, code_of(&body)),
        (413, "payload_too_large".into()),
        "{body}"
    );
    settled(&gateway, "too_large", 1).await;

    // Ten bytes of a hundred, then silence: 408 once the request-body timeout passes.
    let slow = format!("{}{}", head("content-length: 100\r\n"), "z".repeat(10));
    let started = std::time::Instant::now();
    let mut stream = TcpStream::connect(data).await.unwrap();
    stream.write_all(slow.as_bytes()).await.unwrap();
    let (status, body) = answer(&mut stream).await;
    assert_eq!(
        (status, code_of(&body)),
        (408, "request_body_timeout".into()),
        "{body}"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    settled(&gateway, "timeout", 1).await;

    assert_eq!(
        worker_record(&gateway, "victim"),
        (0, true),
        "no error, still healthy"
    );
    assert_eq!(warnings_naming("victim"), Vec::<String>::new());
    let log = logs();
    for fault in ["incomplete", "malformed", "too_large", "timeout"] {
        assert!(
            log.contains(&format!("client_fault={fault}")),
            "{fault} in the request log"
        );
    }
    // A fault of the worker's still counts against it.
    let crashed = client()
        .get(format!("http://{data}/crash"))
        .send()
        .await
        .unwrap();
    let _ = crashed.text().await;
    wait_all_idle(&gateway).await;
    assert_eq!(worker_record(&gateway, "victim").0, 1);
    gateway.shutdown().await;
}

/// An upload slower than `first_byte_timeout_ms` (with a longer request-body timeout): the worker
/// never had the whole request, so the answer is the client's 408, not the worker's 504.
#[tokio::test]
async fn an_upload_slower_than_the_first_byte_timeout_is_the_clients_fault() {
    let worker = fake_worker("patient").await;
    let gateway = gateway(&[&worker], |config| {
        config.server.timeouts.first_byte = Duration::from_millis(300);
        config.server.timeouts.request_body = Duration::from_millis(60_000);
    })
    .await;
    let data = gateway.data_addr;
    let (mut reader, mut writer) = TcpStream::connect(data).await.unwrap().into_split();
    writer
        .write_all(
            format!("POST /echo HTTP/1.1\r\nhost: {data}\r\ncontent-length: 50\r\n\r\nabc")
                .as_bytes(),
        )
        .await
        .unwrap();
    // One more byte now and then: the whole body would take 2.4 s, far over the first-byte
    // timeout. The drip stops when the answer is in.
    let drip = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if writer.write_all(b"d").await.is_err() {
                return;
            }
        }
    });
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut response))
        .await
        .expect("an answer in time")
        .ok();
    drip.abort();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    assert_eq!(
        (status, code_of(&body)),
        (408, "request_body_timeout".into()),
        "{body}"
    );
    settled(&gateway, "timeout", 1).await;
    assert_eq!(worker_record(&gateway, "patient"), (0, true));
    // A worker that really is slow to answer still gets the 504.
    let stalled = client()
        .post(format!("http://{data}/stall"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(stalled.status(), 504);
    worker.release_all();
    wait_all_idle(&gateway).await;
    assert_eq!(worker_record(&gateway, "patient").0, 1);
    gateway.shutdown().await;
}

/// The header budget counts the gateway's own headers (`Via`, and `x-request-id` when it makes
/// the id): a request that fits once they are added reaches the worker whole (hyper-based, it
/// takes at most 100 header fields, as gatewayd does); one field more is gatewayd's own `431
/// too_many_headers`, OpenAI-shaped and counted as a client refusal, and the worker sees nothing.
#[tokio::test]
async fn the_gateways_own_headers_count_in_the_header_budget() {
    let worker = fake_worker("quiet").await;
    let gateway = gateway(&[&worker], |_| {}).await;
    let data = gateway.data_addr;
    let requests = || {
        worker
            .state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    // (header fields the client sends with `host` and `connection`, its own request id?)
    for (sent, with_id) in [(98, false), (99, true)] {
        let head = |fields: usize| {
            let mut head = format!("GET /echo HTTP/1.1\r\nhost: {data}\r\nconnection: close\r\n");
            let mut count = 2;
            if with_id {
                head.push_str("x-request-id: client-id\r\n");
                count += 1;
            }
            for i in count..fields {
                head.push_str(&format!("x-pad-{i}: {i}\r\n"));
            }
            head + "\r\n"
        };
        let before = requests();
        let (status, body) = send(data, head(sent).as_bytes()).await;
        assert_eq!(status, 200, "{sent} fields, id {with_id}: {body}");
        assert_eq!(requests(), before + 1);
        // As many as gatewayd's parser takes: forwarded, they were the worker's 431.
        let (status, body) = send(data, head(100).as_bytes()).await;
        assert_eq!(status, 431, "100 fields, id {with_id}: {body}");
        assert_eq!(code_of(&body), "too_many_headers");
        let (status, body) = send(data, head(sent + 1).as_bytes()).await;
        assert_eq!(status, 431, "{} fields, id {with_id}: {body}", sent + 1);
        assert_eq!(code_of(&body), "too_many_headers");
        assert!(
            body.contains(&format!("has {} header fields", sent + 1)),
            "{body}"
        );
        assert_eq!(requests(), before + 1, "the worker saw nothing");
    }
    let metrics = gateway.metrics_text();
    assert!(
        metrics.contains("bch_responses_total{status_class=\"4xx\",worker=\"\"} 4"),
        "four refusals before routing: {metrics}"
    );
    gateway.shutdown().await;
}

/// What the data plane refuses before routing, so no worker sees it and no load is taken:
/// `CONNECT` (405), HTTP/1.1 without `Host` (400), a second routing key, target worker or
/// `Authorization` header (400: the gateway routes by the first, a component behind it might read
/// the other). List-valued headers may repeat.
#[tokio::test]
async fn requests_refused_before_routing() {
    let worker = fake_worker("quiet").await;
    let gateway = gateway(&[&worker], |_| {}).await;
    let data = gateway.data_addr;
    let host = format!("host: {data}\r\n");
    let close = "connection: close\r\n";
    let cases = [
        (
            format!("CONNECT 127.0.0.1:80 HTTP/1.1\r\nhost: 127.0.0.1:80\r\n{close}\r\n"),
            405,
            "method_not_allowed",
        ),
        (
            format!("GET /echo HTTP/1.1\r\n{close}\r\n"),
            400,
            "missing_host",
        ),
        (
            format!(
                "GET /echo HTTP/1.1\r\n{host}x-smg-routing-key: a\r\nx-smg-routing-key: b\r\n{close}\r\n"
            ),
            400,
            "repeated_header",
        ),
        (
            format!(
                "GET /echo HTTP/1.1\r\n{host}X-SMG-Target-Worker: quiet\r\nx-smg-target-worker: 0\r\n{close}\r\n"
            ),
            400,
            "repeated_header",
        ),
        (
            format!(
                "GET /echo HTTP/1.1\r\n{host}authorization: Bearer a\r\nauthorization: Bearer b\r\n{close}\r\n"
            ),
            400,
            "repeated_header",
        ),
    ];
    for (request, status, code) in &cases {
        let (got, body) = send(data, request.as_bytes()).await;
        assert_eq!(
            (got, code_of(&body)),
            (*status, (*code).to_owned()),
            "{request}"
        );
    }
    assert_eq!(
        worker
            .state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // A head hyper cannot parse never reaches gatewayd: hyper's bare status, no body, closed
    // (documented: no OpenAI shape for what gatewayd never read).
    for garbage in [
        &b"NOT A REQUEST\r\n\r\n"[..],
        b"GET /echo HTTP/1.1\r\nbad header\r\n\r\n",
    ] {
        let (status, body) = send(data, garbage).await;
        assert_eq!(
            (status, body.as_str()),
            (400, ""),
            "{}",
            String::from_utf8_lossy(garbage)
        );
    }
    for request in [
        // HTTP/1.0 needs no Host; list-valued headers may repeat.
        "GET /echo HTTP/1.0\r\n\r\n".to_owned(),
        format!(
            "GET /echo HTTP/1.1\r\n{host}x-forwarded-for: 10.0.0.1\r\nx-forwarded-for: 10.0.0.2\r\n{close}\r\n"
        ),
        format!(
            "GET /echo HTTP/1.1\r\n{host}x-smg-routing-key: a\r\nx-other: 1\r\nx-other: 2\r\n{close}\r\n"
        ),
    ] {
        assert_eq!(send(data, request.as_bytes()).await.0, 200, "{request}");
    }
    assert_eq!(wait_all_idle(&gateway).await, vec![("quiet".to_owned(), 0)]);
    gateway.shutdown().await;
}

/// Every forwarded request carries this gateway's `Via` entry after any earlier proxy's; a
/// request that comes back with it is refused (508). A worker URL that leads back through a relay
/// (which no start-up check can see) costs one extra hop instead of a storm of nested ones.
#[tokio::test]
async fn a_request_that_comes_back_is_refused_as_a_loop() {
    let worker = fake_worker("echo").await;
    let gateway = gateway(&[&worker], |_| {}).await;
    let data = gateway.data_addr;
    let echoed: serde_json::Value = client()
        .get(format!("http://{data}/echo"))
        .header("via", "1.0 corporate-proxy")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The echo shows the last `Via` line: this gateway's, after the earlier proxy's.
    let own = echoed["headers"]["via"].as_str().unwrap().to_owned();
    assert!(own.starts_with("1.1 bch-") && own.len() == 24, "{own}");
    for via in [
        own.clone(),
        format!("1.0 corporate-proxy, {own}"),
        own.replace("1.1", "HTTP/1.1"),
    ] {
        let (status, body) = send(
            data,
            format!(
                "GET /echo HTTP/1.1\r\nhost: {data}\r\nvia: {via}\r\nconnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(
            (status, code_of(&body)),
            (508, "loop_detected".into()),
            "{via}"
        );
    }

    // A relay on another loopback port in front of the gateway itself, registered as a worker.
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_url = format!("http://{}", relay.local_addr().unwrap());
    let hops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&hops);
    let relay_task = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = relay.accept().await {
            // Health probes come through the relay too (a new worker is probed at once): only
            // the proxied request is a hop.
            let mut head = [0u8; 11];
            let peeked = inbound.peek(&mut head).await.unwrap_or(0);
            if !head[..peeked].starts_with(b"GET /health") {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(data).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let added = client()
        .post(format!("http://{}/admin/workers", gateway.control_addr))
        .json(&serde_json::json!({"name": "relay", "url": relay_url}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let looped = client()
        .get(format!("http://{data}/v1/models"))
        .header("x-smg-target-worker", "relay")
        .send()
        .await
        .unwrap();
    assert_eq!(looped.status(), 508);
    assert_eq!(looped.headers()["x-bch-worker"], "relay");
    assert_eq!(
        hops.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one hop back, no more"
    );
    relay_task.abort();
    assert!(wait_all_idle(&gateway).await.iter().all(|(_, n)| *n == 0));
    gateway.shutdown().await;
}

/// A worker that streams server-sent events as fast as its socket takes them, until the gateway
/// closes the connection; `closed` is set then.
async fn firehose() -> (String, Arc<std::sync::atomic::AtomicBool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&closed);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let flag = Arc::clone(&flag);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                if head.starts_with(b"GET /health") {
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let event = format!("data: {}\n\n", "x".repeat(16 * 1024));
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                out.extend_from_slice(chunk.as_bytes());
                while stream.write_all(&out).await.is_ok() {
                    out = chunk.clone().into_bytes();
                }
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    (url, closed)
}

/// A client that stops reading a fast stream: back-pressure is not idleness (the worker is not
/// silent, it is blocked), so only `client_stall_timeout_ms` ends it — the load is released and
/// the worker's connection closed. The request is logged and counted as cut by the client
/// (`error=true client_fault=client_stall`, `bch_client_stalls_total`), not as a completed one,
/// and not against the worker.
#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off() {
    let (url, worker_closed) = firehose().await;
    let gateway = gateway(&[], |config| {
        config.server.timeouts.client_stall = Duration::from_millis(300);
        config.workers = vec![gatewayd::config::WorkerConfig {
            name: Some("firehose".into()),
            ..gatewayd::config::WorkerConfig::from_url(&url)
        }];
    })
    .await;
    let data = gateway.data_addr;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(data).await.unwrap();
    stream
        .write_all(
            format!("GET /v1/stream HTTP/1.1\r\nhost: {data}\r\nx-smg-routing-key: k\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut held = false;
    loop {
        let active = gateway.routing_table().workers()[0].stats.active();
        held |= active == 1;
        if held && active == 0 && worker_closed.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled stream still holds its load"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(worker_record(&gateway, "firehose"), (0, true));
    // The line is written just after the load is released.
    let line = loop {
        let logs = logs();
        let line = logs
            .lines()
            .find(|l| l.contains(" request ") && l.contains("worker=firehose"))
            .map(str::to_owned);
        if let Some(line) = line {
            break line;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request line for the stalled stream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(line.contains(" status=200 "), "{line}");
    assert!(line.contains(" error=true "), "{line}");
    assert!(line.ends_with(" client_fault=client_stall"), "{line}");
    let stalls = gateway.metrics_text().lines().find_map(|l| {
        l.strip_prefix("bch_client_stalls_total ")?
            .trim()
            .parse::<u64>()
            .ok()
    });
    assert_eq!(stalls, Some(1));
    assert!(warnings_naming("firehose").is_empty());
    drop(stream);
    gateway.shutdown().await;
}

/// A client that half-closes (shuts its sending side) after its request is taken as a client
/// that left, as nginx does by default: an LLM client that gives up closes its socket, and its
/// generation must stop. Its stream is cancelled and the load released; half-closing clients are
/// not supported (docs/reliability.md).
#[tokio::test]
async fn a_half_closed_client_is_a_client_that_left() {
    let worker = fake_worker("streamer").await;
    let gateway = gateway(&[&worker], |_| {}).await;
    let data = gateway.data_addr;
    let mut stream = streaming_client(data).await;
    stream.shutdown().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while gateway.routing_table().workers()[0].stats.active() != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the half-closed client's stream was cancelled"
    );
    // What it still reads ends without an `event: error`: the gateway closed the connection.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(!String::from_utf8_lossy(&rest).contains("event: error"));
    assert_eq!(worker_record(&gateway, "streamer"), (0, true));
    gateway.shutdown().await;
}

/// Requests written together and then a half-close (`printf ... | nc -N`) are all answered, in
/// order, and then the connection closes: the end of the client's bytes, read while the first
/// request is at the worker, is not the client leaving while requests of it wait.
#[tokio::test]
async fn pipelined_requests_then_a_half_close_are_all_answered() {
    let worker = fake_worker("echo").await;
    let gateway = gateway(&[&worker], |_| {}).await;
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    let request = |n| format!("GET /echo?n={n} HTTP/1.1\r\nhost: a\r\n\r\n");
    let requests: String = (1..=3).map(request).collect();
    stream.write_all(requests.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut all))
        .await
        .expect("the connection closed in time")
        .unwrap();
    let all = String::from_utf8_lossy(&all);
    let answers: Vec<&str> = all.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(answers.len(), 3, "{all}");
    for (n, answer) in (1..=3).zip(answers) {
        assert!(answer.starts_with("200 OK\r\n"), "{answer}");
        assert!(answer.contains(&format!("/echo?n={n}")), "{answer}");
    }
    assert_eq!(worker_record(&gateway, "echo"), (0, true));
    gateway.shutdown().await;
}

/// A client that closes its connection in the middle of a streamed response is logged as such:
/// `error=true client_fault=client_left`, with the status already sent, never like a response
/// that was delivered whole, and never against the worker.
#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_logged_as_having_left() {
    let worker = fake_worker("leaver").await;
    let gateway = gateway(&[&worker], |_| {}).await;
    let data = gateway.data_addr;
    let stream = streaming_client(data).await;
    drop(stream);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let line = loop {
        let line = logs()
            .lines()
            .find(|l| l.contains(" request ") && l.contains("worker=leaver"))
            .map(str::to_owned);
        if let Some(line) = line {
            break line;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request line for the abandoned stream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(line.contains(" status=200 "), "{line}");
    assert!(line.contains(" error=true "), "{line}");
    assert!(line.ends_with(" client_fault=client_left"), "{line}");
    assert_eq!(worker_record(&gateway, "leaver"), (0, true));
    assert!(warnings_naming("leaver").is_empty());
    gateway.shutdown().await;
}

/// A stream still running when the shutdown grace expires is cut by the gateway, not by its
/// client (who is still reading): its line says `error=true` and names no client fault.
#[test]
fn a_stream_cut_when_the_shutdown_grace_expires_is_not_the_clients_doing() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (client, _worker) = runtime.block_on(async {
        let worker = fake_worker("cut-at-exit").await;
        let gateway = gateway(&[&worker], |config| {
            config.server.timeouts.shutdown_grace = Duration::from_millis(100);
        })
        .await;
        let data = gateway.data_addr;
        let stream = streaming_client(data).await;
        gateway.shutdown().await;
        (stream.into_std().unwrap(), worker)
    });
    // The process ends: its runtime drops the connections still open.
    drop(runtime);
    let line = logs()
        .lines()
        .find(|l| l.contains(" request ") && l.contains("worker=cut-at-exit"))
        .map(str::to_owned)
        .expect("the cut stream's request line");
    assert!(line.contains(" status=200 "), "{line}");
    assert!(line.contains(" error=true "), "{line}");
    assert!(line.ends_with(" client_fault=-"), "{line}");
    drop(client);
}

/// The endpoint picker ending a stream Envoy left silent logs its request as an error (it did not
/// end as Envoy would have ended it), blaming neither the client nor the worker.
#[tokio::test]
async fn a_picker_stream_ended_for_its_silence_is_logged_as_an_error() {
    let worker = fake_worker("silent-picked").await;
    let gateway = gateway(&[&worker], |config| {
        config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
        config.picker.silent_stream_timeout = Duration::from_millis(300);
    })
    .await;
    let mut envoy = common::envoy::FakeEnvoy::open(gateway.picker_addr.unwrap()).await;
    envoy
        .exchange(common::envoy::request_headers(&[(
            "x-smg-routing-key",
            "quiet",
        )]))
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let line = loop {
        let line = logs()
            .lines()
            .find(|l| l.contains(" request ") && l.contains("worker=silent-picked"))
            .map(str::to_owned);
        if let Some(line) = line {
            break line;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request line for the silent stream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(line.contains(" error=true "), "{line}");
    assert!(line.ends_with(" client_fault=-"), "{line}");
    assert_eq!(worker_record(&gateway, "silent-picked"), (0, true));
    drop(envoy);
    gateway.shutdown().await;
}

/// A picker peer that claims, stream after stream, that Envoy served an endpoint it was never
/// given writes a bounded number of warnings (`[log]` budget), and the rest are counted.
#[tokio::test]
async fn a_peer_claiming_unlisted_endpoints_cannot_flood_the_log() {
    let worker = fake_worker("unlisted-claims").await;
    let gateway = gateway(&[&worker], |config| {
        config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let picker = gateway.picker_addr.unwrap();
    let claims = 60;
    for i in 0..claims {
        let mut envoy = common::envoy::FakeEnvoy::open(picker).await;
        envoy
            .exchange(common::envoy::request_headers(&[(
                "x-smg-routing-key",
                &format!("k{i}"),
            )]))
            .await;
        envoy
            .exchange(common::envoy::response_headers(Some("192.0.2.1:9"), true))
            .await;
    }
    let warnings = logs()
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("endpoint it was not given"))
        .count();
    let budget = gatewayd::config::LogConfig::default().state_change_lines as usize;
    assert!(
        warnings <= budget,
        "{warnings} warnings for {claims} claims"
    );
    let suppressed = gateway.metrics_text().lines().find_map(|l| {
        l.strip_prefix("bch_log_lines_suppressed_total{component=\"picker\"} ")?
            .trim()
            .parse::<usize>()
            .ok()
    });
    assert_eq!(suppressed, Some(claims - warnings));
    gateway.shutdown().await;
}

/// A raw client of a 20 s keyed SSE stream (1,000 events 20 ms apart) through `data`, once it
/// has read the first event: the stream is under way, the worker's load taken.
async fn streaming_client(data: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(data).await.unwrap();
    stream
        .write_all(
            format!(
                "GET /sse?n=1000&gap_ms=20 HTTP/1.1\r\nhost: {data}\r\nx-smg-routing-key: k\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("\"chunk\":0") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk))
            .await
            .expect("the first event in time")
            .unwrap();
        assert!(n > 0, "stream ended early");
        seen.extend_from_slice(&chunk[..n]);
    }
    stream
}
