//! Live telemetry: one aggregator task owns all telemetry data and publishes frames to websocket
//! clients (`GET /ws` on the control plane, protocol in `docs/protocol.md`).
//!
//! The data path only calls [`Telemetry::routed`] and [`Telemetry::finished`], which `try_send`
//! into a bounded queue: routing never waits for telemetry, and if the aggregator falls behind the
//! event is dropped and counted. The aggregator never awaits a client either: each client has a
//! bounded frame queue; when it is full the client loses frames (counted in its `dropped_events`)
//! and gets a fresh `snapshot` as soon as its queue has room again.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bch_core::decide::Decision;
use bch_core::policy::Branch;
use bch_core::ring::Ring;
use bch_core::router::{Router, RoutingTable};
use bch_core::routing_key::{ExplicitKey, ImplicitKey, MAX_EXPLICIT_KEY_BYTES, RoutingKey};
use bch_core::telemetry::{
    ChangeSource, KeyKind, KeyRecord, PolicyUpdate, RingOwnership, RingShare, RingUpdate,
    ServerMessage, Snapshot, SpillEvent, Tick, Totals, WorkerRecord,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::TelemetryConfig;
use crate::metrics::Metrics;

/// Capacity of the data path → aggregator queue, in events. At 100k requests/s this is a few
/// hundred milliseconds of slack before events are dropped.
const EVENT_QUEUE: usize = 65_536;

/// A routing key as telemetry sees it: an identity plus what its display label is made from.
/// Implicit keys carry only their hash, so no credential ever reaches the aggregator.
///
/// The label is rendered by the aggregator, and only when it needs one (a key it does not track
/// yet, a spill event): the data path copies at most [`MAX_EXPLICIT_KEY_BYTES`] bytes inline and
/// allocates nothing per request.
#[derive(Debug, Clone)]
pub struct KeyEvent {
    id: u64,
    kind: KeyKind,
    label: KeyLabel,
}

#[derive(Debug, Clone)]
enum KeyLabel {
    Explicit {
        redact: bool,
        len: u8,
        text: [u8; MAX_EXPLICIT_KEY_BYTES],
    },
    Implicit(ImplicitKey),
}

impl KeyLabel {
    /// The label the key would get from [`ExplicitKey::label`] / [`ImplicitKey::label`].
    fn render(&self) -> Arc<str> {
        match self {
            KeyLabel::Explicit { redact, len, text } => {
                match ExplicitKey::parse(&text[..usize::from(*len)]) {
                    Ok(key) => key.label(*redact).into(),
                    Err(_) => Arc::from(""),
                }
            }
            KeyLabel::Implicit(key) => key.label().into(),
        }
    }
}

impl KeyEvent {
    /// Telemetry identity of a request's key; `None` for target-worker and keyless requests.
    pub fn from_key(key: &RoutingKey<'_>, redact: bool) -> Option<KeyEvent> {
        match key {
            RoutingKey::Explicit(explicit) => {
                let raw = explicit.as_str().as_bytes();
                let mut text = [0u8; MAX_EXPLICIT_KEY_BYTES];
                // A parsed explicit key is at most MAX_EXPLICIT_KEY_BYTES (128) bytes.
                let len = raw.len().min(MAX_EXPLICIT_KEY_BYTES);
                text[..len].copy_from_slice(&raw[..len]);
                Some(KeyEvent {
                    id: explicit.position(),
                    kind: KeyKind::Explicit,
                    label: KeyLabel::Explicit {
                        redact,
                        len: len as u8,
                        text,
                    },
                })
            }
            RoutingKey::Implicit(implicit) => Some(KeyEvent {
                // Flip a bit so an implicit key never shares a record with an explicit one that
                // happens to hash alike.
                id: implicit.position() ^ 1,
                kind: KeyKind::Implicit,
                label: KeyLabel::Implicit(*implicit),
            }),
            RoutingKey::Target(_) | RoutingKey::None => None,
        }
    }
}

// `Routed` carries the key label's bytes inline (up to 128) so that the data path allocates nothing
// per request; the queue's blocks are allocated once and reused.
#[allow(clippy::large_enum_variant)]
enum Event {
    Routed {
        ts_ms: u64,
        table: Arc<RoutingTable>,
        decision: Decision,
        key: Option<KeyEvent>,
    },
    Finished {
        table: Arc<RoutingTable>,
        worker: usize,
        key_id: u64,
    },
}

enum Control {
    Register {
        id: u64,
        frames: mpsc::Sender<Arc<str>>,
    },
    Unregister(u64),
    Resync(u64),
    PolicyChanged(ChangeSource),
}

/// Handle used by the data path and the control plane. Cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    events: mpsc::Sender<Event>,
    control: mpsc::UnboundedSender<Control>,
    metrics: Arc<Metrics>,
    next_client: Arc<AtomicU64>,
    /// Frames queued per client.
    pub client_queue: usize,
}

