//! The request body on its way to a worker, with the body-size limit enforced as it streams.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// Boxed error type of bodies and connects.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body on its way to a worker: the client's body, cut off with an error once it
/// passes `max_body_bytes` (for bodies without a `Content-Length`, which is checked up front).
pub struct UpstreamBody {
    inner: Incoming,
    remaining: u64,
}

/// The error a request body over the limit ends with; see [`is_body_too_large`].
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the configured limit")]
pub struct BodyTooLarge;

impl UpstreamBody {
    /// `inner`, allowed `max_bytes` bytes.
    pub fn new(inner: Incoming, max_bytes: u64) -> Self {
        Self {
            inner,
            remaining: max_bytes,
        }
    }
}

/// Whether `error` (or one of its causes) is [`BodyTooLarge`].
pub fn is_body_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<BodyTooLarge>() {
            return true;
        }
        cause = error.source();
    }
    false
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.remaining {
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
                    }
                    this.remaining -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => Poll::Ready(Some(Err(Box::new(error)))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
