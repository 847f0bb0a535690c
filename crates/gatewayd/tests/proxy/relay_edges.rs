//! The relay's edges where a worker's first write holds more than its head: chunks (whole, cut,
//! malformed, the last one with trailers) read together with the head, and head fields the
//! gateway must drop (named in `Connection`) or pass byte for byte (obs-text, a hundred fields).

use crate::common;
use crate::relay::{ScriptedWorker, Step, config_for, raw_get, read_chunk, sse_events};

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a test waits for bytes the gateway must send without the worker's next write.
const PROMPT: Duration = Duration::from_secs(5);

/// The `event: error` data a broken event stream ends with.
const STREAM_ERROR: &str = r#"{"error":{"message":"the worker's stream ended abnormally","type":"gateway_error","code":"upstream_stream_error"}}"#;

/// Reads a response head's raw bytes (up to its blank line), keeping what follows in `buffer`.
async fn read_head_bytes(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Vec<u8> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = buffer[..end + 2].to_vec();
            buffer.drain(..end + 4);
            return head;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the gateway closed before the head's end");
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// The field lines of a raw head, its status line left out.
fn field_lines(head: &[u8]) -> Vec<Vec<u8>> {
    head.split(|&b| b == b'\n')
        .skip(1)
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line).to_vec())
        .filter(|line| !line.is_empty())
        .collect()
}

/// Chunks that came in the same read as the head (a whole one, then one cut by the read) reach
/// the client while the worker is still thinking, for an event stream and for a body whose first
/// frame is read before the head goes out alike; the worker's next write finishes them.
#[tokio::test]
async fn chunks_read_with_the_head_reach_the_client_before_the_worker_writes_again() {
    let worker = ScriptedWorker::start(|target| match target {
        "/sse" => vec![
            Step::Write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                  transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata",
            ),
            Step::Wait,
            Step::Write(b": 2\n\n\r\n0\r\n\r\n"),
        ],
        _ => vec![
            Step::Write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  transfer-encoding: chunked\r\n\r\n2\r\n{\"\r\n",
            ),
            Step::Wait,
            Step::Write(b"4\r\na\":1\r\n1\r\n}\r\n0\r\n\r\n"),
        ],
    })
    .await;
    let gateway = start(config_for(&worker)).await;

    let (mut stream, head, mut buffer) = raw_get(&gateway, "/sse").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let first = tokio::time::timeout(PROMPT, read_chunk(&mut stream, &mut buffer)).await;
    assert_eq!(
        first.expect("the whole chunk at once").unwrap(),
        b"data: 1\n\n"
    );
    // The cut chunk's part, framed anew: nothing the worker sent waits for its next write.
    let part = tokio::time::timeout(PROMPT, read_chunk(&mut stream, &mut buffer)).await;
    assert_eq!(
        part.expect("the cut chunk's part at once").unwrap(),
        b"data"
    );
    assert_eq!(active_loads(&gateway).await, vec![("w".to_owned(), 1)]);
    worker.go();
    assert_eq!(
        read_chunk(&mut stream, &mut buffer).await.unwrap(),
        b": 2\n\n"
    );
    assert_eq!(read_chunk(&mut stream, &mut buffer).await, None);
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);

    // Not an event stream: the head waits for the first frame, which is the chunk that came with
    // it, not the worker's next write.
    let answered = tokio::time::timeout(PROMPT, raw_get(&gateway, "/json")).await;
    let (mut stream, head, mut buffer) = answered.expect("the head without the next write");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let first = tokio::time::timeout(PROMPT, read_chunk(&mut stream, &mut buffer)).await;
    assert_eq!(first.expect("the chunk at once").unwrap(), b"{\"");
    worker.go();
    let mut rest = Vec::new();
    while let Some(chunk) = read_chunk(&mut stream, &mut buffer).await {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"a\":1}");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 0);
    assert_eq!(worker.data_connections.load(Ordering::SeqCst), 1);
    gateway.shutdown().await;
}

