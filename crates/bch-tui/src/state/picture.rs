//! The telemetry-derived picture of the fleet ([`FleetPicture`]): workers, ring, tracked keys, the
//! spill log and the rate history, kept as the gateway last described them, plus the spill bound
//! ([`FleetBound`]) worked out from them with bch-core's rule.
//!
//! Only the state module changes a picture (the `apply_*` methods); everyone else gets
//! `&FleetPicture`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bch_core::policy::{BoundCheck, FleetLoad, PolicyKind, PolicySettings};
use bch_core::telemetry::{
    AdmissionSummary, ChangeSource, DiscoverySource, KeyRecord, MembershipUpdate, Open,
    PolicyRecord, PolicyUpdate, RingOwnership, RingUpdate, Snapshot, SpillEvent, Tick, Totals,
    WorkerRecord, WorkerState,
};

use super::caps;

/// Spill events kept for the log; older ones fall off the front. More than the tallest screen
/// shows, few enough that a clone for pausing stays cheap.
pub const SPILL_LOG_CAP: usize = 200;
/// Rate samples kept for the sparklines (one per tick: 24 s at the default 100 ms interval), more
/// than the widest screen shows.
const HISTORY_CAP: usize = 240;

/// The fleet as the gateway last described it. Cloned whole when the view is paused, so the
/// panels can show a frozen copy while frames keep applying to the live one.
///
/// The fields mirror the telemetry records; they are public to read, and only `&FleetPicture` ever
/// leaves the state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetPicture {
    /// Gateway time of the last applied snapshot or tick, ms since the Unix epoch.
    pub ts_ms: u64,
    /// The policy and thresholds in force; `None` until the first snapshot. When the gateway
    /// named a kind, spill order or load source this console does not know, the default stands in
    /// for it here and [`FleetPicture::policy_unknown`] holds what the gateway sent.
    pub policy: Option<PolicySettings>,
    /// The policy as the gateway sent it, kept only when it names something this console does
    /// not know (a newer gateway's kind): the header shows those names, and the bound, which this
    /// console cannot know for such a policy, is not drawn.
    pub policy_unknown: Option<PolicyRecord>,
    /// Who made the last policy change seen on this connection; `None` when none was seen since
    /// the last snapshot.
    pub policy_changed_by: Option<Open<ChangeSource>>,
    /// The address of the client that made it, when the gateway said.
    pub policy_changed_from: Option<String>,
    /// The counters when the last policy change was seen, so the key table can count from there.
    pub baseline: Option<Baseline>,
    /// The gateway's tick interval as the frames' timestamps show it, ms (`None` before two
    /// ticks): how long a silence means the gateway stopped talking.
    pub tick_interval_ms: Option<u64>,
    /// Every registered worker, in configuration order (the gateway's order, kept so rows do not
    /// jump between frames).
    pub workers: Vec<WorkerRecord>,
    /// Who owns which part of the hash ring; `None` until the first snapshot. Shared, not
    /// copied, by the merged and the paused pictures: at 10,000 workers it holds over a million
    /// arcs.
    pub ring: Option<Arc<RingOwnership>>,
    /// Tracked routing keys by label, so a tick's record replaces the old one in place.
    pub keys: BTreeMap<String, KeyRecord>,
    /// Recent spill events, oldest first, at most [`SPILL_LOG_CAP`].
    pub spills: VecDeque<SpillEvent>,
    /// FleetPicture-wide rates (per second) and totals from the last snapshot or tick.
    pub totals: Totals,
    /// Frames the gateway dropped for this connection because the console read too slowly
    /// (cumulative, as the gateway counts them).
    pub dropped_events: u64,
    /// Rate history for the sparklines, oldest first, at most [`HISTORY_CAP`]; survives snapshots
    /// so a resync does not blank the sparklines.
    pub history: VecDeque<Sample>,
    /// The gateway's DNS discovery sources and their health, configuration order (empty without
    /// discovery, or from a gateway too old to report it).
    pub discovery: Vec<DiscoverySource>,
    /// The gateway's admission queue and shedding from the last snapshot or tick; `None` from a
    /// gateway that predates admission.
    pub admission: Option<AdmissionSummary>,
    /// The gateway said this connection is read-only (opened with the metrics token): it
    /// refuses every write command.
    pub read_only: bool,
    /// The model whose pool this picture shows (its workers, its ring, their keys), when it is
    /// one pool's view (`pools.rs`); `None` for the whole fleet.
    pub pool: Option<String>,
    /// Every arc of the ring as `(start, end, index into ring.workers)`, sorted by start, so the
    /// owner of any position is a binary search away.
    arcs: Arc<Vec<(f64, f64, usize)>>,
    /// What `ring` was computed from, when this console computed it (protocol version 2):
    /// `virtual_nodes` and each worker's name and ring identity. A snapshot of the same
    /// membership then reuses the ring instead of hashing every virtual node again.
    ring_members: Option<Arc<RingMembers>>,
}