impl Telemetry {
    /// Starts the aggregator task; it stops when `shutdown` is cancelled.
    pub fn start(
        router: Arc<Router>,
        config: TelemetryConfig,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Telemetry {
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let client_queue = config.client_queue;
        let aggregator = Aggregator::new(router, config);
        tokio::spawn(aggregator.run(events_rx, control_rx, shutdown));
        Telemetry {
            events: events_tx,
            control: control_tx,
            metrics,
            next_client: Arc::new(AtomicU64::new(1)),
            client_queue,
        }
    }

    /// Records a routing decision. Never blocks; drops (and counts) the event if the queue is full.
    pub fn routed(&self, table: &Arc<RoutingTable>, decision: &Decision, key: Option<KeyEvent>) {
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

    /// Records the end of a request on `worker`. Never blocks.
    pub fn finished(&self, table: &Arc<RoutingTable>, worker: usize, key: Option<&KeyEvent>) {
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

    /// Announces a policy change to every client.
    pub fn policy_changed(&self, source: ChangeSource) {
        let _ = self.control.send(Control::PolicyChanged(source));
    }

    /// Registers a websocket client; its first frame will be a snapshot.
    pub fn register(&self) -> (u64, mpsc::Receiver<Arc<str>>) {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.client_queue);
        let _ = self.control.send(Control::Register { id, frames: tx });
        (id, rx)
    }

    /// Removes a client.
    pub fn unregister(&self, id: u64) {
        let _ = self.control.send(Control::Unregister(id));
    }

    /// Asks for a fresh snapshot for a client.
    pub fn resync(&self, id: u64) {
        let _ = self.control.send(Control::Resync(id));
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Serialises a message body once (`{"type":...}`); each connection adds its own envelope.
pub fn encode_message(message: &ServerMessage) -> Arc<str> {
    serde_json::to_string(message)
        .expect("telemetry messages always serialise")
        .into()
}

/// Wraps a pre-serialised message body in the `{"v":1,"seq":N,...}` envelope.
pub fn envelope(seq: u64, body: &str) -> String {
    let rest = body.strip_prefix('{').unwrap_or(body);
    let mut frame = String::with_capacity(body.len() + 24);
    frame.push_str("{\"v\":");
    frame.push_str(&bch_core::telemetry::PROTOCOL_VERSION.to_string());
    frame.push_str(",\"seq\":");
    frame.push_str(&seq.to_string());
    if rest != "}" {
        frame.push(',');
    }
    frame.push_str(rest);
    frame
}

struct Client {
    frames: mpsc::Sender<Arc<str>>,
    dropped: u64,
    needs_snapshot: bool,
}

struct KeyState {
    kind: KeyKind,
    /// Rendered only when a record is built for a client: with more live keys than `max_keys`,
    /// most requests bring a new key, and most such keys are evicted before anyone looks.
    label: KeyLabel,
    preferred: String,
    current: String,
    active: BTreeMap<String, u64>,
    requests_total: u64,
    spills_total: u64,
    last_seen_ms: u64,
    dirty: bool,
}

impl KeyState {
    fn record(&self) -> KeyRecord {
        KeyRecord {
            key: self.label.render().to_string(),
            kind: self.kind,
            preferred: self.preferred.clone(),
            current: self.current.clone(),
            active: self.active.clone(),
            requests_total: self.requests_total,
            spills_total: self.spills_total,
            last_seen_ms: self.last_seen_ms,
        }
    }
}

struct Aggregator {
    router: Arc<Router>,
    config: TelemetryConfig,
    clients: HashMap<u64, Client>,
    keys: HashMap<u64, KeyState>,
    /// `(last_seen_ms, key id)` of every tracked key: the eviction order.
    by_age: BTreeSet<(u64, u64)>,
    removed_keys: Vec<String>,
    spills: VecDeque<SpillEvent>,
    new_spills: Vec<SpillEvent>,
    last_workers: HashMap<String, WorkerRecord>,
    ring_generation: u64,
    ring: RingOwnership,
    requests_total: u64,
    spills_total: u64,
    /// `(time, requests_total, spills_total)` at recent ticks, oldest first, spanning about
    /// [`RATE_WINDOW`]: rates are averaged over it.
    rate_samples: VecDeque<(tokio::time::Instant, u64, u64)>,
    totals: Totals,
}

/// Rates (requests/s, spills/s) are averaged over this window rather than one tick: traffic comes in
/// bursts (a group of sibling requests), and a per-100 ms rate would flicker between 0 and a peak.
const RATE_WINDOW: Duration = Duration::from_secs(1);

impl Aggregator {
    fn new(router: Arc<Router>, config: TelemetryConfig) -> Self {
        let table = router.table();
        let ring = ring_ownership(&table);
        Self {
            ring_generation: table.membership_generation(),
            ring,
            router,
            config,
            clients: HashMap::new(),
            keys: HashMap::new(),
            by_age: BTreeSet::new(),
            removed_keys: Vec::new(),
            spills: VecDeque::new(),
            new_spills: Vec::new(),
            last_workers: HashMap::new(),
            requests_total: 0,
            spills_total: 0,
            rate_samples: VecDeque::from([(tokio::time::Instant::now(), 0, 0)]),
            totals: Totals::default(),
        }
    }

    async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut control: mpsc::UnboundedReceiver<Control>,
        shutdown: CancellationToken,
    ) {
        let mut interval =
            tokio::time::interval(Duration::from_millis(self.config.interval_ms.max(1)));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(event) = events.recv() => {
                    self.apply(event);
                    // Drain what is already queued so one wake-up handles a burst.
                    while let Ok(event) = events.try_recv() {
                        self.apply(event);
                    }
                }
                Some(command) = control.recv() => self.control(command),
                _ = interval.tick() => self.tick(),
            }
        }
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::Routed {
                ts_ms,
                table,
                decision,
                key,
            } => self.routed(ts_ms, &table, &decision, key),
            Event::Finished {
                table,
                worker,
                key_id,
            } => {
                if let Some(state) = self.keys.get_mut(&key_id) {
                    let name = &table.workers()[worker].spec.name;
                    if let Some(count) = state.active.get_mut(name) {
                        *count = count.saturating_sub(1);
                        if *count == 0 {
                            state.active.remove(name);
                        }
                        state.dirty = true;
                    }
                }
            }
        }
    }

