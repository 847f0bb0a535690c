use http::{HeaderValue, Response};

use super::*;

/// The head `response` gets for a `method` request from an HTTP `version` client that wants
/// `keep_alive`, as text with the date masked, and how its body follows.
fn head_of(
    response: Response<()>,
    length: BodyLength,
    method: Method,
    version: Version,
    keep_alive: bool,
) -> (String, Encoding, bool) {
    let (parts, ()) = response.into_parts();
    let facts = RequestFacts {
        method: &method,
        version,
        keep_alive,
    };
    let head = encode_head(&parts, length, facts, false);
    let text = String::from_utf8(head.bytes).unwrap();
    let masked = match text.find("date: ") {
        Some(at) => format!("{}date: D{}", &text[..at], &text[at + 35..]),
        None => text,
    };
    (masked, head.encoding, head.last)
}

fn json() -> Response<()> {
    let mut response = Response::new(());
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

#[test]
fn heads_are_written_as_hyper_wrote_them() {
    let get = || (Method::GET, Version::HTTP_11);
    let (method, version) = get();
    assert_eq!(
        head_of(json(), BodyLength::Known(15), method, version, true),
        (
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\ndate: D\r\n\r\n".into(),
            Encoding::Length,
            false
        )
    );
    let mut sse = json();
    sse.headers_mut()
        .append("x-two", HeaderValue::from_static("1"));
    sse.headers_mut()
        .append("x-two", HeaderValue::from_static("2"));
    assert_eq!(
        head_of(sse, BodyLength::Unknown, Method::POST, version, false),
        (
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-two: 1\r\nx-two: 2\r\nconnection: close\r\ntransfer-encoding: chunked\r\ndate: D\r\n\r\n".into(),
            Encoding::Chunked { framed: false },
            true
        )
    );
    let mut missing = Response::new(());
    *missing.status_mut() = StatusCode::NOT_FOUND;
    assert_eq!(
        head_of(missing, BodyLength::None, Method::GET, version, true).0,
        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\ndate: D\r\n\r\n"
    );
}

#[test]
fn a_workers_own_reason_phrase_is_kept() {
    let mut response = json();
    response
        .extensions_mut()
        .insert(hyper::ext::ReasonPhrase::from_static(b"Fine"));
    let (text, _, _) = head_of(
        response,
        BodyLength::Known(0),
        Method::GET,
        Version::HTTP_11,
        true,
    );
    assert!(text.starts_with("HTTP/1.1 200 Fine\r\n"), "{text}");
}

#[test]
fn head_204_and_304_carry_no_body() {
    let (text, encoding, _) = head_of(
        json(),
        BodyLength::Known(113),
        Method::HEAD,
        Version::HTTP_11,
        true,
    );
    assert_eq!(
        (text.as_str(), encoding),
        (
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 113\r\ndate: D\r\n\r\n",
            Encoding::Nothing
        )
    );
    let (text, encoding, _) = head_of(
        json(),
        BodyLength::Unknown,
        Method::HEAD,
        Version::HTTP_11,
        true,
    );
    assert!(!text.contains("transfer-encoding"), "{text}");
    assert_eq!(encoding, Encoding::Nothing);
    for status in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED] {
        let mut response = Response::new(());
        *response.status_mut() = status;
        let (text, encoding, _) = head_of(
            response,
            BodyLength::None,
            Method::GET,
            Version::HTTP_11,
            true,
        );
        assert!(!text.contains("content-length"), "{text}");
        assert_eq!(encoding, Encoding::Nothing);
    }
}

#[test]
fn an_http_1_0_client_gets_http_1_0_and_no_chunks() {
    let (text, encoding, last) = head_of(
        json(),
        BodyLength::Unknown,
        Method::GET,
        Version::HTTP_10,
        false,
    );
    assert_eq!(
        text,
        "HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ndate: D\r\n\r\n"
    );
    assert_eq!((encoding, last), (Encoding::UntilClose, true));
    let (text, encoding, last) = head_of(
        json(),
        BodyLength::Known(2),
        Method::GET,
        Version::HTTP_10,
        true,
    );
    assert_eq!(
        text,
        "HTTP/1.0 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\ncontent-length: 2\r\ndate: D\r\n\r\n"
    );
    assert_eq!((encoding, last), (Encoding::Length, false));
}

#[test]
fn a_response_that_says_close_closes() {
    let mut response = json();
    response
        .headers_mut()
        .insert("connection", HeaderValue::from_static("close"));
    let (text, _, last) = head_of(
        response,
        BodyLength::Known(1),
        Method::GET,
        Version::HTTP_11,
        true,
    );
    assert!(last);
    assert_eq!(text.matches("connection").count(), 1, "{text}");
}

/// Writes `frames` as a body with `encoding` into a buffer, as the connection writes them.
fn written(frames: &[&'static [u8]], encoding: Encoding) -> Vec<u8> {
    let mut out = Vec::new();
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    for (index, frame) in frames.iter().enumerate() {
        let mut outgoing = Outgoing::default();
        outgoing.data(
            Bytes::from_static(frame),
            encoding,
            index + 1 == frames.len(),
        );
        assert!(outgoing.poll_write(&mut out, &mut cx).is_ready());
        assert!(outgoing.is_empty(), "nothing kept once written");
    }
    out
}

#[test]
fn bodies_are_framed_by_length_by_chunks_or_as_they_come() {
    assert_eq!(written(&[b"ab", b"c"], Encoding::Length), b"abc");
    assert_eq!(
        written(
            &[b"hello", b"", b"0123456789abcdef!"],
            Encoding::Chunked { framed: false }
        ),
        b"5\r\nhello\r\n11\r\n0123456789abcdef!\r\n0\r\n\r\n"
    );
    // A relayed body's chunks pass byte for byte; the server writes the last chunk.
    let relayed: &[&'static [u8]] = &[b"9;x=y\r\ndata: 1\n\n\r\n", b"3\r\nabc\r\n", b""];
    assert_eq!(
        written(relayed, Encoding::Chunked { framed: true }),
        b"9;x=y\r\ndata: 1\n\n\r\n3\r\nabc\r\n0\r\n\r\n"
    );
}

#[test]
fn a_refused_head_gets_a_bare_answer() {
    let status_line = b"HTTP/1.1 431 Request Header Fields Too Large\r\n";
    let answer = String::from_utf8(bare_answer(status_line)).unwrap();
    assert!(answer.starts_with(
        "HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: "
    ));
    assert!(answer.ends_with(" GMT\r\n\r\n"), "{answer}");
    let fixed = "connection: close\r\ncontent-length: 0\r\ndate: \r\n\r\n".len();
    assert_eq!(answer.len(), status_line.len() + fixed + 29);
}