/// The inputs of a ring this console computed: `virtual_nodes`, and each worker's name and ring
/// identity in order.
type RingMembers = (u32, Vec<(String, String)>);

/// Every tracked key's `(requests_total, spills_total)` at a policy change, and when it was.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Baseline {
    /// Gateway time of the change, ms since the Unix epoch.
    pub ts_ms: u64,
    /// Counters by key label.
    pub keys: BTreeMap<String, (u64, u64)>,
}

impl Baseline {
    /// `key`'s `(requests, spills)` since the baseline. A key first tracked after it counts from
    /// 0; one whose counters went down was evicted and tracked anew, and counts from there.
    pub fn since(&self, key: &KeyRecord) -> (u64, u64) {
        match self.keys.get(&key.key) {
            Some(&(requests, spills)) if key.requests_total >= requests => (
                key.requests_total - requests,
                key.spills_total.saturating_sub(spills),
            ),
            _ => (key.requests_total, key.spills_total),
        }
    }
}

impl Baseline {
    /// Moves into the baseline the spills of a tick that were decided before the change: the
    /// gateway sends a policy change at once, but the counters of requests routed just before it
    /// arrive with the next tick, and without this they would count as spills since the change.
    /// A spill's own time says which side it is on; one in the same millisecond as the change is
    /// before it when it was decided under other thresholds than `policy`, the ones in force now.
    fn count_earlier_spills(&mut self, spills: &[SpillEvent], policy: &PolicySettings) {
        for spill in spills {
            let before = spill.ts_ms < self.ts_ms
                || (spill.ts_ms == self.ts_ms
                    && (spill.min_load_gap != policy.min_load_gap
                        || spill.max_load_skew != policy.max_load_skew));
            // Only keys it counts already, or room for one more: a flood of spill keys must not
            // grow it past the key table's cap.
            if before && (self.keys.len() < caps::MAX_KEYS || self.keys.contains_key(&spill.key)) {
                self.keys.entry(spill.key.clone()).or_default().1 += 1;
            }
        }
    }
}

/// One point of the sparklines: the fleet-wide rates of one tick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Requests per second over all workers.
    pub requests_per_s: f64,
    /// Spills per second over all workers.
    pub spills_per_s: f64,
    /// Requests shed per second (0 from a gateway without admission).
    pub shed_per_s: f64,
    /// Requests waiting in the gateway's queue.
    pub waiting: u64,
}

/// The bound the bounded policy enforces right now: the healthy workers' load summary and the
/// thresholds in force. The numbers and the spill test are bch-core's ([`FleetLoad`],
/// [`BoundCheck`]), the same code the gateway routes with, so the OVER flag can never disagree
/// with the gateway's decision on the same loads (`docs/policy.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetBound {
    load: FleetLoad,
    policy: PolicySettings,
}

impl FleetBound {
    /// The bound of `load` under `policy`.
    pub(super) fn new(load: FleetLoad, policy: PolicySettings) -> Self {
        Self { load, policy }
    }

    /// Min, mean and count of the healthy workers' loads, as the rule reads them.
    pub fn load(&self) -> FleetLoad {
        self.load
    }

