//! The control plane's narrow handle: what its endpoints read and whom they ask for changes.

use std::sync::Arc;

use bch_core::router::Router;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::guard::BrowserGuard;
use crate::admin::Admin;
use crate::telemetry::Telemetry;

/// Shared by every control plane request. Changes go through [`Admin`]; reads (workers, policy,
/// explain) come straight from the router's current table.
pub struct ControlPlane {
    /// The owner of membership and policy changes.
    pub admin: Arc<Admin>,
    /// The routing table, for reads.
    pub router: Arc<Router>,
    /// Websocket clients register here.
    pub telemetry: Telemetry,
    /// What `GET /metrics` renders.
    pub registry: Arc<Registry>,
    /// The bearer token every request must carry, when `admin_token_file` is set.
    pub token: Option<String>,
    /// What a browser may do here (`Host`, `Origin`, `Content-Type` checks).
    pub guard: BrowserGuard,
    /// A token that is also accepted, for `GET /metrics` only (`metrics_token_file`).
    pub metrics_token: Option<String>,
    /// Cancelled on shutdown: websocket clients get a close frame.
    pub shutdown: CancellationToken,
}

/// The address of the client on the other end of the connection, when the accept loop recorded
/// it (as `ConnectInfo`): what the log and telemetry name as the author of a change.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub Option<std::net::SocketAddr>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let info = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
        Ok(Peer(info.map(|info| info.0)))
    }
}
