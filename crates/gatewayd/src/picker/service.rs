//! The gRPC service Envoy's ext_proc filter calls: one bidirectional stream per HTTP request,
//! answered by a [`Session`] polled from the stream's own response body. No task, channel or
//! buffer per request: each message from Envoy is answered as it is read, and when the stream
//! ends or is dropped (Envoy reset it, the connection broke) the session, and with it the
//! request's load, goes too.
//!
//! Two bounds, because a stream holds a request's load for its life and anyone who reaches the
//! port can open one: at most `[picker] max_streams` are open at once (more are refused with
//! `RESOURCE_EXHAUSTED` and counted), and a stream Envoy sends nothing on for
//! `[picker] silent_stream_timeout_ms` is ended with gRPC OK (Envoy then goes on without the
//! picker), its load released, logged and counted.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tokio::time::{Instant, Sleep};
use tonic::{Request, Response, Status, Streaming};

use super::handle::PickerPlane;
use super::metrics::PickerMetrics;
use super::session::Session;

/// `envoy.service.ext_proc.v3.ExternalProcessor`, answered by bch's routing.
pub struct PickerService {
    plane: Arc<PickerPlane>,
}

impl PickerService {
    /// The service over `plane`.
    pub fn new(plane: Arc<PickerPlane>) -> Self {
        Self { plane }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for PickerService {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let settings = self.plane.routing.settings.load();
        let metrics = &self.plane.metrics;
        let cap = settings.picker_max_streams;
        if !metrics.open_stream(u64::try_from(cap).unwrap_or(u64::MAX)) {
            metrics.record_refused_stream();
            // Counted, not logged: a peer opening streams without end would flood the log.
            return Err(Status::resource_exhausted(format!(
                "the picker has its maximum of {cap} streams open ([picker] max_streams)"
            )));
        }
        let silence = settings.picker_silent_stream_timeout;
        Ok(Response::new(Answers {
            inbound: request.into_inner(),
            session: Some(Session::new(Arc::clone(&self.plane))),
            silence,
            last_message: Instant::now(),
            // One timer per stream, re-armed only when it fires (not per message).
            timer: Box::pin(tokio::time::sleep(silence)),
            metrics: Arc::clone(metrics),
        }))
    }
}

/// The answers of one ext_proc stream: reads Envoy's next message, lets the session answer it.
/// Holds one of the `[picker] max_streams` slots until dropped.
pub struct Answers {
    inbound: Streaming<ProcessingRequest>,
    /// `None` once the stream ended: the request is over.
    session: Option<Session>,
    /// `[picker] silent_stream_timeout_ms` when the stream opened.
    silence: Duration,
    /// When Envoy's last message arrived (the stream's opening before the first).
    last_message: Instant,
    /// Fires at the earliest moment the silence could be over; checked against `last_message`.
    timer: Pin<Box<Sleep>>,
    metrics: Arc<PickerMetrics>,
}

impl Answers {
    /// Whether Envoy has been silent for the whole bound; re-arms the timer when it fired early
    /// (a message came since it was set).
    fn silent_too_long(&mut self, cx: &mut Context<'_>) -> bool {
        while self.timer.as_mut().poll(cx).is_ready() {
            let due = self.last_message + self.silence;
            if Instant::now() >= due {
                return true;
            }
            self.timer.as_mut().reset(due);
        }
        false
    }
}

impl Stream for Answers {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let Some(session) = this.session.as_mut() else {
                return Poll::Ready(None);
            };
            if session.is_waiting() {
                // The request waits for a slot; Envoy sends nothing before the answer, and a reset
                // stream drops this stream (and the session's place in the queue) meanwhile. The
                // silence is the picker's, not Envoy's: it is counted from the answer.
                let answer = std::task::ready!(session.poll_admitted(cx));
                this.last_message = Instant::now();
                return Poll::Ready(Some(Ok(answer)));
            }
            match Pin::new(&mut this.inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    this.last_message = Instant::now();
                    if let Some(answer) = session.on_message(&message) {
                        return Poll::Ready(Some(Ok(answer)));
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    // Envoy reset the stream or the connection broke: the request is over.
                    tracing::debug!(%status, "ext_proc stream ended abnormally");
                    this.session = None;
                }
                Poll::Ready(None) => this.session = None,
                Poll::Pending if this.silent_too_long(cx) => {
                    if let Some(session) = this.session.as_mut() {
                        session.end_silent();
                    }
                    // Ended with gRPC OK: Envoy goes on with the request without the picker.
                    tracing::warn!(
                        silent_ms = this.silence.as_millis() as u64,
                        "ext_proc stream silent for [picker] silent_stream_timeout_ms; ended, its load released"
                    );
                    this.metrics.record_silent_stream();
                    this.session = None;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.metrics.close_stream();
    }
}
