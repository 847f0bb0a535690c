//! A picker session without a gRPC server around it, so a test can measure the state machine
//! itself: what deciding and answering allocate per request, apart from tonic's and prost's
//! decoding of Envoy's message. Built by the same routing assembly as start-up. Not part of
//! gatewayd's API (`gatewayd::testing`).

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderMap;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio_util::sync::CancellationToken;

use super::routing_parts::assemble_routing;
use crate::config::Config;
use crate::config::runtime::RuntimeSettings;
use crate::picker::{PickerPlane, Session};
use crate::routing::Exchange;

/// One picker over `config`'s workers and policy, and the current ext_proc session on it. Needs a
/// tokio runtime (telemetry's aggregator runs as a task until the probe is dropped).
pub struct SessionProbe {
    plane: Arc<PickerPlane>,
    session: Session,
    shutdown: CancellationToken,
}

impl SessionProbe {
    /// A picker as `config` describes it (validated first; the error names the field), built by
    /// the start-up's own routing assembly, with every worker healthy (no prober runs here).
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        config.validate()?;
        let members = config.members()?;
        let shutdown = CancellationToken::new();
        let parts = assemble_routing(config, &members, true, &shutdown)?;
        let settings = Arc::new(ArcSwap::from_pointee(RuntimeSettings::from_config(config)));
        let routing = parts.routing(settings);
        // No prober here: a probe request waits in a set nothing empties (one per worker).
        let (probe_requests, _) = crate::health::ProbeRequests::channel();
        let plane = Arc::new(PickerPlane::new(
            routing,
            Arc::new(ArcSwap::from_pointee(members)),
            probe_requests,
            Arc::default(),
            crate::log_limit::LimitedLog::new(
                crate::log_limit::Component::Picker,
                crate::log_limit::LineBudget::of(&config.log),
                Arc::default(),
            ),
        ));
        Ok(Self {
            session: Session::new(Arc::clone(&plane)),
            plane,
            shutdown,
        })
    }

    /// The current session's answer to `message`.
    pub fn answer(&mut self, message: &ProcessingRequest) -> Option<ProcessingResponse> {
        self.session.on_message(message)
    }

    /// Ends the current session (as when Envoy closes the stream) and starts the next one.
    pub fn next_stream(&mut self) {
        self.session = Session::new(Arc::clone(&self.plane));
    }

    /// The routing step alone, on Envoy's header list: the decision and the load it reserves
    /// (released before this returns); `true` when a worker was chosen.
    pub fn decide(&self, headers: &HeaderMap) -> bool {
        let routing = &self.plane.routing;
        let head = crate::picker::messages::head(headers);
        let mut exchange = Exchange::begin(Arc::clone(routing), std::time::Instant::now(), head);
        let settings = routing.settings.load();
        let by = crate::routing::RouteBy {
            model: settings.picker_model.clone(),
            rid_key: None,
        };
        matches!(
            crate::routing::route_now(routing, &settings, headers, &by, &mut exchange),
            Ok(crate::routing::Placement::Chosen(_))
        )
    }
}

impl Drop for SessionProbe {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
