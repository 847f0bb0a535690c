//! The routing table: one immutable snapshot of the workers, the ring, each worker's health and
//! state and the policy, and how a table is built from a worker list (counters carried over by
//! URL, health and state by URL). What routing asks of a worker is [`RoutingTable::routable`];
//! the walk over routable workers is [`RoutingTable::routable_from`].

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::pool::PoolSet;
use crate::decide::{Decision, FleetView, decide};
use crate::fleet_load::{LoadSignal, LoadSource};
use crate::load::WorkerStats;
use crate::policy::PolicySettings;
use crate::ring::Ring;
use crate::routing_key::RoutingKey;
use crate::telemetry::{WorkerSource, WorkerState};

/// A worker as configured: unique `name` and `url`, and the identity its ring points are labelled
/// with (`ring_id`, defaulting to the URL exactly as written, which is what gives placement parity
/// with SGLang Model Gateway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Unique name, shown in headers, metrics and telemetry.
    pub name: String,
    /// Base URL, e.g. `http://10.0.0.7:8000`.
    pub url: String,
    /// Ring identity override; `None` means the URL.
    pub ring_id: Option<String>,
    /// Where the worker came from (configured or discovered); shown, never routed on.
    pub source: WorkerSource,
    /// Requests in flight this worker may hold (`[[workers]] max_in_flight`); `None` = the fleet
    /// default `max_in_flight_per_worker`, `Some(0)` = no cap for this worker.
    pub max_in_flight: Option<u64>,
    /// The model names it serves (what a request body's `model` names); empty = none declared.
    /// When no worker of a table declares a model, the table has one pool of every worker;
    /// otherwise one pool per model, and a worker that declares none is in no pool and gets no
    /// request (gatewayd refuses such a worker list; the core accepts it).
    pub models: Vec<String>,
}

impl WorkerSpec {
    /// The identity hashed onto the ring.
    pub fn ring_id(&self) -> &str {
        self.ring_id.as_deref().unwrap_or(&self.url)
    }
}

/// Why a membership change was refused; the running table is left unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// Two workers with one name.
    #[error("duplicate worker name {0:?}")]
    DuplicateName(String),
    /// Two workers with one URL.
    #[error("duplicate worker url {0:?}")]
    DuplicateUrl(String),
    /// Two workers with one ring identity (they would share every ring point).
    #[error("duplicate worker ring_id {0:?}")]
    DuplicateRingId(String),
    /// An empty name, URL or model name.
    #[error("worker {0} must not be empty")]
    Empty(&'static str),
    /// Removal of a worker that is not registered.
    #[error("no worker named {0:?}")]
    UnknownWorker(String),
}

/// A registered worker inside a routing table.
#[derive(Debug)]
pub struct Worker {
    /// Its name, URL and ring identity.
    pub spec: WorkerSpec,
    /// Its counters, shared with every table and guard that names it.
    pub stats: Arc<WorkerStats>,
}

/// One immutable routing snapshot. Worker indices are configuration order and match the ring.
#[derive(Debug)]
pub struct RoutingTable {
    pub(super) workers: Arc<[Worker]>,
    pub(super) ring: Arc<Ring>,
    pub(super) healthy: Vec<bool>,
    pub(super) states: Vec<WorkerState>,
    /// `healthy && active` per worker: what routing asks, computed once per table.
    pub(super) routable: Vec<bool>,
    pub(super) routable_count: usize,
    /// The routable workers' indices in configuration order: the keyless pick and the baselines
    /// take the `n`-th in O(1). Shared with the routable list of a pool of every worker.
    pub(super) routable_indices: Arc<[usize]>,
    /// Each worker's capacity under the policy's admission settings (`None` = no cap): fixed by
    /// the membership and the policy, so shared by the tables of a health or drain flip.
    pub(super) capacity: Arc<[Option<u64>]>,
    /// Whether any cap or engine limit is set: without one, no worker is ever full and the
    /// decision skips every capacity check.
    pub(super) limited: bool,
    pub(super) policy: PolicySettings,
    pub(super) membership_generation: u64,
    /// The pools by model and each worker's pools: fixed by the membership, shared like `ring`.
    pub(super) pools: Arc<PoolSet>,
    /// Per pool (by [`super::PoolId`]), the pool indices of its routable workers, ascending: a
    /// pool of every worker shares `routable_indices`, and a flip copies only its worker's pools'.
    pub(super) pool_routable: Vec<Arc<[usize]>>,
    /// The table indices ordered by worker name: [`RoutingTable::index_of`] is a binary search,
    /// not a scan of the fleet. Fixed by the membership, shared like `workers`.
    pub(super) by_name: Arc<[usize]>,
}