/// A malformed size line (or trailer) in the read that brought the head, behind a good chunk:
/// the good chunk goes on, then an event stream ends with `event: error` and any other body is
/// cut (its head already out); each failure counts once against the worker, the load is released
/// and no broken connection is reused.
#[tokio::test]
async fn a_malformed_size_line_read_with_the_head_is_answered_after_the_good_chunks() {
    let worker = ScriptedWorker::start(|target| match target {
        "/sse" => vec![
            Step::Write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                  transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\nzz\r\n",
            ),
            Step::Wait,
        ],
        "/json" => vec![
            Step::Write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  transfer-encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n",
            ),
            Step::Wait,
        ],
        // The last chunk, then a trailer line without a colon.
        "/sse-trailer" => vec![
            Step::Write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                  transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\nno colon\r\n\r\n",
            ),
            Step::Wait,
        ],
        _ => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        )],
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let url = |path: &str| format!("http://{}{path}", gateway.data_addr);

    for (path, errors) in [("/sse", 1), ("/sse-trailer", 2)] {
        let response = client().get(url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let body = tokio::time::timeout(PROMPT, response.text()).await;
        let body = body.expect("the stream ends without the worker").unwrap();
        assert_eq!(
            sse_events(&body),
            [
                ("message".to_owned(), "1".to_owned()),
                ("error".to_owned(), STREAM_ERROR.to_owned()),
            ],
            "{path}: {body:?}"
        );
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
        assert_eq!(
            gateway.routing_table().workers()[0].stats.errors_total(),
            errors
        );
    }

    let (mut stream, head, mut buffer) = raw_get(&gateway, "/json").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let cut = tokio::time::timeout(PROMPT, async {
        let mut received = Vec::new();
        while let Some(chunk) = read_chunk(&mut stream, &mut buffer).await {
            received.extend_from_slice(&chunk);
        }
        (received, buffer.clone())
    })
    .await;
    let (received, left) = cut.expect("the body is cut without the worker");
    assert_eq!(received, b"{}", "the good chunk, then the cut");
    assert!(left.is_empty(), "no last chunk: {left:?}");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 3);

    let answer = client().get(url("/next")).send().await.unwrap();
    assert_eq!(answer.text().await.unwrap(), "ok");
    assert_eq!(worker.data_connections.load(Ordering::SeqCst), 4);
    gateway.shutdown().await;
}

/// The last chunk and its trailers read with the head (behind informational heads too, for an
/// HTTP/1.0 client too) end the body: the client gets it whole and the connection serves the next
/// request, unless bytes followed the trailers.
#[tokio::test]
async fn a_whole_body_with_trailers_read_with_the_head_ends_it_and_keeps_the_connection() {
    let worker = ScriptedWorker::start(|target| match target {
        "/trailers" => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\nx-trailer: t\r\n\r\n",
        )],
        "/sse" => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
              transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\nx-trailer: t\r\n\r\n",
        )],
        "/hints" => vec![Step::Write(
            b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n\
              transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )],
        "/continue" => vec![
            Step::Write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-le"),
            Step::Write(b"ngth: 5\r\nx-after: y\r\n\r\nhello"),
        ],
        "/stray" => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\nx-trailer: t\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
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
            let response = tokio::time::timeout(PROMPT, client().get(url).send()).await;
            let response = response.expect("an answer").unwrap();
            assert_eq!(response.status(), 200, "{path}");
            tokio::time::timeout(PROMPT, response.bytes())
                .await
                .expect("the whole body")
                .unwrap()
                .to_vec()
        }
    };
    assert_eq!(get("/trailers").await, b"hello");
    assert_eq!(get("/sse").await, b"data: 1\n\n");
    assert_eq!(get("/trailers").await, b"hello");
    // Informational heads before the final one, in its read or split from it by a read.
    assert_eq!(get("/hints").await, b"hello");
    assert_eq!(get("/continue").await, b"hello");
    // An HTTP/1.0 client gets the data of the chunks read with the head, delimited by the close.
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    stream
        .write_all(b"GET /trailers HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(PROMPT, stream.read_to_end(&mut answer)).await;
    read.expect("the close").unwrap();
    assert!(answer.starts_with(b"HTTP/1.0 200 OK\r\n"));
    assert!(answer.ends_with(b"\r\n\r\nhello"), "{answer:?}");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(worker.data_connections.load(Ordering::SeqCst), 1);
    assert_eq!(get("/stray").await, b"hello");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(get("/next").await, b"ok");
    assert_eq!(
        worker.data_connections.load(Ordering::SeqCst),
        2,
        "not after stray bytes"
    );
    assert_eq!(gateway.routing_table().workers()[0].stats.errors_total(), 0);
    gateway.shutdown().await;
}

