//! The data plane's narrow handle: exactly what proxying a request needs, and nothing of the
//! control plane or of start-up.

use std::sync::Arc;

use http::HeaderValue;

use crate::routing::Routing;
use crate::upstream::Upstreams;

/// What the data plane reads and updates per request: the routing step it shares with the
/// endpoint picker (router, settings, metrics, telemetry) and the way to workers. Built by the
/// composition root.
pub struct DataPlane {
    /// Decisions, load, per-request settings, metrics and telemetry.
    pub routing: Arc<Routing>,
    /// Endpoints and connection pools of the workers.
    pub upstreams: Arc<Upstreams>,
    /// This gateway's `Via` entry ([`own_via`](super::request::own_via)): added to every
    /// forwarded request, and a request that already carries it is refused as a loop.
    pub via: HeaderValue,
}
