//! The aggregator task: the one owner of all telemetry data. It applies routing events, answers
//! control commands and, every `[telemetry] interval_ms`, publishes what changed.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bch_core::decide::{Decision, FleetView};
use bch_core::policy::{BoundCheck, Branch, FleetLoad};
use bch_core::router::{Router, RoutingTable};
use bch_core::telemetry::{
    AdmissionSummary, DiscoverySource, DrainedUpdate, FIRST_PROTOCOL_VERSION, MembershipUpdate,
    PolicyUpdate, RingOwnership, RingUpdate, ServerMessage, Snapshot, SpillCause, SpillEvent, Tick,
    Totals, WorkerRecord,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::admission::AdmissionRates;
use super::clients::Clients;
use super::event::{Control, Event};
use super::keys::{KeyTag, KeyTracker};
use super::wire::{encode_message, ring_ownership};
use crate::admission::AdmissionStats;
use crate::clock::now_ms;
use crate::config::TelemetryConfig;
use crate::per_worker::{TableKeys, WorkerKey};

/// Rates (requests/s, spills/s) are averaged over this window rather than one tick: traffic comes in
/// bursts (a group of sibling requests), and a per-100 ms rate would flicker between 0 and a peak.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// How long data-path events gather in the queue before the aggregator applies them, while they
/// keep coming. Invisible to clients (ticks and commands drain the queue first); it bounds the
/// queue's fill: 100,000 requests/s (two events each at most) fill 2,000 of its 65,536 places in a
/// window.
const BATCH_WINDOW: Duration = Duration::from_millis(10);

/// Request and spill counts at recent ticks, for rates averaged over [`RATE_WINDOW`].
struct Rates {
    /// `(time, requests_total, spills_total)` at recent ticks, oldest first, spanning about
    /// [`RATE_WINDOW`].
    samples: VecDeque<(tokio::time::Instant, u64, u64)>,
}

impl Rates {
    fn new() -> Self {
        Self {
            samples: VecDeque::from([(tokio::time::Instant::now(), 0, 0)]),
        }
    }

    /// The totals at `now`, with rates over the window, and `now` remembered as a sample.
    fn sample(
        &mut self,
        now: tokio::time::Instant,
        requests_total: u64,
        spills_total: u64,
    ) -> Totals {
        // Keep one sample at least RATE_WINDOW old (or the oldest there is) as the base.
        while self.samples.len() > 1 && now.duration_since(self.samples[1].0) >= RATE_WINDOW {
            self.samples.pop_front();
        }
        let (since, requests_then, spills_then) = self.samples[0];
        let elapsed = now.duration_since(since).as_secs_f64().max(1e-3);
        self.samples.push_back((now, requests_total, spills_total));
        Totals {
            requests_per_s: (requests_total - requests_then) as f64 / elapsed,
            spills_per_s: (spills_total - spills_then) as f64 / elapsed,
            requests_total,
            spills_total,
        }
    }
}

/// The most recent spill events (for snapshots) and the ones since the last tick.
struct SpillLog {
    kept: VecDeque<SpillEvent>,
    max: usize,
    new: Vec<SpillEvent>,
}

impl SpillLog {
    fn record(
        &mut self,
        ts_ms: u64,
        table: &RoutingTable,
        decision: &Decision,
        key: Option<&KeyTag>,
    ) {
        let (Some(from), Some(to)) = (decision.preferred, decision.worker) else {
            return;
        };
        // A capacity spill under `consistent_hashing` has no bound check (the bound is not in
        // force there); the log still shows the loads it left, read now, a moment after the
        // decision.
        let Some(bound) = decision.bound.or_else(|| {
            (decision.branch == Branch::ExplicitRoutingKeyCapacitySpill)
                .then(|| bound_now(table, from))
        }) else {
            return;
        };
        let name = |w: usize| table.workers()[w].spec.name.clone();
        let (branch, cause) = SpillCause::of(decision.branch);
        let event = SpillEvent {
            ts_ms,
            key: key
                .map(|k| k.label.render().to_string())
                .unwrap_or_default(),
            branch: branch.into(),
            from: name(from),
            to: name(to),
            preferred_load: bound.preferred_load,
            min_load: bound.min_load,
            mean_load: bound.mean_load,
            min_load_gap: bound.min_load_gap,
            max_load_skew: bound.max_load_skew,
            load_signal: decision.load_signal.unwrap_or_default().into(),
            cause: cause.into(),
        };
        self.kept.push_back(event.clone());
        while self.kept.len() > self.max {
            self.kept.pop_front();
        }
        self.new.push(event);
    }
}

/// The bound check of a request preferring `preferred` on `table`'s loads now.
fn bound_now(table: &RoutingTable, preferred: usize) -> BoundCheck {
    let routable = (0..table.worker_count())
        .filter(|&w| table.routable(w))
        .map(|w| table.load(w));
    let fleet = FleetLoad::of(routable).unwrap_or(FleetLoad {
        min_load: 0,
        mean_load: 0.0,
        healthy: 0,
    });
    fleet.bound_for(table.load(preferred), table.policy())
}

/// The ring's ownership (every worker's arcs), built only when a version 1 client needs it: at
/// 10,000 workers it is most of a version 1 snapshot, and version 2 clients compute it themselves.
#[derive(Default)]
struct RingCache {
    /// The membership generation it was built for, and the ownership.
    built: Option<(u64, RingOwnership)>,
}

impl RingCache {
    fn get(&mut self, table: &RoutingTable) -> &RingOwnership {
        let generation = table.membership_generation();
        if self.built.as_ref().is_none_or(|(g, _)| *g != generation) {
            self.built = Some((generation, ring_ownership(table)));
        }
        &self.built.as_ref().expect("built above").1
    }
}

/// Whether two records of a worker differ at most in their scrape age.
fn same_but_age(a: &WorkerRecord, b: &WorkerRecord) -> bool {
    a.scrape_age_ms.is_some()
        && b.scrape_age_ms.is_some()
        && *a
            == WorkerRecord {
                scrape_age_ms: a.scrape_age_ms,
                ..b.clone()
            }
}

/// All telemetry data, owned by one task.
pub(super) struct Aggregator {
    router: Arc<Router>,
    interval: Duration,
    clients: Clients,
    keys: KeyTracker,
    spills: SpillLog,
    last_workers: HashMap<WorkerKey, WorkerRecord>,
    /// The membership generation clients were last told about.
    ring_generation: u64,
    /// The worker records at that membership, the base of the next membership delta.
    members: Vec<WorkerRecord>,
    ring: RingCache,
    requests_total: u64,
    spills_total: u64,
    rates: Rates,
    totals: Totals,
    /// The discovery sources' records as the admin owner last published them.
    discovery: Vec<DiscoverySource>,
    /// Whether they changed since the last tick.
    discovery_changed: bool,
    /// The admission queue's counters, and their rates.
    admission: AdmissionRates,
    /// The last tick's admission summary (snapshots repeat it).
    admission_summary: AdmissionSummary,
}

impl Aggregator {
    pub(super) fn new(
        router: Arc<Router>,
        config: &TelemetryConfig,
        admission: Arc<AdmissionStats>,
    ) -> Self {
        let table = router.table();
        Self {
            ring_generation: table.membership_generation(),
            members: table.worker_records(now_ms()),
            ring: RingCache::default(),
            router,
            interval: config.interval.max(Duration::from_millis(1)),
            clients: Clients::default(),
            keys: KeyTracker::new(config.max_keys),
            spills: SpillLog {
                kept: VecDeque::new(),
                max: config.max_spill_events,
                new: Vec::new(),
            },
            last_workers: HashMap::new(),
            requests_total: 0,
            spills_total: 0,
            rates: Rates::new(),
            totals: Totals::default(),
            discovery: Vec::new(),
            discovery_changed: false,
            admission: AdmissionRates::new(admission, RATE_WINDOW),
            admission_summary: AdmissionSummary::default(),
        }
    }

    /// Runs until `shutdown`. Events are applied in batches: the first one after a quiet spell
    /// wakes the task, then it lets events gather for [`BATCH_WINDOW`] before it drains the queue
    /// again, for as long as events keep coming. Frames leave only with ticks and commands, which
    /// drain the queue first, so what clients see is the same as if every event woke the task;
    /// the data path's sends just stop waking it once per request (two events a request, at
    /// thousands of requests a second, were a task wake-up each).
    pub(super) async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut control: mpsc::UnboundedReceiver<Control>,
        shutdown: CancellationToken,
    ) {
        let mut interval = tokio::time::interval(self.interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Made once: a wait made anew per wake-up would register with the token and leave it
        // again each time.
        let cancelled = shutdown.cancelled();
        tokio::pin!(cancelled);
        let batch = tokio::time::sleep(BATCH_WINDOW);
        tokio::pin!(batch);
        // Whether events are arriving: the batch timer, not the queue, wakes the task.
        let mut gathering = false;
        loop {
            tokio::select! {
                () = &mut cancelled => break,
                Some(event) = events.recv(), if !gathering => {
                    self.apply(event);
                    self.drain(&mut events);
                    gathering = true;
                    batch.as_mut().reset(tokio::time::Instant::now() + BATCH_WINDOW);
                }
                () = &mut batch, if gathering => {
                    // A window without events ends the batching: the next event wakes the task.
                    gathering = self.drain(&mut events) > 0;
                    if gathering {
                        batch.as_mut().reset(tokio::time::Instant::now() + BATCH_WINDOW);
                    }
                }
                Some(command) = control.recv() => {
                    self.drain(&mut events);
                    self.control(command);
                }
                _ = interval.tick() => {
                    self.drain(&mut events);
                    self.tick();
                }
            }
        }
    }

    /// Applies every event waiting in the queue; returns how many there were.
    fn drain(&mut self, events: &mut mpsc::Receiver<Event>) -> usize {
        let mut applied = 0;
        while let Ok(event) = events.try_recv() {
            self.apply(event);
            applied += 1;
        }
        applied
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::Routed {
                ts_ms,
                table,
                decision,
                key,
            } => {
                self.requests_total += 1;
                if decision.branch.is_spill_event() {
                    self.spills_total += 1;
                    self.spills.record(ts_ms, &table, &decision, key.as_ref());
                }
                if let Some(key) = key {
                    let announce = !self.clients.is_empty();
                    self.keys.routed(ts_ms, &table, &decision, key, announce);
                }
            }
            Event::Finished {
                table,
                worker,
                key_id,
            } => self
                .keys
                .finished(key_id, &table.workers()[worker].spec.name),
        }
    }

    fn control(&mut self, command: Control) {
        match command {
            Control::Register {
                id,
                frames,
                version,
            } => {
                self.clients.add(id, frames, version);
                self.deliver_snapshots();
            }
            Control::Unregister(id) => self.clients.remove(id),
            Control::Resync(id) => {
                self.clients.resync(id);
                self.deliver_snapshots();
            }
            Control::PolicyChanged(source, client) => {
                let message = encode_message(&ServerMessage::Policy(PolicyUpdate {
                    ts_ms: now_ms(),
                    policy: (*self.router.table().policy()).into(),
                    changed_by: source.into(),
                    client,
                }));
                self.clients.broadcast(&message);
            }
            Control::Discovery(sources) => {
                if sources != self.discovery {
                    self.discovery = sources;
                    self.discovery_changed = true;
                }
            }
            Control::Drained { worker, removed } => {
                let message = encode_message(&ServerMessage::Drained(DrainedUpdate {
                    ts_ms: now_ms(),
                    worker,
                    removed,
                }));
                self.clients.broadcast(&message);
            }
        }
    }

    /// Sends a snapshot to every client waiting for one, in its protocol version: version 1
    /// with the ring's arcs, version 2 without.
    fn deliver_snapshots(&mut self) {
        let table = self.router.table();
        let snapshot = Snapshot {
            ts_ms: now_ms(),
            policy: (*table.policy()).into(),
            workers: table.worker_records(now_ms()),
            ring: None,
            keys: self.keys.records(),
            spills: self.spills.kept.iter().cloned().collect(),
            totals: self.totals,
            discovery: self.discovery_at(now_ms()),
            admission: Some(self.admission_summary),
            read_only: false,
        };
        let ring = &mut self.ring;
        self.clients.deliver_snapshots(|version| {
            let ring = (version == FIRST_PROTOCOL_VERSION).then(|| ring.get(&table).clone());
            encode_message(&ServerMessage::Snapshot(Snapshot {
                ring,
                ..snapshot.clone()
            }))
        });
    }

    /// The discovery sources' records with their ages at `now_ms`.
    fn discovery_at(&self, now_ms: u64) -> Vec<DiscoverySource> {
        self.discovery
            .iter()
            .map(|source| source.clone().at(now_ms))
            .collect()
    }

    fn tick(&mut self) {
        let table = self.router.table();
        let now = tokio::time::Instant::now();
        self.totals = self
            .rates
            .sample(now, self.requests_total, self.spills_total);
        self.admission_summary = self.admission.sample(now);
        self.announce_ring_change(&table);
        let (changed_workers, aged_only) = self.changed_workers(&table);
        if self.clients.is_empty() {
            // Nobody to tell: a client that connects later starts from a snapshot.
            self.keys.discard_changes();
            self.spills.new.clear();
            return;
        }
        let (changed_keys, removed_keys) = self.keys.take_changes();
        let ts_ms = now_ms();
        let discovery =
            std::mem::take(&mut self.discovery_changed).then(|| self.discovery_at(ts_ms));
        if self.clients.snapshot_needed() {
            self.deliver_snapshots();
        }
        self.clients.send_ticks(
            &aged_only,
            Tick {
                ts_ms,
                workers: changed_workers,
                keys: changed_keys,
                removed_keys,
                spills: std::mem::take(&mut self.spills.new),
                totals: self.totals,
                dropped_events: 0,
                discovery,
                admission: Some(self.admission_summary),
            },
        );
    }

    /// Announces a membership (or `virtual_nodes`) change since the last tick: a `ring` frame
    /// (every worker and every arc) to version 1 clients, a `membership` delta to version 2 ones.
    fn announce_ring_change(&mut self, table: &RoutingTable) {
        if table.membership_generation() == self.ring_generation {
            return;
        }
        self.ring_generation = table.membership_generation();
        let ts_ms = now_ms();
        let members = table.worker_records(ts_ms);
        let before = std::mem::replace(&mut self.members, members);
        let (members, ring) = (&self.members, &mut self.ring);
        self.clients.broadcast_by_version(|version| {
            encode_message(&if version == FIRST_PROTOCOL_VERSION {
                ServerMessage::Ring(RingUpdate {
                    ts_ms,
                    workers: members.clone(),
                    ring: ring.get(table).clone(),
                })
            } else {
                ServerMessage::Membership(MembershipUpdate::between(
                    ts_ms,
                    &before,
                    members,
                    table.ring().virtual_nodes(),
                ))
            })
        });
    }

    /// The worker records that differ from the last tick's, remembered for the next one, and
    /// which of them (indices into the list) differ only in their scrape age: version 2 ticks
    /// leave those out, or every scraped worker would be in every tick.
    fn changed_workers(&mut self, table: &RoutingTable) -> (Vec<WorkerRecord>, Vec<usize>) {
        let members = TableKeys::of(table);
        self.last_workers.retain(|key, _| members.contains(key));
        let mut changed = Vec::new();
        let mut aged_only = Vec::new();
        // `worker_records` lists the table's workers in their order.
        for (worker, record) in table.workers().iter().zip(table.worker_records(now_ms())) {
            let last = self.last_workers.get(worker.spec.url.as_str());
            if last == Some(&record) {
                continue;
            }
            if last.is_some_and(|last| same_but_age(last, &record)) {
                aged_only.push(changed.len());
            }
            self.last_workers
                .insert(WorkerKey::of_worker(worker), record.clone());
            changed.push(record);
        }
        (changed, aged_only)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under `consistent_hashing` a capacity spill has no bound check; it is still a spill event,
    /// and the log must show it (with its cause), not only count it.
    #[test]
    fn capacity_spills_without_a_bound_reach_the_spill_log() {
        use bch_core::policy::PolicyKind;
        use bch_core::router::{WorkerSource, WorkerSpec};
        use bch_core::routing_key::{ExplicitKey, RoutingKey};

        let spec = |name: &str, port: u16| WorkerSpec {
            name: name.into(),
            url: format!("http://127.0.0.1:{port}"),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: Some(1),
            models: Vec::new(),
        };
        let mut policy = bch_core::policy::PolicySettings {
            kind: PolicyKind::ConsistentHashing,
            ..Default::default()
        };
        policy.admission.max_in_flight_per_worker = 1;
        let router = Arc::new(Router::new(vec![spec("a", 1), spec("b", 2)], policy).unwrap());
        let mut aggregator = Aggregator::new(
            Arc::clone(&router),
            &TelemetryConfig::default(),
            Default::default(),
        );
        let key = RoutingKey::Explicit(ExplicitKey::parse(b"tenant").unwrap());
        let first = router.route(&key);
        let second = router.route(&key);
        assert_eq!(
            second.decision.branch,
            bch_core::policy::Branch::ExplicitRoutingKeyCapacitySpill
        );
        for routed in [&first, &second] {
            aggregator.apply(Event::Routed {
                ts_ms: 1,
                table: Arc::clone(&routed.table),
                decision: routed.decision,
                key: KeyTag::from_key(&key, false),
            });
        }
        assert_eq!(aggregator.spills_total, 1);
        let logged: Vec<_> = aggregator.spills.kept.iter().collect();
        assert_eq!(logged.len(), 1, "the capacity spill is in the log");
        assert_eq!(logged[0].cause, SpillCause::Capacity);
        assert_eq!(logged[0].preferred_load, 1, "the full worker's load");
        assert_ne!(logged[0].from, logged[0].to);
        // The key's own spill count agrees with the log: the console's key table must not say a
        // key never left home while every other request of it goes elsewhere for want of room.
        let records = aggregator.keys.records();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].spills_total, 1, "the key's capacity spill");
    }

    #[test]
    fn a_record_that_only_aged_is_told_apart() {
        let router = Router::new(
            vec![bch_core::router::WorkerSpec {
                name: "a".into(),
                url: "http://127.0.0.1:1".into(),
                ring_id: None,
                source: Default::default(),
                max_in_flight: None,
                models: Vec::new(),
            }],
            Default::default(),
        )
        .unwrap();
        let record = router.table().worker_records(0).remove(0);
        let scraped = WorkerRecord {
            scrape_age_ms: Some(40),
            ..record.clone()
        };
        let older = WorkerRecord {
            scrape_age_ms: Some(140),
            ..scraped.clone()
        };
        assert!(same_but_age(&scraped, &older));
        let busier = WorkerRecord {
            active: 1,
            ..older.clone()
        };
        assert!(!same_but_age(&scraped, &busier));
        // Never scraped, then scraped: a change worth telling.
        assert!(!same_but_age(&record, &scraped));
    }

    #[tokio::test(start_paused = true)]
    async fn rates_average_over_a_second_not_one_tick() {
        let router = Arc::new(Router::new(Vec::new(), Default::default()).unwrap());
        let mut aggregator =
            Aggregator::new(router, &TelemetryConfig::default(), Default::default());
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
}
