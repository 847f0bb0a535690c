//! The queue on its own, over a real router: fairness, bounds, timeouts and clients leaving.

use std::pin::Pin;

use bch_core::policy::PolicySettings;
use bch_core::router::WorkerSpec;
use bch_core::routing_key::ExplicitKey;
use bch_core::telemetry::WorkerSource;
use futures_util::poll;

use super::*;

/// A router over one worker with room for one request, and a queue over it.
fn one_slot(
    timeout_ms: u64,
    max_queued: u64,
) -> (Arc<Router>, Arc<AdmissionQueue>, AdmissionSettings) {
    let admission = AdmissionSettings {
        max_in_flight_per_worker: 1,
        queue_timeout_ms: timeout_ms,
        max_queued,
        ..AdmissionSettings::default()
    };
    let spec = WorkerSpec {
        name: "w0".into(),
        url: "http://127.0.0.1:1".into(),
        ring_id: None,
        source: WorkerSource::Static,
        max_in_flight: None,
        models: Vec::new(),
    };
    let policy = PolicySettings {
        admission,
        ..PolicySettings::default()
    };
    let router = Arc::new(Router::new(vec![spec], policy).unwrap());
    let queue = AdmissionQueue::new(Arc::clone(&router), Arc::new(AdmissionStats::default()));
    (router, queue, admission)
}

fn explicit(key: &str) -> QueueKey {
    QueueKey::of(&RoutingKey::Explicit(
        ExplicitKey::parse(key.as_bytes()).unwrap(),
    ))
}

type Waiting = Pin<Box<dyn Future<Output = Result<Admitted, ShedReason>> + Send>>;

/// Queues a request for `key`: polled once, so it has joined when this returns.
async fn queued(
    queue: &Arc<AdmissionQueue>,
    key: QueueKey,
    settings: &AdmissionSettings,
) -> Waiting {
    let mut waiting: Waiting = Box::pin(queue.wait(key, None, settings));
    assert!(poll!(&mut waiting).is_pending(), "the request waits");
    waiting
}

#[tokio::test]
async fn a_hot_key_takes_turns_with_a_cold_one() {
    let (router, queue, settings) = one_slot(60_000, 100);
    let mut held = router.route(&RoutingKey::None).guard.expect("the one slot");
    let mut waiting = Vec::new();
    for name in ["hot", "hot", "hot", "cold"] {
        waiting.push((name, queued(&queue, explicit(name), &settings).await));
    }
    assert_eq!(queue.len(), 4);
    let mut order = Vec::new();
    while !waiting.is_empty() {
        drop(held);
        queue.slot_freed();
        let mut admitted = None;
        for (index, (name, future)) in waiting.iter_mut().enumerate() {
            if let std::task::Poll::Ready(outcome) = poll!(future) {
                let admitted_now = outcome.expect("admitted");
                assert!(admitted.is_none(), "one slot, one admission");
                admitted = Some((index, *name, admitted_now));
            }
        }
        let (index, name, admitted) = admitted.expect("a freed slot admits a waiting request");
        drop(waiting.remove(index));
        order.push(name);
        held = admitted.routed.guard.expect("admitted with the load taken");
    }
    assert_eq!(order, ["hot", "cold", "hot", "hot"]);
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.stats().waiting(), 0);
}

#[tokio::test]
async fn a_client_leaving_leaves_nothing_behind() {
    let (router, queue, settings) = one_slot(60_000, 100);
    let held = router.route(&RoutingKey::None).guard.expect("the one slot");
    let first = queued(&queue, QueueKey::Keyless, &settings).await;
    let mut second = queued(&queue, QueueKey::Keyless, &settings).await;
    assert_eq!(queue.len(), 2);
    drop(first);
    assert_eq!(queue.len(), 1, "the leaver is gone at once");
    drop(held);
    queue.slot_freed();
    let admitted = poll!(&mut second);
    let std::task::Poll::Ready(Ok(admitted)) = admitted else {
        panic!("the request behind the leaver is admitted");
    };
    // A request that leaves after it was handed its slot gives the slot back.
    let mut third = queued(&queue, QueueKey::Keyless, &settings).await;
    let fourth = queued(&queue, QueueKey::Keyless, &settings).await;
    drop(admitted);
    queue.slot_freed();
    drop(fourth);
    assert!(poll!(&mut third).is_ready());
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.stats().waiting(), 0);
}

#[tokio::test]
async fn a_slot_handed_to_a_leaver_goes_to_the_next() {
    let (router, queue, settings) = one_slot(60_000, 100);
    let held = router.route(&RoutingKey::None).guard.expect("the one slot");
    let first = queued(&queue, QueueKey::Keyless, &settings).await;
    let mut second = queued(&queue, QueueKey::Keyless, &settings).await;
    drop(held);
    queue.slot_freed();
    // The first was handed the slot but its client left before it ran.
    drop(first);
    let std::task::Poll::Ready(Ok(admitted)) = poll!(&mut second) else {
        panic!("the slot passes to the next request");
    };
    assert!(admitted.routed.guard.is_some());
    assert_eq!(router.table().workers()[0].stats.active(), 1);
}

#[tokio::test(start_paused = true)]
async fn bounds_shed_with_their_reasons() {
    let (router, queue, settings) = one_slot(500, 1);
    let _held = router.route(&RoutingKey::None).guard.expect("the one slot");
    let no_queue = AdmissionSettings {
        queue_timeout_ms: 0,
        ..settings
    };
    let shed = queue.wait(QueueKey::Keyless, None, &no_queue).await;
    assert_eq!(shed.unwrap_err(), ShedReason::NoQueue);
    let waiting = queued(&queue, QueueKey::Keyless, &settings).await;
    let full = queue.wait(explicit("other"), None, &settings).await;
    assert_eq!(full.unwrap_err(), ShedReason::QueueFull);
    assert_eq!(waiting.await.unwrap_err(), ShedReason::QueueTimeout);
    assert_eq!(queue.len(), 0);
    let stats = queue.stats();
    for reason in [
        ShedReason::NoQueue,
        ShedReason::QueueFull,
        ShedReason::QueueTimeout,
    ] {
        assert_eq!(stats.shed_total(reason), 1, "{reason}");
    }
    assert_eq!(stats.waiting(), 0);
}

/// Shutdown sheds the waiting requests at once (a clean 503 with `Retry-After` a client can retry
/// on another replica) instead of leaving them to the grace period's end, when their connections
/// are cut without an answer; a request arriving after it cannot wait either.
#[tokio::test(start_paused = true)]
async fn shutdown_sheds_the_waiting_at_once() {
    let (router, queue, settings) = one_slot(60_000, 100);
    let shutdown = CancellationToken::new();
    queue.start_recheck(shutdown.clone());
    let _held = router.route(&RoutingKey::None).guard.expect("the one slot");
    let waiting = queued(&queue, explicit("a"), &settings).await;
    shutdown.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("shutdown answers a waiting request at once, not at its queue timeout");
    assert_eq!(outcome.unwrap_err(), ShedReason::Shutdown);
    let late = tokio::time::timeout(
        Duration::from_secs(1),
        queue.wait(explicit("b"), None, &settings),
    )
    .await
    .expect("a request arriving during shutdown does not wait");
    assert_eq!(late.unwrap_err(), ShedReason::Shutdown);
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.stats().waiting(), 0);
    assert_eq!(queue.stats().shed_total(ShedReason::Shutdown), 2);
}
