//! Envoy's endpoint picker: gatewayd's routing inside an Envoy data plane, over the Gateway API
//! Inference Extension's endpoint-picker protocol (Envoy's `ext_proc` gRPC service). Envoy proxies;
//! bch decides, with the same ring, rule, load accounting, metrics and telemetry as its own data
//! plane, because both go through [`crate::routing`]. docs/envoy.md shows the Envoy side.
//!
//! Files: `handle` (the narrow handle), `service` (the gRPC service and a stream's answers),
//! `health` (the standard gRPC health service on the same port, following routability),
//! `session` (one request's state machine), `messages` (the protocol's messages), `endpoints`
//! (workers' addresses and the answer's endpoint list), `metrics` (the picker's own counters). A session without a server, for the
//! allocation test, is `app::picker_harness`.

mod endpoints;
pub mod handle;
mod health;
pub mod messages;
pub mod metrics;
mod service;
mod session;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpIncoming};

use crate::tls::accept::TlsAcceptance;
use crate::tls::incoming::tls_incoming;

pub use handle::PickerPlane;
pub use metrics::PickerMetrics;
pub(crate) use session::Session;

/// Serves the picker on `listener` (HTTP/2 gRPC, over TLS with ALPN `h2` when `tls` is set),
/// with the standard gRPC health service beside it, until `shutdown`; then stops accepting and
/// waits for open streams to end (the caller bounds that wait; an open health `Watch` stream is
/// one of them).
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptance>,
    plane: Arc<PickerPlane>,
    shutdown: CancellationToken,
) {
    match tls {
        None => {
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            serve_incoming(incoming, plane, shutdown).await;
        }
        Some(tls) => {
            let incoming = tls_incoming(listener, tls, shutdown.clone());
            serve_incoming(incoming, plane, shutdown).await;
        }
    }
}

async fn serve_incoming<IO, E>(
    incoming: impl Stream<Item = Result<IO, E>> + Send + 'static,
    plane: Arc<PickerPlane>,
    shutdown: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (reporter, health_service) = tonic_health::server::health_reporter();
    // Not serving until the router says a worker is routable; set before the first probe can
    // connect (the reporter starts the whole server as serving).
    health::set_all(&reporter, tonic_health::ServingStatus::NotServing).await;
    // The one line that says which pool this picker serves (one picker per pool).
    let pool = plane.routing.settings.load().picker_model.clone();
    tracing::info!(
        pool = pool.as_deref().unwrap_or("-"),
        "endpoint picker serves one pool: {}",
        pool.as_deref().map_or_else(
            || "every worker (no models declared)".to_owned(),
            |model| format!("model {model:?}'s workers")
        )
    );
    let settings = std::sync::Arc::clone(&plane.routing.settings);
    match health::readiness(&plane.routing.router, settings) {
        Some(ready) => {
            tokio::spawn(health::report(reporter, ready, shutdown.clone()));
        }
        None => tracing::error!(
            "the router already has an observer: the picker's gRPC health stays NOT_SERVING"
        ),
    }
    // Each connection announces the cap as its MAX_CONCURRENT_STREAMS, so a peer learns it
    // before it opens a stream; the service enforces it across connections (and after a
    // reload, which the announced setting does not follow).
    let max_streams =
        u32::try_from(plane.routing.settings.load().picker_max_streams).unwrap_or(u32::MAX);
    let service = ExternalProcessorServer::new(service::PickerService::new(plane));
    let served = tonic::transport::Server::builder()
        // A dead Envoy on a silent network is noticed, and its streams (and their load) end.
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(max_streams))
        .add_service(health_service)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await;
    if let Err(error) = served {
        tracing::error!(error = %crate::error::display_chain(&error), "endpoint picker stopped");
    }
}
