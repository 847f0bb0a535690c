//! The standard gRPC health service (`grpc.health.v1.Health`) on the picker's port, for
//! Kubernetes' `grpc` readiness probe and Envoy's `grpc_health_check`. The whole server (`""`) and
//! the ext_proc service report `SERVING` only while some worker of the picker's pool is routable
//! (healthy and not draining: the data plane's `/readiness` rule, within the pool), and `NOT_SERVING` from the moment shutdown
//! begins, so a probe stops sending new streams before the drain.
//!
//! The router tells [`readiness`] about every table it puts in force (one `watch` value, set
//! only when it flips); [`report`] reacts to it. Nothing is polled, and the ext_proc path never
//! touches the health service.

use bch_core::router::{PoolId, Router};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::service::PickerService;
use crate::config::runtime::SharedSettings;

/// The services whose status the health service reports: the whole server and ext_proc.
const SERVICES: [&str; 2] = [
    "",
    <ExternalProcessorServer<PickerService> as NamedService>::NAME,
];

/// Whether some worker of the picker's pool (`[picker] model`'s, read from `settings`) is
/// routable, now and after every routing change. `None` when the router already has an observer
/// (one per router): the picker then cannot follow routing.
pub fn readiness(router: &Router, settings: SharedSettings) -> Option<watch::Receiver<bool>> {
    let (sender, receiver) = watch::channel(false);
    let observed = router.observe(move |table| {
        let pool = match settings.load().picker_model.as_deref() {
            Some(model) => table.pool_of_model(model),
            None => Some(PoolId::FIRST),
        };
        let routable = pool.is_some_and(|pool| table.routable_count_in(pool) > 0);
        sender.send_if_modified(|ready| std::mem::replace(ready, routable) != routable);
    });
    observed.then_some(receiver)
}

/// Sets every reported service to `status`.
pub async fn set_all(reporter: &HealthReporter, status: ServingStatus) {
    for service in SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

/// The status for a readiness value.
pub fn status(ready: bool) -> ServingStatus {
    if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// Keeps `reporter` in step with `ready` until `shutdown`, then reports `NOT_SERVING` for good.
pub async fn report(
    reporter: HealthReporter,
    mut ready: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    loop {
        let now = *ready.borrow_and_update();
        set_all(&reporter, status(now)).await;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            changed = ready.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    set_all(&reporter, ServingStatus::NotServing).await;
}
