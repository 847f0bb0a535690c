use super::*;

/// Parses a whole head: the head, or the refusal.
fn head(bytes: &[u8]) -> Result<ParsedHead, HeadError> {
    let (length, fields) = parse(bytes)?.expect("a complete head");
    assert_eq!(
        length,
        bytes.len(),
        "the head ends where its blank line does"
    );
    fields.into_head(&Bytes::copy_from_slice(bytes))
}

fn with_fields(version: &str, fields: &str) -> Vec<u8> {
    format!("POST /v1/chat/completions {version}\r\nhost: gw\r\n{fields}\r\n").into_bytes()
}

#[test]
fn an_incomplete_head_waits_and_a_complete_one_ends_at_its_blank_line() {
    assert_eq!(
        parse(b"GET / HTTP/1.1\r\nhost: a\r\n")
            .unwrap()
            .map(|p| p.0),
        None
    );
    let pipelined = b"GET /a HTTP/1.1\r\nhost: a\r\n\r\nGET /b HTTP/1.1\r\n";
    let (length, _) = parse(pipelined).unwrap().unwrap();
    assert_eq!(&pipelined[length..], b"GET /b HTTP/1.1\r\n");
    // Leading empty lines (a client's CRLF after a body) are skipped, as hyper skips them.
    let parsed = head(b"\r\nGET /x HTTP/1.1\r\nhost: a\r\n\r\n").unwrap();
    assert_eq!(parsed.request.uri(), "/x");
}

#[test]
fn limits_are_hypers() {
    let fields: String = (0..MAX_HEADERS - 1)
        .map(|i| format!("x-{i}: y\r\n"))
        .collect();
    assert!(
        head(&with_fields("HTTP/1.1", &fields)).is_ok(),
        "100 fields"
    );
    let fields: String = (0..MAX_HEADERS).map(|i| format!("x-{i}: y\r\n")).collect();
    assert_eq!(
        head(&with_fields("HTTP/1.1", &fields)).unwrap_err(),
        HeadError::TooLarge
    );
    let huge = format!("x: {}\r\n", "a".repeat(MAX_HEAD_BYTES));
    assert_eq!(
        parse(&with_fields("HTTP/1.1", &huge)).unwrap_err(),
        HeadError::TooLarge
    );
    // Still incomplete past the limit: refused without waiting for the rest.
    let partial = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
    assert_eq!(parse(partial.as_bytes()).unwrap_err(), HeadError::TooLarge);
    let long_target = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(70_000));
    assert_eq!(
        parse(long_target.as_bytes()).unwrap_err(),
        HeadError::TargetTooLong
    );
}