    fn routed(
        &mut self,
        ts_ms: u64,
        table: &RoutingTable,
        decision: &Decision,
        key: Option<KeyEvent>,
    ) {
        self.requests_total += 1;
        let name = |w: usize| table.workers()[w].spec.name.clone();
        if decision.branch.is_spill_event() {
            self.spills_total += 1;
            if let (Some(bound), Some(from), Some(to)) =
                (decision.bound, decision.preferred, decision.worker)
            {
                let event = SpillEvent {
                    ts_ms,
                    key: key
                        .as_ref()
                        .map(|k| k.label.render().to_string())
                        .unwrap_or_default(),
                    branch: decision.branch,
                    from: name(from),
                    to: name(to),
                    preferred_load: bound.preferred_load,
                    min_load: bound.min_load,
                    mean_load: bound.mean_load,
                    min_load_gap: bound.min_load_gap,
                    max_load_skew: bound.max_load_skew,
                };
                self.spills.push_back(event.clone());
                while self.spills.len() > self.config.max_spill_events {
                    self.spills.pop_front();
                }
                self.new_spills.push(event);
            }
        }
        let (Some(key), Some(worker)) = (key, decision.worker) else {
            return;
        };
        if !self.keys.contains_key(&key.id) && self.keys.len() >= self.config.max_keys {
            self.evict_oldest();
        }
        if self.config.max_keys == 0 {
            return;
        }
        // Steady state (a tracked key on the same workers) allocates nothing: names are only
        // copied when they change.
        let worker_name = &table.workers()[worker].spec.name;
        let state = match self.keys.entry(key.id) {
            Entry::Occupied(entry) => {
                let state = entry.into_mut();
                if state.last_seen_ms != ts_ms {
                    self.by_age.remove(&(state.last_seen_ms, key.id));
                    self.by_age.insert((ts_ms, key.id));
                }
                state
            }
            Entry::Vacant(entry) => {
                self.by_age.insert((ts_ms, key.id));
                entry.insert(KeyState {
                    kind: key.kind,
                    label: key.label,
                    preferred: String::new(),
                    current: String::new(),
                    active: BTreeMap::new(),
                    requests_total: 0,
                    spills_total: 0,
                    last_seen_ms: ts_ms,
                    dirty: true,
                })
            }
        };
        match decision.preferred {
            Some(p) => {
                let preferred = &table.workers()[p].spec.name;
                if state.preferred != *preferred {
                    state.preferred.clone_from(preferred);
                }
            }
            None => state.preferred.clear(),
        }
        match state.active.get_mut(worker_name.as_str()) {
            Some(count) => *count += 1,
            None => {
                state.active.insert(worker_name.clone(), 1);
            }
        }
        if state.current != *worker_name {
            state.current.clone_from(worker_name);
        }
        state.requests_total += 1;
        if decision.branch == Branch::ExplicitRoutingKeySpillover {
            state.spills_total += 1;
        }
        state.last_seen_ms = ts_ms;
        state.dirty = true;
    }

