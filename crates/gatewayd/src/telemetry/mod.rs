//! Live telemetry: one aggregator task owns all telemetry data and publishes frames to websocket
//! clients (`GET /ws` on the control plane, protocol in `docs/protocol.md`).
//!
//! The data path only calls [`Telemetry::routed`] and [`Telemetry::finished`], which `try_send`
//! into a bounded queue: routing never waits for telemetry, and if the aggregator falls behind the
//! event is dropped and counted. The aggregator never awaits a client either: each client has a
//! bounded frame queue; when it is full the client loses frames (counted in its `dropped_events`)
//! and gets a fresh `snapshot` as soon as its queue has room again.
//!
//! Files: [`keys`] (key identities and the tracked-key table), `event` (what flows into the
//! aggregator), `aggregator` (the task), `clients` (per-client queues), [`wire`] (encoding),
//! `recorder` (`[telemetry] record_file`: one more client, writing a recording).

mod admission;
mod aggregator;
mod clients;
mod event;
pub mod keys;
mod recorder;
pub mod wire;

pub use recorder::RecordingTarget;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bch_core::decide::Decision;
use bch_core::router::{Router, RoutingTable};
use bch_core::telemetry::{ChangeSource, DiscoverySource};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admission::AdmissionStats;
use crate::clock::now_ms;
use crate::config::TelemetryConfig;
use crate::metrics::Metrics;
use aggregator::Aggregator;
use event::{Control, Event};
use keys::KeyTag;

/// Capacity of the data path → aggregator queue, in events. At 100k requests/s this is a few
/// hundred milliseconds of slack before events are dropped.
const EVENT_QUEUE: usize = 65_536;

/// Handle to the aggregator, used by the data path and the control plane. Cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    events: mpsc::Sender<Event>,
    control: mpsc::UnboundedSender<Control>,
    metrics: Arc<Metrics>,
    next_client: Arc<AtomicU64>,
    client_queue: usize,
}

impl Telemetry {
    /// Starts the aggregator task over `router`'s tables and the admission queue's counters
    /// (`admission`, summarised in every tick); it stops when `shutdown` is cancelled. Dropped
    /// events are counted in `metrics`.
    pub fn start(
        router: Arc<Router>,
        config: &TelemetryConfig,
        metrics: Arc<Metrics>,
        admission: Arc<AdmissionStats>,
        shutdown: CancellationToken,
    ) -> Telemetry {
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let aggregator = Aggregator::new(router, config, admission);
        tokio::spawn(aggregator.run(events_rx, control_rx, shutdown));
        Telemetry {
            events: events_tx,
            control: control_tx,
            metrics,
            next_client: Arc::new(AtomicU64::new(1)),
            client_queue: config.client_queue,
        }
    }

    /// Records a routing decision. Never blocks; drops (and counts) the event if the queue is full.
    pub fn routed(&self, table: &Arc<RoutingTable>, decision: &Decision, key: Option<KeyTag>) {
        let event = Event::Routed {
            ts_ms: now_ms(),
            table: Arc::clone(table),
            decision: *decision,
            key,
        };
        if self.events.try_send(event).is_err() {
            self.metrics.record_telemetry_drop();
        }
    }

    /// Records the end of a request on `worker` (an index into `table`). Never blocks; only
    /// tracked keys need it.
    pub fn finished(&self, table: &Arc<RoutingTable>, worker: usize, key: Option<&KeyTag>) {
        let Some(key) = key else { return };
        let event = Event::Finished {
            table: Arc::clone(table),
            worker,
            key_id: key.id,
        };
        if self.events.try_send(event).is_err() {
            self.metrics.record_telemetry_drop();
        }
    }

    /// Announces a policy change to every client, naming who made it (and from which address).
    pub fn policy_changed(&self, source: ChangeSource, client: Option<String>) {
        let _ = self.control.send(Control::PolicyChanged(source, client));
    }

    /// Publishes the discovery sources' records; clients get them in the next tick (and in every
    /// snapshot).
    pub fn discovery_changed(&self, sources: Vec<DiscoverySource>) {
        let _ = self.control.send(Control::Discovery(sources));
    }

    /// Announces that the draining worker `worker` is idle (and whether it was removed).
    pub fn drained(&self, worker: String, removed: bool) {
        let _ = self.control.send(Control::Drained { worker, removed });
    }

