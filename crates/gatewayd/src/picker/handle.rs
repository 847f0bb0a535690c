//! The endpoint picker's narrow handle: what answering Envoy needs, and nothing of the data plane,
//! the control plane or start-up.

use std::sync::Arc;

use super::endpoints::AddressBook;
use super::metrics::PickerMetrics;
use crate::config::SharedMembers;
use crate::health::ProbeRequests;
use crate::routing::Routing;

/// What the picker reads and updates per ext_proc stream: the routing step it shares with the
/// data plane (router, settings, metrics, telemetry), the workers' addresses, where it asks for a
/// probe of a worker Envoy reports failing, and its own counters. Built by the composition root.
pub struct PickerPlane {
    /// Decisions, load, per-request settings, metrics and telemetry.
    pub routing: Arc<Routing>,
    /// The workers' `IP:PORT`s, per membership generation.
    pub addresses: AddressBook,
    /// The prober's queue: a report of a served fallback asks for a probe of the chosen worker,
    /// and the probe decides its health.
    pub probe_requests: ProbeRequests,
    /// The picker's own counters (reports, ended and refused streams, open streams).
    pub metrics: Arc<PickerMetrics>,
}

impl PickerPlane {
    /// A picker over `routing`, finding the workers' addresses in the membership in force
    /// `members`, asking for probes on `probe_requests`, counting in `metrics`.
    pub fn new(
        routing: Arc<Routing>,
        members: SharedMembers,
        probe_requests: ProbeRequests,
        metrics: Arc<PickerMetrics>,
    ) -> Self {
        Self {
            routing,
            addresses: AddressBook::new(members),
            probe_requests,
            metrics,
        }
    }
}