    /// The check for a new explicit-key request whose preferred worker has `active` in-flight
    /// requests; [`BoundCheck::should_spill`] says whether it would spill.
    pub fn check(&self, active: u64) -> BoundCheck {
        self.load.bound_for(active, &self.policy)
    }

    /// `min + min_load_gap`, in requests: a preferred worker must be above it to spill. It does not
    /// depend on the preferred worker's load, so any load gives it.
    pub fn gap_bound(&self) -> u64 {
        self.check(self.load.min_load).gap_bound()
    }

    /// `mean × max_load_skew`, in requests: a preferred worker must be above it to spill and a
    /// target must be at or below it. Independent of the preferred worker's load, like the gap
    /// bound.
    pub fn skew_bound(&self) -> f64 {
        self.check(self.load.min_load).skew_bound()
    }
}

impl FleetPicture {
    /// Whether the spill bound is in force: only `bounded_consistent_hashing` spills; under the
    /// other policies the thresholds change nothing. `false` before the policy is known.
    pub fn bound_in_force(&self) -> bool {
        self.policy_unknown.is_none()
            && self
                .policy
                .is_some_and(|p| p.kind == PolicyKind::BoundedConsistentHashing)
    }

    /// Takes the policy a frame carried: its settings, with defaults standing in for names this
    /// console does not know (kept whole in [`FleetPicture::policy_unknown`]).
    fn set_policy(&mut self, record: PolicyRecord) {
        match record.settings() {
            Some(settings) => {
                self.policy = Some(settings);
                self.policy_unknown = None;
            }
            None => {
                self.policy = Some(PolicySettings {
                    kind: record.kind.get().unwrap_or_default(),
                    min_load_gap: record.min_load_gap,
                    max_load_skew: record.max_load_skew,
                    spill_order: record.spill_order.get().unwrap_or_default(),
                    virtual_nodes: record.virtual_nodes,
                    load_source: record.load_source.get().unwrap_or_default(),
                    admission: record.admission,
                });
                self.policy_unknown = Some(record);
            }
        }
    }

    /// The current bound over the loads the rule reads ([`WorkerRecord::rule_load`]: local
    /// in-flight requests, or the fleet-wide load in `worker_metrics` mode), or `None` before the
    /// policy is known, while it is not in force, or while no worker takes requests. Like the
    /// router, it counts the workers that take requests: healthy and not draining. `None` too
    /// for the whole fleet of several pools (models), where each pool has its own bound
    /// ([`FleetPicture::over_rule`]).
    pub fn bound(&self) -> Option<FleetBound> {
        let policy = self.policy.filter(|_| self.bound_in_force())?;
        if self.pool.is_none() && self.several_pools() {
            return None;
        }
        let routable = self
            .workers
            .iter()
            .filter(|w| routable(w))
            .map(WorkerRecord::rule_load);
        Some(FleetBound {
            load: FleetLoad::of(routable)?,
            policy,
        })
    }

    /// The workers that are full (at their capacity, or their engine saturated): they take no new
    /// request.
    pub fn full(&self) -> usize {
        self.workers.iter().filter(|w| w.full).count()
    }

    /// The worker rows whose keys would spill on their next request (OVER), each by its pool's
    /// bound ([`FleetPicture::over_rule`]).
    pub fn over(&self) -> usize {
        let rule = self.over_rule();
        self.workers.iter().filter(|w| rule.over(w)).count()
    }

    /// Index into `ring.workers` of the worker owning ring position `x` (0.0..1.0), or `None`
    /// before the ring is known.
    pub fn owner_at(&self, x: f64) -> Option<usize> {
        let i = self.arcs.partition_point(|&(start, _, _)| start <= x);
        let &(start, end, owner) = self.arcs.get(i.checked_sub(1)?)?;
        (start <= x && x < end).then_some(owner)
    }