impl RoutingTable {
    /// Workers in configuration order.
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// The ring over every registered worker, whatever its health or models: the one ring of a
    /// fleet that declares no model (then it is [`super::Pool::ring`] of the one pool). With
    /// models, requests route on their pool's ring; this one is what a whole-fleet view and the
    /// calls without a pool ([`RoutingTable::routable_from`], [`RoutingTable::explain`]) use.
    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// The policy and thresholds this table routes with.
    pub fn policy(&self) -> &PolicySettings {
        &self.policy
    }

    /// Whether each worker's health checks pass, configuration order: health only, whatever the
    /// worker's state. Whether a worker takes requests is [`RoutingTable::routable`].
    pub fn healthy_flags(&self) -> &[bool] {
        &self.healthy
    }

    /// Whether `worker` takes new requests: healthy and active (not draining). The one meaning of
    /// "ready" for first picks, retries and the endpoint picker's fallbacks. `false` for an index
    /// that is no worker of the table.
    pub fn routable(&self, worker: usize) -> bool {
        self.routable.get(worker).copied().unwrap_or(false)
    }

    /// The routable workers clockwise from `position`, each once, in ring order, leaving out those
    /// `skip` names (the worker that failed, the workers already listed): where a keyed request's
    /// retry and fallbacks go. Allocation-free; see [`Ring::workers_clockwise`].
    pub fn routable_from<'a>(
        &'a self,
        position: u64,
        skip: impl Fn(usize) -> bool + 'a,
    ) -> impl Iterator<Item = usize> + 'a {
        self.ring
            .workers_clockwise(position, move |w| self.routable[w] && !skip(w))
    }

    /// The routable worker with the fewest requests in flight, leaving out those `skip` names:
    /// where a keyless request's retry and fallbacks go. Ties go to the lower index. `None` when
    /// every routable worker is skipped.
    pub fn least_loaded_routable(&self, skip: impl Fn(usize) -> bool) -> Option<usize> {
        (0..self.workers.len())
            .filter(|&w| self.routable[w] && !skip(w))
            .min_by_key(|&w| self.workers[w].stats.active())
    }

    /// `worker`'s capacity in requests in flight: its own `max_in_flight`, else the fleet's
    /// `max_in_flight_per_worker`; `None` when it has no cap (or is no worker of the table).
    pub fn capacity(&self, worker: usize) -> Option<u64> {
        self.capacity.get(worker).copied().flatten()
    }

    /// Whether `worker` is full: the load the policy reads is at or above its capacity, or its
    /// engine's last report is over `max_waiting` / `max_kv_usage`. A full worker takes no new
    /// request. `false` for an index that is no worker of the table.
    pub fn full(&self, worker: usize) -> bool {
        worker < self.workers.len() && self.limited && self.is_full(worker)
    }

    /// [`RoutingTable::full`] for a worker index known to be valid.
    fn is_full(&self, worker: usize) -> bool {
        FleetView::engine_full(self, worker)
            || self.capacity[worker].is_some_and(|cap| FleetView::load(self, worker) >= cap)
    }

    /// Each worker's operator state (`active` or `draining`), configuration order.
    pub fn states(&self) -> &[WorkerState] {
        &self.states
    }

    /// Workers that take new requests: healthy and not draining. `/readiness` counts these.
    pub fn routable_count(&self) -> usize {
        self.routable_count
    }

    /// Increases by one on every membership (or `virtual_nodes`) change: a cheap way for observers
    /// to notice the ring changed.
    pub fn membership_generation(&self) -> u64 {
        self.membership_generation
    }

    /// Index of the worker called `name`: a binary search over the names, O(log workers).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        let found = (self.by_name)
            .binary_search_by(|&w| self.workers[w].spec.name.as_str().cmp(name))
            .ok()?;
        Some(self.by_name[found])
    }

    /// Every worker's record (configuration order), the shape of `GET /admin/workers` and of the
    /// telemetry worker records, with scrape ages taken at `now_ms` (wall clock, ms since the Unix
    /// epoch).
    pub fn worker_records(&self, now_ms: u64) -> Vec<crate::telemetry::WorkerRecord> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let last = w.stats.fleet_sample().last();
                let metrics_mode = self.policy.load_source == LoadSource::WorkerMetrics;
                crate::telemetry::WorkerRecord {
                    name: w.spec.name.clone(),
                    url: w.spec.url.clone(),
                    ring_id: w.spec.ring_id.clone(),
                    healthy: self.healthy[i],
                    state: self.states[i].into(),
                    active: w.stats.active(),
                    requests_total: w.stats.requests_total(),
                    spilled_in_total: w.stats.spilled_in_total(),
                    spilled_out_total: w.stats.spilled_out_total(),
                    errors_total: w.stats.errors_total(),
                    load: Some(self.load(i)),
                    reported_load: last.map(|l| l.sample.reported),
                    scrape_age_ms: last.map(|l| now_ms.saturating_sub(l.scraped_at_ms)),
                    load_stale: metrics_mode && !last.is_some_and(|l| l.fresh),
                    source: w.spec.source.clone().into(),
                    capacity: self.capacity[i],
                    full: self.full(i),
                    probe_failure: w.stats.probe_failure(),
                    models: w.spec.models.clone(),
                    reported_models: w.stats.reported_models(),
                }
            })
            .collect()
    }

    /// What a key would get right now on the whole table's ring, without taking load: the answer
    /// of [`RoutingTable::explain_in`] the one pool of a fleet that declares no model.
    pub fn explain(&self, key: &RoutingKey<'_>) -> Decision {
        decide(&self.ring, &self.policy, key, self, 0, 0)
    }
}

