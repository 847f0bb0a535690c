//! The standard gRPC health service on the picker's port (what Kubernetes' `grpc` readiness probe
//! and Envoy's `grpc_health_check` ask), through tonic-health's own client: the whole server and
//! the ext_proc service are `NOT_SERVING` while no worker is routable, `SERVING` once a worker
//! passes its probes, `NOT_SERVING` again when it fails them, and `NOT_SERVING` once shutdown
//! begins, told to a client already watching before the server stops.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use gatewayd::RunningGateway;
use tonic::Streaming;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// The ext_proc service's name in the health protocol.
const EXT_PROC: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

async fn health_client(picker: SocketAddr) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{picker}"))
        .expect("a URI")
        .connect()
        .await
        .expect("picker reachable");
    HealthClient::new(channel)
}

/// `Check` for the whole server (`""`) and for ext_proc; both must agree.
async fn check(picker: SocketAddr) -> ServingStatus {
    let mut client = health_client(picker).await;
    let mut statuses = Vec::new();
    for service in ["", EXT_PROC] {
        let answer = client
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap_or_else(|status| panic!("Check({service:?}) answered {status}"))
            .into_inner();
        statuses.push(answer.status());
    }
    assert_eq!(statuses[0], statuses[1], "\"\" and {EXT_PROC} disagree");
    statuses[0]
}

/// A `Watch` on the whole server's status.
async fn watch(picker: SocketAddr) -> Streaming<HealthCheckResponse> {
    health_client(picker)
        .await
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Watch opens")
        .into_inner()
}

/// Reads the watch until it reports `wanted` (bounded: probes run every 100 ms).
async fn until(statuses: &mut Streaming<HealthCheckResponse>, wanted: ServingStatus) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let answer = statuses
                .next()
                .await
                .expect("watch still open")
                .expect("no gRPC error");
            if answer.status() == wanted {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the health service never reported {wanted:?}"));
}

async fn picker_gateway(worker: &FakeWorker) -> RunningGateway {
    let mut config = test_config(&[worker]);
    config.picker.listen = Some("127.0.0.1:0".parse().unwrap());
    config.server.listeners.data_plane = false;
    // A worker takes requests once its probes pass, as in production.
    config.health.wait_for_first_probe = true;
    start(config).await
}

#[tokio::test]
async fn serving_follows_routable_workers_and_stops_when_shutdown_begins() {
    let worker = fake_worker("w1").await;
    worker.state.fail_health.store(true, Ordering::SeqCst);
    let gateway = picker_gateway(&worker).await;
    let picker = gateway.picker_addr.expect("picker listening");

    // Probed and failing: no routable worker.
    gateway.first_probes_applied().await;
    assert_eq!(check(picker).await, ServingStatus::NotServing);

    let mut statuses = watch(picker).await;
    worker.state.fail_health.store(false, Ordering::SeqCst);
    until(&mut statuses, ServingStatus::Serving).await;
    assert_eq!(check(picker).await, ServingStatus::Serving);

    worker.state.fail_health.store(true, Ordering::SeqCst);
    until(&mut statuses, ServingStatus::NotServing).await;
    assert_eq!(check(picker).await, ServingStatus::NotServing);

    worker.state.fail_health.store(false, Ordering::SeqCst);
    until(&mut statuses, ServingStatus::Serving).await;

    // Shutdown begins with the worker still routable: the watcher hears NOT_SERVING before the
    // server is gone, then lets the drain finish by hanging up.
    let stopping = tokio::spawn(gateway.shutdown());
    until(&mut statuses, ServingStatus::NotServing).await;
    drop(statuses);
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown ends once the watcher hung up")
        .unwrap();
}