    /// Replaces everything but the rate history, the tick interval and the counters' baseline
    /// with the snapshot's picture.
    pub(super) fn apply_snapshot(&mut self, snap: Snapshot) {
        let history = std::mem::take(&mut self.history);
        let ring = (self.ring.take(), std::mem::take(&mut self.arcs));
        let ring_members = self.ring_members.take();
        let mut workers = snap.workers;
        caps::workers(&mut workers);
        let mut keys: BTreeMap<String, KeyRecord> = snap
            .keys
            .into_iter()
            .map(caps::key)
            .map(|k| (k.key.clone(), k))
            .collect();
        caps::evict_keys(&mut keys);
        *self = FleetPicture {
            ts_ms: snap.ts_ms,
            workers,
            keys,
            totals: snap.totals,
            discovery: caps::discovery(snap.discovery),
            read_only: snap.read_only,
            admission: snap.admission,
            history,
            tick_interval_ms: self.tick_interval_ms,
            baseline: self.baseline.take(),
            ..FleetPicture::default()
        };
        let virtual_nodes = snap.policy.virtual_nodes;
        self.set_policy(snap.policy);
        match snap.ring {
            Some(ring) => self.set_ring(ring),
            // Version 2: the ring is the console's to compute, unless it has this one already.
            None => {
                (self.ring, self.arcs) = ring;
                self.ring_members = ring_members;
                self.compute_ring(virtual_nodes);
            }
        }
        self.push_spills(snap.spills.into_iter().map(caps::spill).collect());
    }

    /// Merges a tick: its records replace the ones with the same name, everything else stays.
    pub(super) fn apply_tick(&mut self, tick: Tick) {
        if self.ts_ms > 0 && tick.ts_ms > self.ts_ms {
            // Smoothed, so one late tick does not move the staleness threshold much.
            let delta = tick.ts_ms - self.ts_ms;
            self.tick_interval_ms = Some(match self.tick_interval_ms {
                Some(old) => (old * 3 + delta) / 4,
                None => delta,
            });
        }
        self.ts_ms = tick.ts_ms;
        if let Some(discovery) = tick.discovery {
            self.discovery = caps::discovery(discovery);
        }
        self.upsert_workers(tick.workers);
        for key in tick.keys {
            let key = caps::key(key);
            self.keys.insert(key.key.clone(), key);
        }
        for gone in &tick.removed_keys {
            self.keys.remove(gone);
        }
        caps::evict_keys(&mut self.keys);
        let spills: Vec<SpillEvent> = tick.spills.into_iter().map(caps::spill).collect();
        if let (Some(baseline), Some(policy)) = (&mut self.baseline, self.policy) {
            baseline.count_earlier_spills(&spills, &policy);
        }
        self.push_spills(spills);
        self.totals = tick.totals;
        self.dropped_events = tick.dropped_events;
        self.admission = tick.admission;
        let admission = tick.admission.unwrap_or_default();
        self.history.push_back(Sample {
            requests_per_s: tick.totals.requests_per_s,
            spills_per_s: tick.totals.spills_per_s,
            shed_per_s: admission.shed_per_s,
            waiting: admission.waiting,
        });
        while self.history.len() > HISTORY_CAP {
            self.history.pop_front();
        }
    }