    /// Registers a websocket client speaking protocol `version` (1 or 2, docs/protocol.md): its
    /// id and the queue of its frames (message bodies, to be wrapped in the envelope by the
    /// connection). The first frame is a snapshot.
    pub fn register(&self, version: u32) -> (u64, mpsc::Receiver<Arc<str>>) {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.client_queue);
        let _ = self.control.send(Control::Register {
            id,
            frames: tx,
            version,
        });
        (id, rx)
    }

    /// Removes a client.
    pub fn unregister(&self, id: u64) {
        let _ = self.control.send(Control::Unregister(id));
    }

    /// Starts recording into `target` (`[telemetry] record_file`): the file is created now, then
    /// a thread writes every frame a version 2 client gets until the aggregator stops. The
    /// returned future completes once that thread has written the last frame the aggregator
    /// sent it and closed the file (after the aggregator stopped); a gateway that stops waits for
    /// it, so its recording is whole, and no rotation half done, when it has stopped.
    ///
    /// # Errors
    ///
    /// The file cannot be created or written; the error names it.
    pub fn record(
        &self,
        target: RecordingTarget,
    ) -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
        let file = recorder::create(target)?;
        let (id, frames) = self.register(bch_core::telemetry::PROTOCOL_VERSION);
        let (resync, done) = (self.clone(), self.clone());
        recorder::spawn(
            file,
            frames,
            move || resync.resync(id),
            move || done.unregister(id),
        )
    }

    /// Asks for a fresh snapshot for a client.
    pub fn resync(&self, id: u64) {
        let _ = self.control.send(Control::Resync(id));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bch_core::router::{WorkerSource, WorkerSpec};
    use bch_core::routing_key::{ExplicitKey, RoutingKey};
    use bch_core::telemetry::ServerMessage;

    use super::*;

    /// A one-worker router and a telemetry aggregator over it, ticking every `tick`, with
    /// `client_queue` frames of room per client.
    fn start_telemetry(
        tick: Duration,
        client_queue: usize,
        shutdown: &CancellationToken,
    ) -> (Arc<Router>, Telemetry) {
        let worker = WorkerSpec {
            name: "a".into(),
            url: "http://127.0.0.1:1".into(),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: Vec::new(),
        };
        let router = Arc::new(Router::new(vec![worker], Default::default()).unwrap());
        let config = TelemetryConfig {
            interval: tick,
            client_queue,
            ..TelemetryConfig::default()
        };
        let telemetry = Telemetry::start(
            Arc::clone(&router),
            &config,
            Arc::new(Metrics::default()),
            Arc::new(AdmissionStats::default()),
            shutdown.clone(),
        );
        (router, telemetry)
    }

    /// Routes one request of the explicit key `text` and tells telemetry.
    fn route(router: &Router, telemetry: &Telemetry, text: &str) {
        let key = RoutingKey::Explicit(ExplicitKey::parse(text.as_bytes()).unwrap());
        let routed = router.route(&key);
        telemetry.routed(
            &routed.table,
            &routed.decision,
            KeyTag::from_key(&key, false),
        );
    }

    /// Lets the aggregator task run until it waits (the test runtime has one thread).
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    /// Events gather in the queue between the aggregator's wake-ups, yet a client that joins
    /// sees every request routed before it asked: the command drains the queue first.
    #[tokio::test(start_paused = true)]
    async fn a_snapshot_holds_the_events_sent_just_before_it() {
        let shutdown = CancellationToken::new();
        let (router, telemetry) = start_telemetry(Duration::from_secs(60), 8, &shutdown);
        // The aggregator's first tick comes at once; the next is a minute away.
        settle().await;
        route(&router, &telemetry, "first");
        // The first event wakes the aggregator, which then lets the next ones gather.
        settle().await;
        route(&router, &telemetry, "second");
        let (_id, mut frames) = telemetry.register(bch_core::telemetry::PROTOCOL_VERSION);
        let body = frames.recv().await.expect("a snapshot");
        let ServerMessage::Snapshot(snapshot) = serde_json::from_str(&body).unwrap() else {
            panic!("the first frame is a snapshot: {body}");
        };
        let mut keys: Vec<&str> = snapshot.keys.iter().map(|k| k.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["first", "second"]);
        shutdown.cancel();
    }

    /// Back-pressure as the aggregator applies it: a client whose queue is full loses frames
    /// (counted in `dropped_events`) and gets a fresh snapshot once its queue has room.
    #[tokio::test(start_paused = true)]
    async fn a_full_client_queue_drops_ticks_then_resyncs() {
        let shutdown = CancellationToken::new();
        let (router, telemetry) = start_telemetry(Duration::from_millis(5), 2, &shutdown);
        let (id, mut frames) = telemetry.register(bch_core::telemetry::FIRST_PROTOCOL_VERSION);
        // Traffic that changes a key on every request, while nobody reads the queue: ticks (one
        // every 5 ms of paused, auto-advancing time) overflow the 2-frame queue.
        for i in 0..50 {
            route(&router, &telemetry, &format!("k{i}"));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut seen_snapshots = 0;
        let dropped = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let body = frames.recv().await.expect("client still registered");
                match serde_json::from_str(&body).unwrap() {
                    ServerMessage::Snapshot(_) => seen_snapshots += 1,
                    ServerMessage::Tick(t) if t.dropped_events > 0 => return t.dropped_events,
                    _ => {}
                }
            }
        })
        .await
        .expect("a tick reporting dropped frames");
        assert!(dropped > 0);
        assert!(
            seen_snapshots >= 2,
            "the initial snapshot, then a resync after the overflow"
        );
        telemetry.unregister(id);
        shutdown.cancel();
    }
}
