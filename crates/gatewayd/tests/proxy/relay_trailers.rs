//! A chunked worker body whose trailer section goes wrong (in the read with the last of several
//! reads of chunks, in a read of its own, in the head's read, over the trailer limit), for an
//! HTTP/1.1 client (chunks relayed framed) and an HTTP/1.0 client (data decoded, delimited by
//! the close); and worker heads whose `Transfer-Encoding` is not a lone `chunked`.

use crate::common;
use crate::relay::{SSE_HEAD, ScriptedWorker, Step, config_for, raw_get, read_chunk, sse_events};

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a test waits for bytes the gateway must send without the worker's next write.
const PROMPT: Duration = Duration::from_secs(5);

/// The `event: error` data a broken event stream ends with.
const STREAM_ERROR: &str = r#"{"error":{"message":"the worker's stream ended abnormally","type":"gateway_error","code":"upstream_stream_error"}}"#;

/// A trailer section over the decoder's 16 KiB limit, behind a good chunk and the last chunk.
fn oversized_trailer() -> &'static [u8] {
    let mut bytes = b"9\r\ndata: 1\n\n\r\n0\r\nx-big: ".to_vec();
    bytes.extend(std::iter::repeat_n(b'a', 20 * 1024));
    bytes.extend_from_slice(b"\r\n\r\n");
    Box::leak(bytes.into_boxed_slice())
}

fn script(target: &str) -> Vec<Step> {
    match target {
        // Three reads of events, the last with the last chunk and a trailer without a colon.
        "/late" => vec![
            Step::Write(SSE_HEAD),
            Step::Write(b"9\r\ndata: 1\n\n\r\n"),
            Step::Wait,
            Step::Write(b"9\r\ndata: 2\n\n\r\n"),
            Step::Wait,
            Step::Write(b"9\r\ndata: 3\n\n\r\n0\r\nno colon\r\n\r\n"),
        ],
        // The bad trailer split over two reads, the second bringing no data.
        "/split" => vec![
            Step::Write(SSE_HEAD),
            Step::Write(b"9\r\ndata: 1\n\n\r\n0\r\nno co"),
            Step::Wait,
            Step::Write(b"lon\r\n\r\n"),
        ],
        // A good trailer split over two reads: the body is whole, the connection reused.
        "/good-split" => vec![
            Step::Write(SSE_HEAD),
            Step::Write(b"9\r\ndata: 1\n\n\r\n0\r\nx-t: a"),
            Step::Wait,
            Step::Write(b"\r\n\r\n"),
        ],
        // All in the read that brought the head.
        "/head" => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
              transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n0\r\nno colon\r\n\r\n",
        )],
        "/big" => vec![Step::Write(SSE_HEAD), Step::Write(oversized_trailer())],
        // Not an event stream: the head goes out with the first chunk, the bad trailer comes
        // with the second.
        "/json" => vec![
            Step::Write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n",
            ),
            Step::Wait,
            Step::Write(b"2\r\n[]\r\n0\r\nno colon\r\n\r\n"),
        ],
        _ => vec![Step::Write(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        )],
    }
}

