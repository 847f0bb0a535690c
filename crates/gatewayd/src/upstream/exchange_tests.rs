//! `exchange`'s unit tests: response heads framed and refused as hyper's client framed and
//! refused them.

use super::*;

fn head(bytes: &[u8], method: &Method) -> Result<Option<ParsedHead>, ParseError> {
    parse_head(&mut BytesMut::from(bytes), method)
}

#[test]
fn response_heads_are_framed_as_hyper_framed_them() {
    let cases: [(&[u8], ResponseFraming, bool); 7] = [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", ResponseFraming::Length(5), true),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n", ResponseFraming::Chunked, true),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: ,Chunked ,\r\n\r\n", ResponseFraming::Chunked, true),
        (b"HTTP/1.1 200 OK\r\n\r\n", ResponseFraming::UntilClose, false),
        (b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", ResponseFraming::Empty, true),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n", ResponseFraming::Empty, false),
        (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\nx", ResponseFraming::Length(1), true),
    ];
    for (bytes, framing, keep_alive) in cases {
        let parsed = head(bytes, &Method::GET).unwrap().unwrap();
        assert_eq!(
            parsed.framing,
            framing,
            "{}",
            String::from_utf8_lossy(bytes)
        );
        assert_eq!(
            parsed.keep_alive,
            keep_alive,
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
    let parsed = head(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
        &Method::HEAD,
    );
    assert_eq!(parsed.unwrap().unwrap().framing, ResponseFraming::Empty);
}

#[test]
fn malformed_heads_fail_with_hyper_s_kinds_of_error() {
    let many: String = (0..=MAX_RESPONSE_HEADERS)
        .map(|i| format!("x-{i}: v\r\n"))
        .collect();
    let many = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
    let cases: [(&[u8], ParseError); 9] = [
        (
            b"NOT HTTP AT ALL\r\n\r\n",
            ParseError::Invalid(httparse::Error::Version),
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 5\r\n\r\n",
            ParseError::ContentLength,
        ),
        (
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            ParseError::TransferEncoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            ParseError::TransferCoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            ParseError::TransferCoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n",
            ParseError::TransferCoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: \r\ncontent-length: 2\r\n\r\nok",
            ParseError::TransferCoding,
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            ParseError::Upgrade,
        ),
        (many.as_bytes(), ParseError::TooLarge),
    ];
    for (bytes, error) in cases {
        assert_eq!(head(bytes, &Method::GET).err(), Some(error));
    }
    assert!(
        head(b"HTTP/1.1 200 OK\r\ncontent-le", &Method::GET)
            .unwrap()
            .is_none()
    );
}
