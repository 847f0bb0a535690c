//! The endpoint picker's narrow handle: what answering Envoy needs, and nothing of the data plane,
//! the control plane or start-up.

use std::sync::Arc;

use super::endpoints::AddressBook;
use crate::config::SharedMembers;
use crate::routing::Routing;

/// What the picker reads and updates per ext_proc stream: the routing step it shares with the
/// data plane (router, settings, metrics, telemetry) and the workers' addresses. Built by the
/// composition root.
pub struct PickerPlane {
    /// Decisions, load, per-request settings, metrics and telemetry.
    pub routing: Arc<Routing>,
    /// The workers' `IP:PORT`s, per membership generation.
    pub addresses: AddressBook,
}

impl PickerPlane {
    /// A picker over `routing`, finding the workers' addresses in the membership in force
    /// `members`.
    pub fn new(routing: Arc<Routing>, members: SharedMembers) -> Self {
        Self {
            routing,
            addresses: AddressBook::new(members),
        }
    }
}