/// Reads from `stream` into `buffer` until it holds `needle`.
async fn read_until(stream: &mut TcpStream, buffer: &mut Vec<u8>, needle: &[u8]) {
    let found = tokio::time::timeout(PROMPT, async {
        while !buffer.windows(needle.len()).any(|w| w == needle) {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before {needle:?}: {buffer:?}");
            buffer.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no {needle:?} without the worker: {buffer:?}"));
}

/// An HTTP/1.1 client's event stream, the worker let on `goes` times as each event arrives.
async fn framed_events(
    gateway: &gatewayd::RunningGateway,
    worker: &ScriptedWorker,
    path: &str,
    goes: usize,
) -> String {
    let (mut stream, head, mut buffer) = raw_get(gateway, path).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    let mut body = Vec::new();
    for _ in 0..goes {
        let chunk = tokio::time::timeout(PROMPT, read_chunk(&mut stream, &mut buffer)).await;
        body.extend(chunk.expect("an event without the worker").unwrap());
        worker.go();
    }
    let rest = tokio::time::timeout(PROMPT, async {
        while let Some(chunk) = read_chunk(&mut stream, &mut buffer).await {
            body.extend(chunk);
        }
    })
    .await;
    rest.expect("the stream ends without the worker");
    String::from_utf8(body).unwrap()
}

/// An HTTP/1.0 client's event stream (delimited by the close), the worker let on `goes` times as
/// each event arrives.
async fn decoded_events(
    gateway: &gatewayd::RunningGateway,
    worker: &ScriptedWorker,
    path: &str,
    goes: usize,
) -> String {
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buffer = Vec::new();
    read_until(&mut stream, &mut buffer, b"\r\n\r\n").await;
    assert!(buffer.starts_with(b"HTTP/1.0 200"), "{path}: {buffer:?}");
    for event in 1..=goes {
        read_until(
            &mut stream,
            &mut buffer,
            format!("data: {event}\n\n").as_bytes(),
        )
        .await;
        worker.go();
    }
    let read = tokio::time::timeout(PROMPT, stream.read_to_end(&mut buffer)).await;
    read.expect("the close without the worker").unwrap();
    let text = String::from_utf8(buffer).unwrap();
    text.split_once("\r\n\r\n").unwrap().1.to_owned()
}

fn events(numbers: &[&str], error: bool) -> Vec<(String, String)> {
    let mut events: Vec<_> = numbers
        .iter()
        .map(|n| ("message".to_owned(), (*n).to_owned()))
        .collect();
    if error {
        events.push(("error".to_owned(), STREAM_ERROR.to_owned()));
    }
    events
}

/// A bad trailer section ends the stream after every event that came before it, in whichever
/// read those came, for both kinds of client: `event: error` last, the error counted once per
/// stream, the load released, the broken connection never reused; a good trailer split over two
/// reads ends the body cleanly and keeps the connection.
#[tokio::test]
async fn a_bad_trailer_after_several_reads_ends_the_stream_after_all_its_events() {
    let worker = ScriptedWorker::start(script).await;
    let gateway = start(config_for(&worker)).await;
    let errors = || gateway.routing_table().workers()[0].stats.errors_total();

    let body = framed_events(&gateway, &worker, "/good-split", 1).await;
    assert_eq!(sse_events(&body), events(&["1"], false), "{body:?}");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(errors(), 0);

    let mut expected_errors = 0;
    for (path, goes, numbers) in [
        ("/late", 2, &["1", "2", "3"][..]),
        ("/split", 1, &["1"][..]),
        ("/head", 0, &["1"][..]),
        ("/big", 0, &["1"][..]),
    ] {
        let body = framed_events(&gateway, &worker, path, goes).await;
        assert_eq!(
            sse_events(&body),
            events(numbers, true),
            "1.1 {path}: {body:?}"
        );
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
        expected_errors += 1;
        assert_eq!(errors(), expected_errors, "1.1 {path}");

        let body = decoded_events(&gateway, &worker, path, goes).await;
        assert_eq!(
            sse_events(&body),
            events(numbers, true),
            "1.0 {path}: {body:?}"
        );
        assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
        expected_errors += 1;
        assert_eq!(errors(), expected_errors, "1.0 {path}");
    }

    // Any other body is cut after its good chunks: no last chunk for an HTTP/1.1 client, the
    // close after the data for an HTTP/1.0 one.
    let (mut stream, head, mut buffer) = raw_get(&gateway, "/json").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let first = tokio::time::timeout(PROMPT, read_chunk(&mut stream, &mut buffer)).await;
    assert_eq!(first.expect("the first chunk").unwrap(), b"{}");
    worker.go();
    let rest = tokio::time::timeout(PROMPT, async {
        let second = read_chunk(&mut stream, &mut buffer).await;
        (second, read_chunk(&mut stream, &mut buffer).await)
    })
    .await;
    let (second, end) = rest.expect("the cut without the worker");
    assert_eq!(second.as_deref(), Some(&b"[]"[..]));
    assert_eq!((end, buffer.as_slice()), (None, &b""[..]), "no last chunk");
    let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
    stream
        .write_all(b"GET /json HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = Vec::new();
    read_until(&mut stream, &mut buffer, b"\r\n\r\n{}").await;
    worker.go();
    let read = tokio::time::timeout(PROMPT, stream.read_to_end(&mut buffer)).await;
    read.expect("the close without the worker").unwrap();
    assert!(buffer.ends_with(b"\r\n\r\n{}[]"), "{buffer:?}");
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    assert_eq!(errors(), expected_errors + 2);

    let answer = client()
        .get(format!("http://{}/next", gateway.data_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.text().await.unwrap(), "ok");
    // The good stream's connection (which the first broken one took), one per other broken
    // stream (nine), then the next request's.
    assert_eq!(worker.data_connections.load(Ordering::SeqCst), 11);
    gateway.shutdown().await;
}

fn coded_script(target: &str) -> Vec<Step> {
    let head: &'static [u8] = match target {
        "/chunked-chunked" => {
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
        }
        "/identity" => b"HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\ncontent-length: 2\r\n\r\nok",
        "/gzip-fields" => b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "/lone-chunked" => b"HTTP/1.1 200 OK\r\ntransfer-encoding: , CHUNKED ,\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    };
    vec![Step::Write(head)]
}

/// A worker head with codings besides a lone `chunked` is a 502 that says so, and the
/// connection whose body was never read is not reused; a lone `chunked` among stray commas
/// passes and keeps its connection.
#[tokio::test]
async fn codings_besides_a_lone_chunked_are_refused_and_their_connections_dropped() {
    let worker = ScriptedWorker::start(coded_script).await;
    let gateway = start(config_for(&worker)).await;
    let get = |path: &str| {
        let url = format!("http://{}{path}", gateway.data_addr);
        async move {
            let response = client().get(url).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    assert_eq!(get("/lone-chunked").await, (200, "ok".to_owned()));
    assert_eq!(get("/next").await, (200, "ok".to_owned()));
    assert_eq!(worker.data_connections.load(Ordering::SeqCst), 1);
    for (n, path) in ["/chunked-chunked", "/identity", "/gzip-fields"]
        .into_iter()
        .enumerate()
    {
        let (status, body) = get(path).await;
        assert_eq!(status, 502, "{path}: {body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"]["code"], "invalid_worker_response", "{path}");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("transfer-encoding other than a lone chunked"),
            "{path}: {message}"
        );
        assert_eq!(get("/next").await, (200, "ok".to_owned()), "after {path}");
        assert_eq!(
            worker.data_connections.load(Ordering::SeqCst),
            n + 2,
            "after {path}"
        );
    }
    assert_eq!(wait_all_idle(&gateway).await, vec![("w".to_owned(), 0)]);
    gateway.shutdown().await;
}