impl FleetView for RoutingTable {
    fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Healthy and not draining: a draining worker's keys go where an unhealthy worker's would.
    /// The field, not [`RoutingTable::routable`]: the decision only asks about its own workers.
    fn routable(&self, worker: usize) -> bool {
        self.routable[worker]
    }

    fn routable_count(&self) -> usize {
        self.routable_count
    }

    fn nth_routable(&self, n: usize) -> Option<usize> {
        self.routable_indices.get(n).copied()
    }

    fn load(&self, worker: usize) -> u64 {
        self.load_with_signal(worker).0
    }

    fn load_with_signal(&self, worker: usize) -> (u64, LoadSignal) {
        let stats = &self.workers[worker].stats;
        let local = stats.active();
        match self.policy.load_source {
            LoadSource::Local => (local, LoadSignal::Local),
            LoadSource::WorkerMetrics => match stats.fleet_sample().fresh() {
                Some(sample) => (sample.load(local), LoadSignal::WorkerMetrics),
                None => (local, LoadSignal::Local),
            },
        }
    }

    fn resolve_target(&self, raw: &[u8]) -> Option<usize> {
        resolve_target(self.workers.iter().map(|w| &w.spec), raw)
    }

    fn limited(&self) -> bool {
        self.limited
    }

    fn capacity(&self, worker: usize) -> Option<u64> {
        self.capacity[worker]
    }

    fn engine_full(&self, worker: usize) -> bool {
        let admission = &self.policy.admission;
        admission.engine_limits()
            && admission.engine_full(self.workers[worker].stats.engine_report().get())
    }
}

/// Target worker header resolution shared by the live table and `explain`: name, else exact URL,
/// else decimal 0-based index in configuration order.
pub fn resolve_target<'a>(
    specs: impl Iterator<Item = &'a WorkerSpec> + Clone,
    raw: &[u8],
) -> Option<usize> {
    let text = std::str::from_utf8(raw).ok()?;
    specs
        .clone()
        .position(|s| s.name == text)
        .or_else(|| specs.clone().position(|s| s.url == text))
        .or_else(|| {
            let index: usize = text.parse().ok()?;
            (index < specs.count()).then_some(index)
        })
}