/// The worker's fields named in its `Connection` (any case, in repeated `Connection` fields) are
/// its connection's and never reach the client, nor do `keep-alive` and `proxy-connection`; a
/// value with obs-text bytes (0x80-0xff) arrives byte for byte.
#[tokio::test]
async fn fields_named_in_connection_are_dropped_and_obs_text_passes_exactly() {
    let worker = ScriptedWorker::start(|_| {
        vec![Step::Write(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Foo\r\nx-foo: 1\r\n\
              connection: X-BAR\r\nX-Bar: 2\r\nKeep-Alive: timeout=5\r\n\
              Proxy-Connection: keep-alive\r\nx-kept: 3\r\nx-obs: caf\xe9 \x80\xff!\r\n\
              content-length: 2\r\n\r\nok",
        )]
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    for _ in 0..2 {
        stream
            .write_all(b"GET /fields HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .unwrap();
        let mut buffer = Vec::new();
        let head = read_head_bytes(&mut stream, &mut buffer).await;
        assert!(head.starts_with(b"HTTP/1.1 200 OK\r\n"));
        let lines = field_lines(&head);
        let names: Vec<String> = lines
            .iter()
            .map(|line| {
                let name = line.split(|&b| b == b':').next().unwrap();
                String::from_utf8_lossy(name).to_ascii_lowercase()
            })
            .collect();
        for dropped in [
            "x-foo",
            "x-bar",
            "keep-alive",
            "proxy-connection",
            "connection",
        ] {
            assert!(!names.iter().any(|n| n == dropped), "{dropped}: {names:?}");
        }
        assert!(lines.contains(&b"x-kept: 3".to_vec()), "{names:?}");
        assert!(
            lines.contains(&b"x-obs: caf\xe9 \x80\xff!".to_vec()),
            "{:?}",
            String::from_utf8_lossy(&head)
        );
        while buffer.len() < 2 {
            let mut chunk = [0u8; 64];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            buffer.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(buffer, b"ok");
    }
    assert_eq!(worker.data_connections.load(Ordering::SeqCst), 1);
    gateway.shutdown().await;
}

/// A worker head of 100 fields (the most a worker's response may carry) reaches the client with
/// every field in order beside the gateway's own; one field more is a 502.
#[tokio::test]
async fn a_hundred_worker_fields_all_arrive_and_one_more_is_a_502() {
    fn head_of(fields: usize) -> &'static [u8] {
        let mut head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n".to_vec();
        for index in 1..fields {
            head.extend_from_slice(format!("x-field-{index:03}: value {index}\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\nok");
        head.leak()
    }
    let worker = ScriptedWorker::start(|target| match target {
        "/hundred" => vec![Step::Write(head_of(100))],
        _ => vec![Step::Write(head_of(101))],
    })
    .await;
    let gateway = start(config_for(&worker)).await;
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    stream
        .write_all(b"GET /hundred HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = Vec::new();
    let head = read_head_bytes(&mut stream, &mut buffer).await;
    let lines = field_lines(&head);
    let relayed: Vec<&Vec<u8>> = lines
        .iter()
        .filter(|line| line.starts_with(b"x-field-"))
        .collect();
    let expected: Vec<Vec<u8>> = (1..100)
        .map(|index| format!("x-field-{index:03}: value {index}").into_bytes())
        .collect();
    assert_eq!(relayed, expected.iter().collect::<Vec<_>>());
    assert!(lines.contains(&b"x-bch-worker: w".to_vec()));
    assert!(lines.contains(&b"content-length: 2".to_vec()));

    let (_, head, _) = raw_get(&gateway, "/hundred-and-one").await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    gateway.shutdown().await;
}