    fn evict_oldest(&mut self) {
        // With more live keys than max_keys this runs for most requests: the age index makes it
        // O(log n) instead of a scan of every tracked key.
        if let Some((_, id)) = self.by_age.pop_first() {
            if let Some(state) = self.keys.remove(&id) {
                // Only clients need to hear about it; without any, a new client's snapshot is
                // the whole truth.
                if !self.clients.is_empty() {
                    self.removed_keys.push(state.label.render().to_string());
                }
            }
        }
    }

    fn control(&mut self, command: Control) {
        match command {
            Control::Register { id, frames } => {
                self.clients.insert(
                    id,
                    Client {
                        frames,
                        dropped: 0,
                        needs_snapshot: true,
                    },
                );
                let snapshot = self.snapshot_message();
                self.deliver_snapshots(&snapshot);
            }
            Control::Unregister(id) => {
                self.clients.remove(&id);
            }
            Control::Resync(id) => {
                if let Some(client) = self.clients.get_mut(&id) {
                    client.needs_snapshot = true;
                }
                let snapshot = self.snapshot_message();
                self.deliver_snapshots(&snapshot);
            }
            Control::PolicyChanged(source) => {
                let message = encode_message(&ServerMessage::Policy(PolicyUpdate {
                    ts_ms: now_ms(),
                    policy: *self.router.table().policy(),
                    changed_by: source,
                }));
                self.broadcast(&message);
            }
        }
    }

    fn snapshot_message(&self) -> Arc<str> {
        let table = self.router.table();
        let mut keys: Vec<&KeyState> = self.keys.values().collect();
        keys.sort_by_key(|k| std::cmp::Reverse(k.last_seen_ms));
        encode_message(&ServerMessage::Snapshot(Snapshot {
            ts_ms: now_ms(),
            policy: *table.policy(),
            workers: table.worker_records(),
            ring: if table.membership_generation() == self.ring_generation {
                self.ring.clone()
            } else {
                ring_ownership(&table)
            },
            keys: keys.into_iter().map(KeyState::record).collect(),
            spills: self.spills.iter().cloned().collect(),
            totals: self.totals,
        }))
    }

    /// Sends the snapshot to every client that needs one and has room for it.
    fn deliver_snapshots(&mut self, snapshot: &Arc<str>) {
        for client in self.clients.values_mut() {
            if client.needs_snapshot && client.frames.try_send(Arc::clone(snapshot)).is_ok() {
                client.needs_snapshot = false;
            }
        }
        self.clients.retain(|_, c| !c.frames.is_closed());
    }

    /// Sends a frame to every client in sync; a client whose queue is full loses it and is marked
    /// for a fresh snapshot.
    fn broadcast(&mut self, message: &Arc<str>) {
        for client in self.clients.values_mut() {
            if client.needs_snapshot {
                client.dropped += 1;
                continue;
            }
            if client.frames.try_send(Arc::clone(message)).is_err() {
                client.dropped += 1;
                client.needs_snapshot = true;
            }
        }
        self.clients.retain(|_, c| !c.frames.is_closed());
    }

