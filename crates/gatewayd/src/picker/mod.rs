//! Envoy's endpoint picker: gatewayd's routing inside an Envoy data plane, over the Gateway API
//! Inference Extension's endpoint-picker protocol (Envoy's `ext_proc` gRPC service). Envoy proxies;
//! bch decides, with the same ring, rule, load accounting, metrics and telemetry as its own data
//! plane, because both go through [`crate::routing`]. docs/envoy.md shows the Envoy side.
//!
//! Files: `handle` (the narrow handle), `service` (the gRPC service and a stream's answers),
//! `session` (one request's state machine), `messages` (the protocol's messages), `endpoints`
//! (workers' addresses and the answer's endpoint list). A session without a server, for the
//! allocation test, is `app::picker_harness`.

mod endpoints;
pub mod handle;
pub mod messages;
mod service;
mod session;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

pub use handle::PickerPlane;
pub(crate) use session::Session;

/// Serves the picker on `listener` (plaintext HTTP/2 gRPC) until `shutdown`; then stops
/// accepting and waits for open streams to end (the caller bounds that wait).
pub async fn serve(listener: TcpListener, plane: Arc<PickerPlane>, shutdown: CancellationToken) {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = ExternalProcessorServer::new(service::PickerService::new(plane));
    let served = tonic::transport::Server::builder()
        // A dead Envoy on a silent network is noticed, and its streams (and their load) end.
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .serve_with_incoming_shutdown(service, incoming, shutdown.cancelled_owned())
        .await;
    if let Err(error) = served {
        tracing::error!(error = %crate::error::display_chain(&error), "endpoint picker stopped");
    }
}