    /// A tick's worker records: each replaces the one with the same name, or joins the list
    /// while it is shorter than [`caps::MAX_WORKERS`]. Found through a name index when the tick
    /// has many, so a tick of every worker at 10,000 costs one pass, not one per record.
    fn upsert_workers(&mut self, records: Vec<WorkerRecord>) {
        if records.len() <= 8 {
            for mut record in records {
                caps::worker(&mut record);
                match self.workers.iter().position(|w| w.name == record.name) {
                    Some(i) => self.workers[i] = record,
                    None if self.workers.len() < caps::MAX_WORKERS => self.workers.push(record),
                    None => {}
                }
            }
            return;
        }
        let mut index: HashMap<String, usize> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.clone(), i))
            .collect();
        for mut record in records {
            caps::worker(&mut record);
            match index.get(&record.name) {
                Some(&i) => self.workers[i] = record,
                None if self.workers.len() < caps::MAX_WORKERS => {
                    index.insert(record.name.clone(), self.workers.len());
                    self.workers.push(record);
                }
                None => {}
            }
        }
    }

    /// A membership change: the new worker list and ring; tracked keys stay.
    pub(super) fn apply_ring(&mut self, mut update: RingUpdate) {
        caps::workers(&mut update.workers);
        self.workers = update.workers;
        self.set_ring(update.ring);
    }

    /// A membership change as a delta (protocol version 2): the worker list edited, the ring
    /// computed again from it. Answers whether the list now has the gateway's worker count; when
    /// not, this picture missed a change and needs a snapshot.
    pub(super) fn apply_membership(&mut self, update: MembershipUpdate) -> bool {
        let complete = update.apply_to(&mut self.workers);
        caps::workers(&mut self.workers);
        self.compute_ring(update.virtual_nodes);
        // A fleet over the cap never adds up: asking for a snapshot would not change that.
        complete
            || (update.worker_count > caps::MAX_WORKERS && self.workers.len() == caps::MAX_WORKERS)
    }

    /// Computes the ring from the workers' ring identities with bch-core (the gateway's own
    /// computation), unless it was already computed from the same ones. Once per membership
    /// change, never per draw: at 10,000 workers × 150 virtual nodes it hashes 1.5 million
    /// labels.
    pub(super) fn compute_ring(&mut self, virtual_nodes: u32) {
        let members: RingMembers = (
            virtual_nodes,
            self.workers
                .iter()
                .map(|w| (w.name.clone(), w.ring_identity().to_owned()))
                .collect(),
        );
        if self.ring.is_some() && self.ring_members.as_deref() == Some(&members) {
            return;
        }
        self.set_ring(RingOwnership::of_workers(&self.workers, virtual_nodes));
        self.ring_members = Some(Arc::new(members));
    }

    /// Shares `other`'s ring (and what it was computed from) instead of copying it.
    pub(super) fn share_ring_of(&mut self, other: &FleetPicture) {
        self.ring = other.ring.clone();
        self.arcs = Arc::clone(&other.arcs);
        self.ring_members = other.ring_members.clone();
    }

    /// A policy change made by anyone (this console, another one, the HTTP API, a reload); the
    /// key table's counters start again from here.
    pub(super) fn apply_policy(&mut self, update: PolicyUpdate) {
        self.set_policy(update.policy);
        self.policy_changed_by = Some(update.changed_by);
        self.policy_changed_from = update.client;
        self.baseline = Some(Baseline {
            ts_ms: update.ts_ms,
            keys: self
                .keys
                .values()
                .map(|k| (k.key.clone(), (k.requests_total, k.spills_total)))
                .collect(),
        });
    }

    /// A worker's record as a command's answer gave it (drain, undrain).
    pub(super) fn apply_worker(&mut self, mut record: WorkerRecord) {
        caps::worker(&mut record);
        if let Some(slot) = self.workers.iter_mut().find(|w| w.name == record.name) {
            *slot = record;
        }
    }

    /// The policy in force after one of this console's commands was applied.
    pub(super) fn apply_acked_policy(&mut self, policy: PolicyRecord) {
        self.set_policy(policy);
    }

    /// Seen since on this connection: a new gateway process has new counters, so a baseline
    /// from the previous one would be wrong.
    pub(super) fn forget_baseline(&mut self) {
        self.baseline = None;
    }

    pub(super) fn set_ring(&mut self, ring: RingOwnership) {
        let mut arcs: Vec<(f64, f64, usize)> = ring
            .workers
            .iter()
            .enumerate()
            .flat_map(|(i, share)| share.arcs.iter().map(move |&[s, e]| (s, e, i)))
            .collect();
        arcs.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.arcs = Arc::new(arcs);
        self.ring = Some(Arc::new(ring));
        self.ring_members = None;
    }

    /// Appends spill events already cut ([`caps::spill`]), keeping the last [`SPILL_LOG_CAP`].
    fn push_spills(&mut self, spills: Vec<SpillEvent>) {
        let skip = spills.len().saturating_sub(SPILL_LOG_CAP);
        self.spills.extend(spills.into_iter().skip(skip));
        while self.spills.len() > SPILL_LOG_CAP {
            self.spills.pop_front();
        }
    }
}

/// Whether a worker takes new requests: healthy and not draining.
pub(crate) fn routable(worker: &WorkerRecord) -> bool {
    worker.healthy && worker.state == WorkerState::Active
}