/// Membership bookkeeping, touched only by writers.
#[derive(Debug, Default)]
pub(super) struct CounterRegistry {
    /// Counters by worker URL, kept weakly: a removed worker's counters live on while its guards do
    /// (or while anyone else holds its `Arc<WorkerStats>`), and a re-added worker with the same URL
    /// picks them up again. The router itself never decides how long a departed worker is
    /// remembered: a caller that wants counters to survive an absence holds the `Arc`.
    pub(super) counters: HashMap<String, Weak<WorkerStats>>,
    /// New workers start unhealthy (until a probe passes) instead of healthy.
    pub(super) new_workers_unhealthy: bool,
}

/// Checks a worker list the way every membership change does: no empty name or URL, and no two
/// workers sharing a name, a URL or a ring identity. A caller that must prepare for a change (open
/// connection pools, say) before the router takes it checks first with this.
pub fn validate_membership(specs: &[WorkerSpec]) -> Result<(), MembershipError> {
    let mut names = std::collections::HashSet::new();
    let mut urls = std::collections::HashSet::new();
    let mut ring_ids = std::collections::HashSet::new();
    for spec in specs {
        if spec.name.is_empty() {
            return Err(MembershipError::Empty("name"));
        }
        if spec.url.is_empty() {
            return Err(MembershipError::Empty("url"));
        }
        if spec.models.iter().any(String::is_empty) {
            return Err(MembershipError::Empty("model"));
        }
        if !names.insert(spec.name.as_str()) {
            return Err(MembershipError::DuplicateName(spec.name.clone()));
        }
        if !urls.insert(spec.url.as_str()) {
            return Err(MembershipError::DuplicateUrl(spec.url.clone()));
        }
        if !ring_ids.insert(spec.ring_id()) {
            return Err(MembershipError::DuplicateRingId(spec.ring_id().to_owned()));
        }
    }
    Ok(())
}

impl RoutingTable {
    /// The same membership and ring (shared, not rebuilt) with other health, states or policy:
    /// what a health flip, a drain or a threshold change publishes.
    pub(super) fn with_flags(
        &self,
        healthy: Vec<bool>,
        states: Vec<WorkerState>,
        policy: PolicySettings,
    ) -> RoutingTable {
        RoutingTable::assemble(
            Membership {
                workers: Arc::clone(&self.workers),
                ring: Arc::clone(&self.ring),
                pools: Arc::clone(&self.pools),
                by_name: Arc::clone(&self.by_name),
                generation: self.membership_generation,
            },
            healthy,
            states,
            policy,
        )
    }

    /// A table of `membership` with these flags and `policy`, every derived list computed whole:
    /// O(workers). What a membership or policy change builds, and what a flip must equal.
    fn assemble(
        membership: Membership,
        healthy: Vec<bool>,
        states: Vec<WorkerState>,
        policy: PolicySettings,
    ) -> RoutingTable {
        let Membership {
            workers,
            ring,
            pools,
            by_name,
            generation,
        } = membership;
        let routable: Vec<bool> = healthy
            .iter()
            .zip(&states)
            .map(|(h, s)| *h && *s == WorkerState::Active)
            .collect();
        let capacity: Arc<[Option<u64>]> = workers
            .iter()
            .map(|w| policy.admission.capacity(w.spec.max_in_flight))
            .collect();
        let routable_indices: Arc<[usize]> = (0..routable.len()).filter(|&w| routable[w]).collect();
        let pool_routable = (pools.pools().iter())
            .map(|pool| {
                if pool.covers(workers.len()) {
                    return Arc::clone(&routable_indices);
                }
                let members = pool.workers().iter().enumerate();
                members
                    .filter(|&(_, &w)| routable[w])
                    .map(|(local, _)| local)
                    .collect()
            })
            .collect();
        RoutingTable {
            pools,
            pool_routable,
            limited: policy.admission.engine_limits() || capacity.iter().any(Option::is_some),
            capacity,
            workers,
            ring,
            by_name,
            healthy,
            states,
            routable_count: routable_indices.len(),
            routable_indices,
            routable,
            policy,
            membership_generation: generation,
        }
    }
}

