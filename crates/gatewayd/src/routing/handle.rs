//! The routing step's narrow handle, shared by both front ends (the data plane and the endpoint
//! picker): exactly what deciding, reserving load and recording a request needs.

use std::sync::Arc;

use bch_core::router::Router;

use crate::admission::AdmissionQueue;
use crate::config::runtime::SharedSettings;
use crate::metrics::Metrics;
use crate::telemetry::Telemetry;

/// What routing one request reads and updates: the router (decisions and load), the per-request
/// settings, metrics and telemetry. Built once by the composition root and shared by the data
/// plane and the picker, so both count into the same counters, histograms and telemetry; the
/// admin owner is the only writer of the router's membership and policy and of the settings.
/// The steps that use it are the functions of [`crate::routing`] ([`crate::routing::route`] and
/// the failed-connect accounting).
pub struct Routing {
    /// Routing decisions and load accounting.
    pub router: Arc<Router>,
    /// Per-request settings, swapped whole on reload.
    pub settings: SharedSettings,
    /// Data-path counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Routing events for the telemetry aggregator.
    pub telemetry: Telemetry,
    /// Where requests that find no worker with room wait; told whenever load is released.
    pub queue: Arc<AdmissionQueue>,
}
