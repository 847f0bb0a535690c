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
    config.health.interval_ms = 3_600_000;
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
        table.health()[index],
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
        config.server.max_body_bytes = 1024;
        config.server.request_body_timeout_ms = 400;
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
        config.server.first_byte_timeout_ms = 300;
        config.server.request_body_timeout_ms = 60_000;
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
