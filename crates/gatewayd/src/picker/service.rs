//! The gRPC service Envoy's ext_proc filter calls: one bidirectional stream per HTTP request,
//! answered by a [`Session`] polled from the stream's own response body. No task, channel or
//! buffer per request: each message from Envoy is answered as it is read, and when the stream
//! ends or is dropped (Envoy reset it, the connection broke) the session, and with it the
//! request's load, goes too.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::handle::PickerPlane;
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
        Ok(Response::new(Answers {
            inbound: request.into_inner(),
            session: Some(Session::new(Arc::clone(&self.plane))),
        }))
    }
}

/// The answers of one ext_proc stream: reads Envoy's next message, lets the session answer it.
pub struct Answers {
    inbound: Streaming<ProcessingRequest>,
    /// `None` once the stream ended: the request is over.
    session: Option<Session>,
}

impl Stream for Answers {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let Some(session) = this.session.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(&mut this.inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
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
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
