//! The routing core both front ends share (router, metrics, telemetry, the admission queue, and
//! the `Routing` handle over them), built one way for start-up and for the picker's test harness, so the two cannot
//! drift apart.

use std::sync::Arc;

use bch_core::router::{Router, RouterError};
use tokio_util::sync::CancellationToken;

use crate::admission::{AdmissionQueue, AdmissionStats};
use crate::config::runtime::SharedSettings;
use crate::config::{Config, Member};
use crate::metrics::Metrics;
use crate::routing::Routing;
use crate::telemetry::Telemetry;

/// The router over the configured workers, the data-path metrics and the running telemetry
/// aggregator.
pub(crate) struct RoutingParts {
    /// Decisions, load and membership.
    pub(crate) router: Arc<Router>,
    /// Data-path counters and histograms.
    pub(crate) metrics: Arc<Metrics>,
    /// The aggregator's handle.
    pub(crate) telemetry: Telemetry,
    /// The admission queue both front ends wait in; it owns the counters telemetry also reads
    /// (`AdmissionQueue::stats`).
    pub(crate) queue: Arc<AdmissionQueue>,
}

/// Builds the router over `members` with `config`'s policy (workers start `initial_health`), the
/// metrics and telemetry; the aggregator runs until `shutdown`. Fails only on a policy or worker
/// list the router refuses. Needs a tokio runtime.
pub(crate) fn assemble_routing(
    config: &Config,
    members: &[Member],
    initial_health: bool,
    shutdown: &CancellationToken,
) -> Result<RoutingParts, RouterError> {
    let router = Arc::new(Router::with_initial_health(
        members.iter().map(|m| m.spec.clone()).collect(),
        config.policy_settings(),
        initial_health,
    )?);
    let metrics = Arc::new(Metrics::default());
    let admission = Arc::new(AdmissionStats::default());
    let queue = AdmissionQueue::new(Arc::clone(&router), Arc::clone(&admission));
    queue.start_recheck(shutdown.clone());
    let telemetry = Telemetry::start(
        Arc::clone(&router),
        &config.telemetry,
        Arc::clone(&metrics),
        Arc::clone(&admission),
        shutdown.clone(),
    );
    Ok(RoutingParts {
        router,
        metrics,
        telemetry,
        queue,
    })
}

impl RoutingParts {
    /// The routing step's handle over these parts, reading the per-request `settings`.
    pub(crate) fn routing(&self, settings: SharedSettings) -> Arc<Routing> {
        Arc::new(Routing {
            router: Arc::clone(&self.router),
            settings,
            metrics: Arc::clone(&self.metrics),
            telemetry: self.telemetry.clone(),
            queue: Arc::clone(&self.queue),
        })
    }
}
