use std::sync::atomic::{AtomicUsize, Ordering};

use http::{HeaderValue, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

use super::*;

/// A response body: complete, or streamed from a channel until it closes.
enum TestBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            TestBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            TestBody::Stream(receiver) => receiver
                .poll_recv(cx)
                .map(|data| data.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, TestBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            TestBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            TestBody::Full(None) => SizeHint::with_exact(0),
            TestBody::Stream(_) => SizeHint::default(),
        }
    }
}

impl ChunkFramed for TestBody {}

/// The client's end of a served pipe, the server's task, its request count, and the sender of
/// `/stream`'s chunks.
type Served = (
    DuplexStream,
    tokio::task::JoinHandle<Result<(), ConnectionError>>,
    Arc<AtomicUsize>,
    mpsc::Sender<Bytes>,
);

/// A server on one end of a pipe answering `METHOD path body` to every request (`/stream`: the
/// chunks sent on the returned channel, `/slow`: never), counting requests; the client's end.
fn serve(timeout: Duration, shutdown: CancellationToken) -> Served {
    serve_through_pipe(64 * 1024, timeout, shutdown)
}

/// [`serve`] through a pipe holding at most `capacity` bytes: the server reads no more than that
/// at a time.
fn serve_through_pipe(capacity: usize, timeout: Duration, shutdown: CancellationToken) -> Served {
    let (client, server) = tokio::io::duplex(capacity);
    let served = Arc::new(AtomicUsize::new(0));
    let (sender, receiver) = mpsc::channel(8);
    let mut receiver = Some(receiver);
    let count = Arc::clone(&served);
    let service = move |request: Request<RequestBody>| {
        count.fetch_add(1, Ordering::SeqCst);
        let stream = (request.uri().path() == "/stream")
            .then(|| receiver.take())
            .flatten();
        async move {
            if request.uri().path() == "/slow" {
                std::future::pending::<()>().await;
            }
            if let Some(receiver) = stream {
                return Response::new(TestBody::Stream(receiver));
            }
            let (parts, body) = request.into_parts();
            let body = body.collect().await.map(|c| c.to_bytes());
            let text = match body {
                Ok(body) => format!(
                    "{} {} {}",
                    parts.method,
                    parts.uri.path(),
                    String::from_utf8_lossy(&body)
                ),
                Err(error) => format!("error {error}"),
            };
            let mut response = Response::new(TestBody::Full(Some(Bytes::from(text))));
            response
                .headers_mut()
                .insert("x-test", HeaderValue::from_static("1"));
            if parts.uri.path() == "/teapot" {
                *response.status_mut() = StatusCode::IM_A_TEAPOT;
            }
            response
        }
    };
    let options = ConnectionOptions {
        header_read_timeout: timeout,
        shutdown,
    };
    let task = tokio::spawn(serve_connection(server, service, options));
    (client, task, served, sender)
}

/// Everything the client reads until the server closes, date masked.
async fn read_to_close(client: &mut DuplexStream) -> String {
    let mut bytes = Vec::new();
    client.read_to_end(&mut bytes).await.unwrap();
    mask(&bytes)
}

fn mask(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut masked = String::new();
    let mut rest = &*text;
    while let Some(at) = rest.find("date: ") {
        let end = (at + 35).min(rest.len());
        masked.push_str(&rest[..at]);
        masked.push_str("date: D");
        rest = &rest[end..];
    }
    masked.push_str(rest);
    masked
}

/// Reads until `expected` bytes came (a response whose connection stays open).
async fn read_exactly(client: &mut DuplexStream, expected: &str) -> String {
    let mut bytes = Vec::new();
    while mask(&bytes).len() < expected.len() {
        let mut chunk = [0u8; 4096];
        let read = client.read(&mut chunk).await.unwrap();
        assert!(read > 0, "closed after {:?}", mask(&bytes));
        bytes.extend_from_slice(&chunk[..read]);
    }
    mask(&bytes)
}