#[test]
fn malformed_heads_are_bad_requests() {
    for bad in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.2\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nx: a\r\n b\r\n\r\n",
        b"GET /a b HTTP/1.1\r\n\r\n",
    ] {
        let refused = parse(bad).and_then(|parsed| {
            let (_, fields) = parsed.expect("complete");
            fields.into_head(&Bytes::copy_from_slice(bad)).map(|_| ())
        });
        assert_eq!(
            refused,
            Err(HeadError::BadRequest),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn the_http2_preface_gets_no_answer() {
    let refused = parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap_err();
    assert_eq!(refused, HeadError::Http2Preface);
    assert_eq!(refused.status_line(), None);
    assert_eq!(
        HeadError::BadRequest.status_line(),
        Some(&b"HTTP/1.1 400 Bad Request\r\n"[..])
    );
}

#[test]
fn framing_follows_hypers_rules() {
    let framing = |version, fields| head(&with_fields(version, fields)).map(|h| h.framing);
    assert_eq!(framing("HTTP/1.1", ""), Ok(BodyFraming::Length(0)));
    assert_eq!(
        framing("HTTP/1.1", "content-length: 12\r\n"),
        Ok(BodyFraming::Length(12))
    );
    assert_eq!(
        framing("HTTP/1.1", "content-length: 3\r\ncontent-length: 3\r\n"),
        Ok(BodyFraming::Length(3))
    );
    for bad in [
        "content-length: 3\r\ncontent-length: 4\r\n",
        "content-length: x\r\n",
        "content-length: +3\r\n",
        "content-length: 3, 3\r\n",
        "transfer-encoding: gzip\r\n",
        "transfer-encoding: chunked, gzip\r\n",
    ] {
        assert_eq!(
            framing("HTTP/1.1", bad),
            Err(HeadError::BadRequest),
            "{bad}"
        );
    }
    assert_eq!(
        framing("HTTP/1.0", "transfer-encoding: chunked\r\n"),
        Err(HeadError::BadRequest)
    );
    // Codings besides a lone chunked, in one field or several: gatewayd would drop them.
    for more in [
        "transfer-encoding: gzip, chunked\r\n",
        "transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n",
        "transfer-encoding: chunked, chunked\r\n",
        "content-length: 3\r\ntransfer-encoding: identity, chunked\r\n",
    ] {
        assert_eq!(
            framing("HTTP/1.1", more),
            Err(HeadError::NotImplemented),
            "{more}"
        );
    }
    assert_eq!(
        HeadError::NotImplemented.status_line(),
        Some(&b"HTTP/1.1 501 Not Implemented\r\n"[..])
    );
    // Empty list elements name no coding.
    assert_eq!(
        framing("HTTP/1.1", "transfer-encoding: , chunked\r\n"),
        Ok(BodyFraming::Chunked)
    );
    // Both: chunked wins, the length is dropped, and the connection closes after the response.
    let both = head(&with_fields(
        "HTTP/1.1",
        "content-length: 3\r\ntransfer-encoding: chunked\r\n",
    ))
    .unwrap();
    assert_eq!(both.framing, BodyFraming::Chunked);
    assert!(!both.keep_alive);
    assert!(!both.request.headers().contains_key(header::CONTENT_LENGTH));
}

#[test]
fn keep_alive_and_expect_follow_the_version_and_the_headers() {
    let parsed = |version, fields| head(&with_fields(version, fields)).unwrap();
    assert!(parsed("HTTP/1.1", "").keep_alive);
    assert!(!parsed("HTTP/1.1", "connection: close\r\n").keep_alive);
    assert!(
        !parsed(
            "HTTP/1.1",
            "connection: close\r\nconnection: keep-alive\r\n"
        )
        .keep_alive
    );
    assert!(!parsed("HTTP/1.0", "").keep_alive);
    assert!(parsed("HTTP/1.0", "connection: Keep-Alive\r\n").keep_alive);
    assert_eq!(parsed("HTTP/1.0", "").request.version(), Version::HTTP_10);
    assert!(parsed("HTTP/1.1", "expect: 100-Continue\r\n").expect_continue);
    assert!(!parsed("HTTP/1.1", "expect: something\r\n").expect_continue);
}

#[test]
fn targets_and_headers_come_out_as_sent() {
    let parsed = head(
        b"GET http://example.com:8080/v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Two: 1\r\nx-two: 2\r\n\r\n",
    )
    .unwrap();
    let request = parsed.request;
    assert_eq!(request.method(), Method::GET);
    assert_eq!(request.uri().path(), "/v1/models");
    assert_eq!(request.uri().authority().unwrap(), "example.com:8080");
    let values: Vec<_> = request.headers().get_all("x-two").iter().collect();
    assert_eq!(values, ["1", "2"]);
    assert_eq!(request.headers()["host"], "a");
}

/// A request with two `Host` fields is refused (RFC 9112 §3.2), whether the two say the same or
/// not, in either version: which one a component behind the gateway reads is anyone's guess.
#[test]
fn two_host_fields_are_a_bad_request() {
    for request in [
        &b"GET / HTTP/1.1\r\nhost: a\r\nHost: b\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nhost: a\r\nhost: a\r\n\r\n",
        b"GET / HTTP/1.0\r\nhost: a\r\nx: y\r\nHOST: b\r\n\r\n",
    ] {
        assert_eq!(
            head(request).unwrap_err(),
            HeadError::BadRequest,
            "{}",
            String::from_utf8_lossy(request)
        );
    }
    assert!(head(b"GET / HTTP/1.1\r\nhost: a\r\nx-host: b\r\n\r\n").is_ok());
}

/// The end of a head is found however the head is split, searching each piece once from where
/// the search before it stopped; empty lines before a request line are counted to be dropped.
#[test]
fn a_heads_end_is_found_across_pieces() {
    for head in [
        &b"GET / HTTP/1.1\r\nhost: a\r\n\r\n"[..],
        b"GET / HTTP/1.1\nhost: a\n\n",
        b"GET / HTTP/1.1\r\nhost: a\n\r\n",
    ] {
        assert!(parse(head).unwrap().is_some());
        for split in 0..head.len() {
            let (first, _) = head.split_at(split);
            assert!(!blank_line_seen(first, 0), "{split}");
            assert!(blank_line_seen(head, split), "{split}");
        }
    }
    assert!(!blank_line_seen(b"GET / HTTP/1.1\r\nhost: a\r\n\r", 0));
    assert_eq!(leading_empty_lines(b"\r\n\n\r\nGET"), 5);
    assert_eq!(leading_empty_lines(b"\r\rGET"), 0);
    assert_eq!(leading_empty_lines(b"\r"), 0);
}
