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
