use std::collections::VecDeque;

use http_body_util::BodyExt;

use super::*;

/// A client whose reads return `pieces` one per read, then the end of the connection; what is
/// written to it is kept.
pub(super) struct Pieces {
    pub(super) pieces: VecDeque<Vec<u8>>,
    pub(super) written: Vec<u8>,
}

impl Pieces {
    pub(super) fn new(pieces: &[&[u8]]) -> Self {
        Self {
            // An empty read is the end of the connection: only the end makes one.
            pieces: pieces
                .iter()
                .filter(|piece| !piece.is_empty())
                .map(|piece| piece.to_vec())
                .collect(),
            written: Vec::new(),
        }
    }
}

impl AsyncRead for Pieces {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(mut piece) = this.pieces.pop_front() {
            let take = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..take]);
            if take < piece.len() {
                this.pieces.push_front(piece.split_off(take));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Pieces {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The body of a request with `framing` whose bytes come in `pieces` (after `pending`, the
/// bytes read with the head): its data, or its error; and the connection's state after.
async fn read_body(
    framing: BodyFraming,
    expect_continue: bool,
    pending: &[u8],
    pieces: &[&[u8]],
) -> (
    Result<Vec<u8>, RequestBodyError>,
    Arc<Mutex<Shared<Pieces>>>,
) {
    let shared = Arc::new(Mutex::new(Shared::new(Pieces::new(pieces))));
    let number = {
        let mut state = shared.lock().unwrap();
        state.pending.extend_from_slice(pending);
        state.start_body(framing, expect_continue)
    };
    let body = RequestBody::of(&shared, number);
    let collected = body.collect().await.map(|c| c.to_bytes().to_vec());
    (collected, shared)
}

#[tokio::test]
async fn a_content_length_body_ends_at_its_length_and_leaves_what_follows() {
    let (body, shared) = read_body(
        BodyFraming::Length(10),
        false,
        b"hel",
        &[b"lo ", b"worldGET / HTTP/1.1\r\n"],
    )
    .await;
    assert_eq!(body.unwrap(), b"hello world"[..10]);
    let state = shared.lock().unwrap();
    assert!(state.body_done());
    // Never read past the body's length: the next request is still the socket's.
    assert!(state.pending.is_empty());
    assert_eq!(unread(&state), b"dGET / HTTP/1.1\r\n");
}

/// What the next request will find: bytes read ahead, then what the socket still holds.
fn unread(state: &Shared<Pieces>) -> Vec<u8> {
    let mut rest = state.pending.to_vec();
    rest.extend(state.io.pieces.iter().flatten());
    rest
}

#[tokio::test]
async fn a_content_length_body_cut_short_is_incomplete() {
    let (body, _) = read_body(BodyFraming::Length(10), false, b"", &[b"hello"]).await;
    assert!(
        matches!(body, Err(RequestBodyError::Incomplete)),
        "{body:?}"
    );
}

#[tokio::test]
async fn a_chunked_body_split_anywhere_decodes_with_extensions_and_trailers_dropped() {
    let whole: &[u8] = b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
    for cut in 0..whole.len() {
        for second in cut..whole.len() {
            let pieces = [&whole[cut..second], &whole[second..]];
            let (body, shared) =
                read_body(BodyFraming::Chunked, false, &whole[..cut], &pieces).await;
            assert_eq!(body.unwrap(), b"hello world", "cut at {cut} and {second}");
            let state = shared.lock().unwrap();
            assert!(state.body_done());
            assert_eq!(unread(&state), b"NEXT", "cut at {cut} and {second}");
        }
    }
}

#[tokio::test]
async fn a_malformed_or_truncated_chunked_body_is_the_clients_fault() {
    let (body, _) = read_body(
        BodyFraming::Chunked,
        false,
        b"",
        &[b"5\r\nhello\r\nZZZ\r\nmore\r\n0\r\n\r\n"],
    )
    .await;
    match body {
        Err(RequestBodyError::Malformed(error)) => {
            assert_eq!(error, ChunkedError::MissingSizeDigit);
        }
        other => panic!("{other:?}"),
    }
    let (body, _) = read_body(BodyFraming::Chunked, false, b"", &[b"5\r\nhel"]).await;
    assert!(
        matches!(body, Err(RequestBodyError::Incomplete)),
        "{body:?}"
    );
}

#[tokio::test]
async fn continue_is_sent_when_the_body_is_first_polled_and_only_then() {
    let (body, shared) = read_body(BodyFraming::Length(2), true, b"", &[b"ok"]).await;
    assert_eq!(body.unwrap(), b"ok");
    assert_eq!(
        shared.lock().unwrap().io.written,
        b"HTTP/1.1 100 Continue\r\n\r\n"
    );
    // Answered before its body was read: no `100 Continue`.
    let shared = Arc::new(Mutex::new(Shared::new(Pieces::new(&[]))));
    let mut state = shared.lock().unwrap();
    state.start_body(BodyFraming::Length(2), true);
    state.skip_continue();
    assert!(state.io.written.is_empty());
}

#[tokio::test]
async fn a_body_of_an_earlier_request_reads_nothing_of_the_next() {
    let shared = Arc::new(Mutex::new(Shared::new(Pieces::new(&[b"abcd"]))));
    let first = shared
        .lock()
        .unwrap()
        .start_body(BodyFraming::Length(4), false);
    let stale = RequestBody::of(&shared, first);
    {
        let mut state = shared.lock().unwrap();
        state.finish_request();
        state.start_body(BodyFraming::Length(4), false);
    }
    assert!(stale.is_end_stream());
    assert!(matches!(
        stale.collect().await,
        Err(RequestBodyError::Incomplete)
    ));
    assert_eq!(shared.lock().unwrap().io.pieces.len(), 1, "nothing read");
}

#[test]
fn hints_say_what_is_left() {
    let shared = Arc::new(Mutex::new(Shared::new(Pieces::new(&[]))));
    let number = shared
        .lock()
        .unwrap()
        .start_body(BodyFraming::Length(7), false);
    let body = RequestBody::of(&shared, number);
    assert_eq!(body.size_hint().exact(), Some(7));
    assert!(!body.is_end_stream());
    assert!(RequestBody::empty().is_end_stream());
    assert_eq!(RequestBody::empty().size_hint().exact(), Some(0));
}