/// What one membership fixes, shared by every table of it (health, drain and policy changes).
struct Membership {
    workers: Arc<[Worker]>,
    ring: Arc<Ring>,
    pools: Arc<PoolSet>,
    by_name: Arc<[usize]>,
    generation: u64,
}

/// Whether `table` already has exactly `specs`, in this order.
pub(super) fn same_workers(table: &RoutingTable, specs: &[WorkerSpec]) -> bool {
    table.workers.len() == specs.len() && table.workers.iter().zip(specs).all(|(w, s)| w.spec == *s)
}

/// The ring of `specs` with `virtual_nodes` points each (the expensive part of a membership
/// change): derived from `previous`'s ring when it has as many points per worker, so only joining
/// workers are hashed ([`Ring::rebuilt`]), else built whole.
pub(super) fn build_ring(
    specs: &[WorkerSpec],
    virtual_nodes: u32,
    previous: Option<&RoutingTable>,
) -> Arc<Ring> {
    let ring_ids: Vec<&str> = specs.iter().map(WorkerSpec::ring_id).collect();
    match previous {
        Some(table) if table.ring.virtual_nodes() == virtual_nodes => {
            let previous_ids: Vec<&str> = table.workers.iter().map(|w| w.spec.ring_id()).collect();
            Arc::new(table.ring.rebuilt(&previous_ids, &ring_ids))
        }
        _ => Arc::new(Ring::build(&ring_ids, virtual_nodes)),
    }
}

/// A table of a new membership (or `virtual_nodes`): counters found again by URL in `registry`,
/// health and state kept from `previous` by URL, `ring` used when it was built ahead. Cannot fail:
/// `specs` and `policy` were validated by the caller.
pub(super) fn build_table(
    registry: &mut CounterRegistry,
    specs: Vec<WorkerSpec>,
    policy: PolicySettings,
    previous: Option<&RoutingTable>,
    membership_generation: u64,
    ring: Option<Arc<Ring>>,
) -> RoutingTable {
    registry.counters.retain(|_, weak| weak.strong_count() > 0);
    let initial_health = !registry.new_workers_unhealthy;
    let ring = ring.unwrap_or_else(|| build_ring(&specs, policy.virtual_nodes, previous));
    // A worker that stays (same URL) keeps its health and state; a new one starts active, with the
    // initial health. Looked up by URL through a map: a scan per worker is quadratic in the fleet.
    let previous_by_url: HashMap<&str, usize> = previous.map_or_else(HashMap::new, |table| {
        (table.workers.iter().enumerate())
            .map(|(i, w)| (w.spec.url.as_str(), i))
            .collect()
    });
    let kept = |spec: &WorkerSpec| {
        let table = previous?;
        let i = *previous_by_url.get(spec.url.as_str())?;
        Some((table.healthy[i], table.states[i]))
    };
    let (healthy, states): (Vec<bool>, Vec<WorkerState>) = specs
        .iter()
        .map(|spec| kept(spec).unwrap_or((initial_health, WorkerState::Active)))
        .unzip();
    let workers: Arc<[Worker]> = specs
        .into_iter()
        .map(|spec| {
            let stats = registry
                .counters
                .get(&spec.url)
                .and_then(Weak::upgrade)
                .unwrap_or_else(|| {
                    let stats = Arc::new(WorkerStats::default());
                    registry
                        .counters
                        .insert(spec.url.clone(), Arc::downgrade(&stats));
                    stats
                });
            Worker { spec, stats }
        })
        .collect();
    let models: Vec<&[String]> = workers.iter().map(|w| w.spec.models.as_slice()).collect();
    let ring_ids: Vec<&str> = workers.iter().map(|w| w.spec.ring_id()).collect();
    let pools = Arc::new(PoolSet::build(&models, &ring_ids, &ring));
    let mut by_name: Vec<usize> = (0..workers.len()).collect();
    by_name.sort_unstable_by(|&a, &b| workers[a].spec.name.cmp(&workers[b].spec.name));
    let membership = Membership {
        by_name: by_name.into(),
        workers,
        ring,
        pools,
        generation: membership_generation,
    };
    RoutingTable::assemble(membership, healthy, states, policy)
}
