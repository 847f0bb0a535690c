//! The endpoint picker's narrow handle: what answering Envoy needs, and nothing of the data plane,
//! the control plane or start-up.

use std::sync::{Arc, Mutex, PoisonError};

use super::endpoints::AddressBook;
use super::metrics::PickerMetrics;
use crate::config::SharedMembers;
use crate::health::ProbeRequests;
use crate::log_limit::LimitedLog;
use crate::routing::Routing;

/// What the picker reads and updates per ext_proc stream: the routing step it shares with the
/// data plane (router, settings, metrics, telemetry), the workers' addresses, where it asks for a
/// probe of a worker Envoy reports failing, and its own counters. Built by the composition root.
pub struct PickerPlane {
    /// Decisions, load, per-request settings, metrics and telemetry.
    pub routing: Arc<Routing>,
    /// The workers' `IP:PORT`s, per membership generation.
    pub addresses: AddressBook,
    /// The prober's requests: a report of a served fallback asks for a probe of the chosen
    /// worker, and the probe decides its health.
    pub probe_requests: ProbeRequests,
    /// The picker's own counters (reports, ended and refused streams, open streams).
    pub metrics: Arc<PickerMetrics>,
    /// The `[log]` budget of warnings about peers' claims (`Component::Picker`): locked only on
    /// that path, never across an await.
    claim_lines: Mutex<LimitedLog<()>>,
}

impl PickerPlane {
    /// A picker over `routing`, finding the workers' addresses in the membership in force
    /// `members`, asking for probes on `probe_requests`, counting in `metrics`, warning about
    /// peers' claims within `claim_lines`.
    pub fn new(
        routing: Arc<Routing>,
        members: SharedMembers,
        probe_requests: ProbeRequests,
        metrics: Arc<PickerMetrics>,
        claim_lines: LimitedLog<()>,
    ) -> Self {
        Self {
            routing,
            addresses: AddressBook::new(members),
            probe_requests,
            metrics,
            claim_lines: Mutex::new(claim_lines),
        }
    }

    /// Whether a warning about a peer's claim may be written now: anyone on the picker port can
    /// repeat a claim stream after stream, so its warnings share one `[log]` budget; a
    /// suppressed one is counted in `bch_log_lines_suppressed_total{component="picker"}`.
    pub fn admit_claim_warning(&self) -> bool {
        self.claim_lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(&(), "the picker's peers", std::time::Instant::now())
    }
}
