//! The data plane's narrow handle: exactly what proxying a request needs, and nothing of the
//! control plane or of start-up.

use std::sync::Arc;

use bch_core::router::Router;
use http::HeaderValue;

use crate::config::runtime::SharedSettings;
use crate::metrics::Metrics;
use crate::telemetry::Telemetry;
use crate::upstream::Upstreams;

/// What the data plane reads and updates per request: the router (decisions and load), the
/// per-request settings, the way to workers, metrics and telemetry. Built by the composition root;
/// the admin owner is the only writer of the router's membership and policy and of the settings.
pub struct DataPlane {
    /// Routing decisions and load accounting.
    pub router: Arc<Router>,
    /// Per-request settings, swapped whole on reload.
    pub settings: SharedSettings,
    /// Endpoints and connection pools of the workers.
    pub upstreams: Arc<Upstreams>,
    /// Data-path counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Routing events for the telemetry aggregator.
    pub telemetry: Telemetry,
    /// This gateway's `Via` entry ([`own_via`](super::request::own_via)): added to every
    /// forwarded request, and a request that already carries it is refused as a loop.
    pub via: HeaderValue,
}