fn answer(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nx-test: 1\r\ncontent-length: {}\r\ndate: D\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (mut client, task, served, _) = serve(Duration::from_secs(5), CancellationToken::new());
    client
        .write_all(b"POST /a HTTP/1.1\r\ncontent-length: 3\r\n\r\nonePOST /b HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\ntwo\r\n0\r\n\r\nGET /c HTTP/1.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let all = read_to_close(&mut client).await;
    let last = "HTTP/1.1 200 OK\r\nx-test: 1\r\nconnection: close\r\ncontent-length: 7\r\ndate: D\r\n\r\nGET /c ";
    assert_eq!(
        all,
        format!("{}{}{last}", answer("POST /a one"), answer("POST /b two"))
    );
    assert_eq!(served.load(Ordering::SeqCst), 3);
    task.await.unwrap().unwrap();
}

/// Requests written together and then a half-close: every one of them is answered, in order,
/// and then the connection closes. The end of the client's bytes, read while the first request
/// streams, is not the client leaving while requests of it wait to be answered.
#[tokio::test]
async fn pipelined_requests_then_a_half_close_are_all_answered() {
    let (mut client, task, served, sender) =
        serve(Duration::from_secs(5), CancellationToken::new());
    client
        .write_all(b"GET /stream HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    client.shutdown().await.unwrap();
    let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ndate: D\r\n\r\n";
    assert_eq!(read_exactly(&mut client, head).await, head);
    sender.send(Bytes::from_static(b"last")).await.unwrap();
    drop(sender);
    assert_eq!(
        read_to_close(&mut client).await,
        format!("4\r\nlast\r\n0\r\n\r\n{}", answer("GET /b "))
    );
    assert_eq!(served.load(Ordering::SeqCst), 2);
    task.await.unwrap().unwrap();
}

/// A head arriving a few bytes at a time is searched only for its end as each piece comes and
/// parsed when it is whole, as hyper does: parsed again from its first byte per piece, a long
/// head sent slowly cost time quadratic in its length.
#[tokio::test]
async fn a_head_arriving_in_pieces_is_parsed_once_it_is_whole() {
    // Every read the server does takes at most 64 bytes of this 8 KiB head: over 120 pieces.
    let (mut client, task, served, _) =
        serve_through_pipe(64, Duration::from_secs(5), CancellationToken::new());
    let value = "a".repeat(8 * 1024);
    let request = format!("GET /big HTTP/1.1\r\nx-big: {value}\r\nconnection: close\r\n\r\n");
    request_head::PARSE_CALLS.with(|calls| calls.set(0));
    request_head::SEARCHED_BYTES.with(|bytes| bytes.set(0));
    client.write_all(request.as_bytes()).await.unwrap();
    let all = read_to_close(&mut client).await;
    assert!(all.ends_with("\r\n\r\nGET /big "), "{all}");
    assert_eq!(served.load(Ordering::SeqCst), 1);
    // Once for the first piece (a head refused early is refused then), once when it is whole.
    assert_eq!(request_head::PARSE_CALLS.with(std::cell::Cell::get), 2);
    // Each later piece searched for the end once (with the two bytes before it).
    let searched = request_head::SEARCHED_BYTES.with(std::cell::Cell::get);
    assert!(searched < request.len() * 2, "{searched} bytes searched");
    task.await.unwrap().unwrap();
}

/// Empty lines before a request line, however many and however they arrive, are skipped (and
/// dropped as they come, not kept to be skipped again at every parse).
#[tokio::test]
async fn empty_lines_before_a_head_in_pieces_are_skipped() {
    let (mut client, task, _, _) =
        serve_through_pipe(64, Duration::from_secs(5), CancellationToken::new());
    let request = format!(
        "{}GET /after HTTP/1.1\r\nconnection: close\r\n\r\n",
        "\r\n\n".repeat(2000)
    );
    client.write_all(request.as_bytes()).await.unwrap();
    let all = read_to_close(&mut client).await;
    assert!(all.ends_with("\r\n\r\nGET /after "), "{all}");
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn expect_continue_is_answered_before_the_body_is_read() {
    let (mut client, _task, _, _) = serve(Duration::from_secs(5), CancellationToken::new());
    client
        .write_all(b"POST /up HTTP/1.1\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let continued = read_exactly(&mut client, "HTTP/1.1 100 Continue\r\n\r\n").await;
    assert_eq!(continued, "HTTP/1.1 100 Continue\r\n\r\n");
    client.write_all(b"body").await.unwrap();
    let expected = answer("POST /up body");
    assert_eq!(read_exactly(&mut client, &expected).await, expected);
}

#[tokio::test]
async fn a_streamed_body_is_chunked_for_http_1_1_and_close_delimited_for_http_1_0() {
    let (mut client, task, _, sender) = serve(Duration::from_secs(5), CancellationToken::new());
    client
        .write_all(b"GET /stream HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ndate: D\r\n\r\n";
    assert_eq!(read_exactly(&mut client, head).await, head);
    sender
        .send(Bytes::from_static(b"data: 1\n\n"))
        .await
        .unwrap();
    assert_eq!(
        read_exactly(&mut client, "9\r\ndata: 1\n\n\r\n").await,
        "9\r\ndata: 1\n\n\r\n"
    );
    drop(sender);
    assert_eq!(read_exactly(&mut client, "0\r\n\r\n").await, "0\r\n\r\n");
    client.write_all(b"GET /x HTTP/1.0\r\n\r\n").await.unwrap();
    assert_eq!(
        read_to_close(&mut client).await,
        "HTTP/1.0 200 OK\r\nx-test: 1\r\ncontent-length: 7\r\ndate: D\r\n\r\nGET /x "
    );
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn refused_heads_get_a_bare_answer_and_a_close() {
    for (request, status) in [
        (&b"GARBAGE\r\n\r\n"[..], "400 Bad Request"),
        (
            b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "400 Bad Request",
        ),
    ] {
        let (mut client, task, served, _) = serve(Duration::from_secs(5), CancellationToken::new());
        client.write_all(request).await.unwrap();
        assert_eq!(
            read_to_close(&mut client).await,
            format!(
                "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\ndate: D\r\n\r\n"
            )
        );
        assert!(matches!(
            task.await.unwrap(),
            Err(ConnectionError::Refused(_))
        ));
        assert_eq!(served.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_head_not_complete_in_time_closes_the_connection() {
    let (mut client, task, served, _) = serve(Duration::from_secs(2), CancellationToken::new());
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: slow")
        .await
        .unwrap();
    assert_eq!(read_to_close(&mut client).await, "");
    assert!(task.await.unwrap().unwrap_err().is_timeout());
    assert_eq!(served.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_client_that_leaves_before_its_answer_ends_the_request() {
    let (mut client, task, served, _) = serve(Duration::from_secs(5), CancellationToken::new());
    client
        .write_all(b"GET /slow HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    while served.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    client.shutdown().await.unwrap();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_closes_an_idle_connection_and_lets_a_request_in_progress_finish() {
    let shutdown = CancellationToken::new();
    let (mut idle, idle_task, _, _) = serve(Duration::from_secs(5), shutdown.clone());
    let (mut busy, busy_task, _, sender) = serve(Duration::from_secs(5), shutdown.clone());
    busy.write_all(b"GET /stream HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ndate: D\r\n\r\n";
    assert_eq!(read_exactly(&mut busy, head).await, head);
    shutdown.cancel();
    assert_eq!(read_to_close(&mut idle).await, "");
    idle_task.await.unwrap().unwrap();
    sender.send(Bytes::from_static(b"last")).await.unwrap();
    drop(sender);
    assert_eq!(read_to_close(&mut busy).await, "4\r\nlast\r\n0\r\n\r\n");
    busy_task.await.unwrap().unwrap();
}