    fn tick(&mut self) {
        let table = self.router.table();
        let now = tokio::time::Instant::now();
        // Keep one sample at least RATE_WINDOW old (or the oldest there is) as the base.
        while self.rate_samples.len() > 1
            && now.duration_since(self.rate_samples[1].0) >= RATE_WINDOW
        {
            self.rate_samples.pop_front();
        }
        let (since, requests_then, spills_then) = self.rate_samples[0];
        let elapsed = now.duration_since(since).as_secs_f64().max(1e-3);
        self.totals = Totals {
            requests_per_s: (self.requests_total - requests_then) as f64 / elapsed,
            spills_per_s: (self.spills_total - spills_then) as f64 / elapsed,
            requests_total: self.requests_total,
            spills_total: self.spills_total,
        };
        self.rate_samples
            .push_back((now, self.requests_total, self.spills_total));

        if table.membership_generation() != self.ring_generation {
            self.ring_generation = table.membership_generation();
            self.ring = ring_ownership(&table);
            let message = encode_message(&ServerMessage::Ring(RingUpdate {
                ts_ms: now_ms(),
                workers: table.worker_records(),
                ring: self.ring.clone(),
            }));
            self.broadcast(&message);
        }

        let workers = table.worker_records();
        let changed_workers: Vec<WorkerRecord> = workers
            .into_iter()
            .filter(|w| self.last_workers.get(&w.name) != Some(w))
            .collect();
        self.last_workers
            .retain(|name, _| table.index_of(name).is_some());
        for w in &changed_workers {
            self.last_workers.insert(w.name.clone(), w.clone());
        }
        if self.clients.is_empty() {
            // Nobody to tell: a client that connects later starts from a snapshot.
            for key in self.keys.values_mut() {
                key.dirty = false;
            }
            self.new_spills.clear();
            self.removed_keys.clear();
            return;
        }
        let changed_keys: Vec<KeyRecord> = self
            .keys
            .values_mut()
            .filter(|k| k.dirty)
            .map(|k| {
                k.dirty = false;
                k.record()
            })
            .collect();
        let snapshot_needed = self.clients.values().any(|c| c.needs_snapshot);
        if snapshot_needed {
            let snapshot = self.snapshot_message();
            self.deliver_snapshots(&snapshot);
        }
        // dropped_events differs per client, so tick bodies are encoded per distinct count (almost
        // always one: 0).
        let mut by_dropped: HashMap<u64, Arc<str>> = HashMap::new();
        let ts_ms = now_ms();
        let spills = std::mem::take(&mut self.new_spills);
        let removed_keys = std::mem::take(&mut self.removed_keys);
        for client in self.clients.values_mut() {
            if client.needs_snapshot {
                client.dropped += 1;
                continue;
            }
            let message = by_dropped.entry(client.dropped).or_insert_with(|| {
                encode_message(&ServerMessage::Tick(Tick {
                    ts_ms,
                    workers: changed_workers.clone(),
                    keys: changed_keys.clone(),
                    removed_keys: removed_keys.clone(),
                    spills: spills.clone(),
                    totals: self.totals,
                    dropped_events: client.dropped,
                }))
            });
            if client.frames.try_send(Arc::clone(message)).is_err() {
                client.dropped += 1;
                client.needs_snapshot = true;
            }
        }
        self.clients.retain(|_, c| !c.frames.is_closed());
    }
}

/// Each worker's share of the hash space and its arcs as fractions of the ring.
pub fn ring_ownership(table: &RoutingTable) -> RingOwnership {
    let ring: &Ring = table.ring();
    let shares = ring.shares();
    let mut arcs: Vec<Vec<[f64; 2]>> = vec![Vec::new(); table.workers().len()];
    let scale = 2f64.powi(64);
    for (owner, arc) in ring.arcs() {
        let start = arc.start_exclusive.map_or(0.0, |s| s as f64 / scale);
        let end = (arc.end_inclusive as f64 / scale).min(1.0);
        arcs[owner].push([round6(start), round6(end)]);
    }
    RingOwnership {
        virtual_nodes: ring.virtual_nodes(),
        workers: table
            .workers()
            .iter()
            .zip(shares)
            .zip(arcs)
            .map(|((w, share), arcs)| RingShare {
                name: w.spec.name.clone(),
                share,
                arcs,
            })
            .collect(),
    }
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rates_average_over_a_second_not_one_tick() {
        let router = Arc::new(Router::new(Vec::new(), Default::default()).unwrap());
        let mut aggregator = Aggregator::new(router, TelemetryConfig::default());
        aggregator.requests_total = 10;
        tokio::time::advance(Duration::from_millis(100)).await;
        aggregator.tick();
        assert!((aggregator.totals.requests_per_s - 100.0).abs() < 1e-6);
        // A quiet tick right after a burst still shows the burst, averaged over the window.
        tokio::time::advance(Duration::from_millis(100)).await;
        aggregator.tick();
        assert!((aggregator.totals.requests_per_s - 50.0).abs() < 1e-6);
        // Once the burst is older than the window, the rate is zero.
        for _ in 0..12 {
            tokio::time::advance(Duration::from_millis(100)).await;
            aggregator.tick();
        }
        assert_eq!(aggregator.totals.requests_per_s, 0.0);
        assert_eq!(aggregator.totals.requests_total, 10);
    }

    #[test]
    fn envelope_prefixes_version_and_seq() {
        assert_eq!(
            envelope(5, r#"{"type":"ack","policy":1}"#),
            r#"{"v":1,"seq":5,"type":"ack","policy":1}"#
        );
        assert_eq!(envelope(0, "{}"), r#"{"v":1,"seq":0}"#);
    }
}
